//! One etcd member on loopback, for the storage tests and the HA tests: started from `KUBEBUILDER_ASSETS`, stopped
//! and started again on the same ports and data (an outage), killed with the test.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Proc;
use crate::sandbox::free_port;

pub struct Etcd {
    binary: PathBuf,
    data_dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
}

impl Etcd {
    /// Starts etcd with its data in `data_dir` and waits until it serves.
    pub fn start(data_dir: &Path) -> Self {
        let binary = crate::assets_dir().join("etcd");
        let mut etcd = Self {
            binary,
            data_dir: data_dir.to_owned(),
            client_port: free_port(),
            peer_port: free_port(),
            proc: None,
        };
        etcd.resume();
        etcd
    }

    /// The client URL (`--etcd-servers`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd (as a crash would): clients see it go away.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Starts it again on the same ports and data, and waits until it serves.
    pub fn resume(&mut self) {
        assert!(self.proc.is_none(), "etcd is running");
        let (client, peer) = (self.client_port, self.peer_port);
        let proc = Proc::spawn("etcd", command(&self.binary, &self.data_dir, client, peer).arg("--log-level=warn"));
        self.proc = Some(proc);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = TcpStream::connect(("127.0.0.1", client)).is_ok()
                && std::fs::metadata(self.data_dir.join("member/wal")).is_ok();
            if up && self.health() {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not start:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn health(&self) -> bool {
        healthy(self.client_port)
    }

    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log).unwrap_or_default()
    }
}

/// Whether the etcd member serving clients on loopback port `client_port` is healthy: its /health says true once
/// the member has a leader.
pub fn healthy(client_port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", client_port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// One etcd member serving clients on `client` and its peer port on `peer`, both on loopback.
pub(super) fn command(binary: &Path, data_dir: &Path, client: u16, peer: u16) -> Command {
    let mut cmd = Command::new(binary);
    cmd.arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"));
    cmd
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("----- etcd -----\n{}", self.log());
        }
        self.stop();
    }
}
