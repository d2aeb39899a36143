//! A three-member etcd cluster on the namespace's loopback, for the robustness harness: members killed (SIGKILL),
//! stopped (SIGTERM) and started again on their data, cut from their peers, their disks slowed, and the leader
//! found. Each member runs as a user of its own, so iptables can tell its packets from its peers' on the one
//! loopback.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The conntrack mark of a cut-off member's connections to its peers.
const PARTITION_MARK: &str = "0x2a";

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

pub struct EtcdCluster {
    binary: PathBuf,
    dir: PathBuf,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// Starts `n` members with their data under `dir` and waits until every one serves with a leader.
    pub fn start(binary: &Path, dir: &Path, n: usize) -> Self {
        let ports: Vec<u16> = (0..2 * n).map(|_| podset_envtest::free_port()).collect();
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let mut c = Self { binary: binary.to_owned(), dir: dir.to_owned(), members };
        for i in 0..n {
            c.spawn(i);
        }
        for i in 0..n {
            c.wait_healthy(i);
        }
        c
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members listen for clients on every address, so a client can be told apart (and cut off) by the address it
    /// dials.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("http://127.0.0.1:{}", m.client_port)).collect()
    }

    /// The user member `i` runs as.
    fn uid(i: usize) -> u32 {
        20_000 + i as u32
    }

    fn spawn(&mut self, i: usize) {
        let cluster: Vec<String> =
            self.members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect();
        let m = &self.members[i];
        let log = File::options().create(true).append(true).open(self.dir.join(format!("{}.log", m.name))).unwrap();
        let data = self.data_dir(i);
        std::fs::create_dir_all(&data).unwrap();
        let uid = Self::uid(i);
        std::os::unix::fs::chown(&data, Some(uid), Some(uid)).expect("chown the member's data");
        std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let binary = std::fs::canonicalize(&self.binary).unwrap_or_else(|_| self.binary.clone());
        let child = Command::new("setpriv")
            .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups"])
            .arg(binary)
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls=http://0.0.0.0:{}", m.client_port))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{}", m.client_port))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", m.peer_port))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{}", m.peer_port))
            .arg(format!("--initial-cluster={}", cluster.join(",")))
            .args(["--initial-cluster-state=new", "--initial-cluster-token=robustness", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting etcd");
        self.members[i].child = Some(child);
    }

    fn healthy(&self, i: usize) -> bool {
        podset_envtest::etcd::healthy(self.members[i].client_port)
    }

    /// Waits until member `i` serves and has a leader.
    pub fn wait_healthy(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.healthy(i) {
            assert!(Instant::now() < deadline, "etcd member {i} did not become healthy:\n{}", self.log(i));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Member `i`'s process, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Where member `i` keeps its data.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(&self.members[i].name)
    }

    pub fn running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as an orderly restart's first half.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }

    /// Starts a stopped member again on its data.
    pub fn start_member(&mut self, i: usize) {
        if self.members[i].child.is_none() {
            self.spawn(i);
        }
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.members[i].name))).unwrap_or_default()
    }

    /// iptables rules (for `-I`/`-D OUTPUT`, in this order) that cut member `i` from its peers, both ways: on the
    /// connections its peers opened to it (its peer port) and on those it opened to theirs (marked when it sends,
    /// so their answers on them are dropped too); clients still reach it.
    pub fn peer_partition_rules(&self, i: usize) -> Vec<String> {
        let me = &self.members[i];
        let theirs: Vec<String> =
            self.members.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, o)| o.peer_port.to_string()).collect();
        vec![
            format!("-p tcp --dport {} -j DROP", me.peer_port),
            format!("-p tcp --sport {} -j DROP", me.peer_port),
            format!("-m connmark --mark {PARTITION_MARK} -j DROP"),
            // Inserted last, so it comes first: the mark is set before the drop above looks for it.
            format!(
                "-m owner --uid-owner {} -p tcp -m multiport --dports {} -j CONNMARK --set-mark {PARTITION_MARK}",
                Self::uid(i),
                theirs.join(",")
            ),
        ]
    }

    /// The member that leads now, as the members themselves say.
    pub async fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let url = format!("http://127.0.0.1:{}", m.client_port);
            let Ok(Ok(mut client)) =
                tokio::time::timeout(Duration::from_secs(2), etcd_client::Client::connect([url], None)).await
            else {
                continue;
            };
            let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(2), client.status()).await else { continue };
            let me = status.header().map(|h| h.member_id());
            if me == Some(status.leader()) {
                return Some(i);
            }
        }
        None
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
