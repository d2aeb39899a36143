//! A real control plane on one machine, like controller-runtime's envtest: etcd, kube-apiserver and
//! kube-controller-manager from a `KUBEBUILDER_ASSETS` directory, our server registered through
//! `deploy/base/apiservice.yaml`. Used by the end-to-end tests and by `podset-local-cluster`.
//!
//! It runs inside a private network, PID and mount namespace ([`namespace_command`]) so nothing leaves the machine
//! and nothing outlives it. kube-apiserver refuses Endpoints in 127.0.0.0/8, so our server listens on [`NODE_IP`],
//! an address that exists only on the namespace's loopback.
//!
//! Without a node (the default) Pods are created and stay `Pending`. [`Cluster::start_with_node`] adds one
//! ([`node`]: containerd, runc, CNI, kubelet, kube-scheduler, kube-proxy), so they run.
#![allow(clippy::missing_panics_doc)]

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::apiserver::tls::make_ca;
use base64::Engine;
use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
    PKCS_ECDSA_P256_SHA256,
};

pub mod etcd;
pub mod node;

pub const NODE_IP: &str = "10.250.0.10";
/// Where each replica of podset-apiserver listens when several run ([`Cluster::start_replicated`]): the first is
/// [`NODE_IP`].
pub const REPLICA_IPS: [&str; 3] = [NODE_IP, "10.250.0.11", "10.250.0.12"];
const REPLICA_NAMES: [&str; 3] = ["podset-apiserver", "podset-apiserver-2", "podset-apiserver-3"];

const NAMESPACE_YAML: &str = include_str!("../../deploy/base/namespace.yaml");
const APISERVICE_YAML: &str = include_str!("../../deploy/base/apiservice.yaml");
const RBAC_YAML: &str = include_str!("../../deploy/base/rbac.yaml");
/// Our server's identity in the main API server: the ServiceAccount deploy/base/rbac.yaml grants.
const CONTROLLER_USER: &str = "system:serviceaccount:podset-system:podset-apiserver";

/// Set in the environment of a process running inside the namespace.
pub const INSIDE: &str = "PODSET_ENVTEST_INSIDE_NAMESPACE";

/// True inside a namespace made by [`namespace_command`].
pub fn inside_namespace() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// A command that runs `program args...` in a fresh network + PID + mount namespace (as root): loopback up,
/// [`NODE_IP`] on it, and every process in it killed when `program` exits. The mount namespace has a /proc of its
/// own, so children's /proc/<pid> can be read (a benchmark measures their memory) and /proc lists only the
/// namespace's processes; mounts made in it (a node's) go with it.
pub fn namespace_command(program: &Path, args: &[String]) -> Command {
    let addrs: String = REPLICA_IPS.iter().map(|ip| format!(" && ip addr add {ip}/32 dev lo")).collect();
    let script = format!("ip link set lo up{addrs} && exec \"$@\"");
    let mut c = Command::new("unshare");
    c.args(["--net", "--pid", "--fork", "--kill-child", "--mount-proc"]);
    c.args(["--", "sh", "-c", &script, "sh"]).arg(program).args(args).env(INSIDE, "1");
    c
}

/// For a program that needs its own control plane (a benchmark): outside a namespace, runs this program again with
/// the same arguments inside a fresh one and exits with its status; inside, returns.
pub fn reenter_namespace() {
    if inside_namespace() {
        return;
    }
    let exe = std::env::current_exe().expect("current executable");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let status = namespace_command(&exe, &args).env("KUBEBUILDER_ASSETS", assets_dir()).status().expect("unshare");
    std::process::exit(status.code().unwrap_or(1));
}

/// Where the control-plane binaries are: `KUBEBUILDER_ASSETS` (see hack/install-test-assets.sh).
pub fn assets_dir() -> PathBuf {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from).expect(
        "KUBEBUILDER_ASSETS is not set: hack/install-test-assets.sh installs the binaries and prints their directory",
    );
    assert!(dir.join("kubectl").exists(), "no kubectl in KUBEBUILDER_ASSETS={}", dir.display());
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process whose output is kept in memory and printed if the test fails.
struct Proc {
    name: &'static str,
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        for stream in
            [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())]
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        Self { name, child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL, as a crash or a lost node would, and the exit reaped.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PEM files of everything the cluster needs, made in process.
struct Pki {
    dir: PathBuf,
}

fn leaf(issuer: &Issuer<'_, &KeyPair>, cn: &str, orgs: &[&str], sans: &[&str], server: bool) -> (String, String) {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        p.distinguished_name.push(DnType::OrganizationName, *o);
    }
    p.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(s.to_string().try_into().unwrap()),
        })
        .collect();
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages =
        vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn make(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, pem: &str| std::fs::write(dir.join(name), pem).unwrap();
        let (ca_pem, ca_key, ca_params) = make_ca("kubernetes-ca").unwrap();
        write("ca.crt", &ca_pem);
        write("ca.key", &ca_key.serialize_pem());
        let ca = Issuer::new(ca_params, &ca_key);
        let (c, k) = leaf(
            &ca,
            "kube-apiserver",
            &[],
            &[
                "127.0.0.1",
                NODE_IP,
                "10.96.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            true,
        );
        write("apiserver.crt", &c);
        write("apiserver.key", &k);
        let (c, k) = leaf(&ca, "admin", &["system:masters"], &[], false);
        write("admin.crt", &c);
        write("admin.key", &k);
        let (c, k) =
            leaf(&ca, CONTROLLER_USER, &["system:serviceaccounts", "system:serviceaccounts:podset-system"], &[], false);
        write("controller.crt", &c);
        write("controller.key", &k);

        // A node's components, as kubeadm names them (RBAC binds these names by default; the kubelet's group is
        // what the Node authorizer knows).
        for (file, cn, orgs) in [
            ("kubelet", format!("system:node:{}", node::NODE_NAME), &["system:nodes"][..]),
            ("scheduler", "system:kube-scheduler".to_owned(), &[][..]),
            ("proxy", "system:kube-proxy".to_owned(), &[][..]),
        ] {
            let (c, k) = leaf(&ca, &cn, orgs, &[], false);
            write(&format!("{file}.crt"), &c);
            write(&format!("{file}.key"), &k);
        }

        let (fp_pem, fp_key, fp_params) = make_ca("front-proxy-ca").unwrap();
        write("front-proxy-ca.crt", &fp_pem);
        write("front-proxy-ca.key", &fp_key.serialize_pem());
        let fp = Issuer::new(fp_params, &fp_key);
        let (c, k) = leaf(&fp, "front-proxy-client", &[], &[], false);
        write("front-proxy-client.crt", &c);
        write("front-proxy-client.key", &k);

        let (pc_pem, pc_key, pc_params) = make_ca("podset-apiserver-ca").unwrap();
        write("podset-ca.crt", &pc_pem);
        let pc = Issuer::new(pc_params, &pc_key);
        let (c, k) = leaf(
            &pc,
            "podset-apiserver.podset-system.svc",
            &[],
            &[
                "podset-apiserver.podset-system.svc",
                "podset-apiserver.podset-system",
                REPLICA_IPS[0],
                REPLICA_IPS[1],
                REPLICA_IPS[2],
            ],
            true,
        );
        write("podset.crt", &c);
        write("podset.key", &k);

        let sa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        write("sa.key", &sa.serialize_pem());
        write("sa.pub", &sa.public_key_pem());
        Self { dir: dir.to_owned() }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    fn b64(&self, name: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(self.dir.join(name)).unwrap())
    }
}

/// What a client straight at podset-apiserver presents.
pub enum Credential<'a> {
    None,
    /// A client certificate: PEM certificate and key.
    Cert(&'a (String, String)),
    /// A bearer token.
    Token(&'a str),
}

/// How to start podset-apiserver: a program and the arguments before its flags.
#[derive(Debug, Clone)]
pub struct ServerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

/// etcd + kube-apiserver + kube-controller-manager + podset-apiserver, registered and Available.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub apiserver_url: String,
    pub podset_addr: SocketAddr,
    pki: Pki,
    procs: Vec<Proc>,
    /// None when podset-apiserver is not run by the harness (deployed to the node instead).
    server: Option<ServerCommand>,
    apiserver_args: Vec<String>,
    /// How many podset-apiservers run; with more than one, they share the cluster's etcd.
    replicas: usize,
    etcd_url: String,
    /// Per replica, the `--etcd-servers` it stores PodSets in, when not the cluster's etcd.
    replica_etcd: Vec<String>,
    /// Logs of replicas killed for good, printed if the test fails.
    dead: Vec<Proc>,
    node: Option<node::Node>,
    /// The demo workload's image on the node (`podset-demo`), once there is one.
    demo_image: Option<String>,
}

impl Cluster {
    pub fn start(server: ServerCommand) -> Self {
        Self::start_replicated(server, 1)
    }

    /// `replicas` podset-apiservers (at most 3) on [`REPLICA_IPS`], the same port, behind one Service whose
    /// Endpoints list them all (kube-apiserver runs with `--enable-aggregator-routing`, so it picks one per
    /// request). With more than one they store PodSets in the cluster's etcd (`--storage-backend=etcd`) and elect a
    /// leader for the controller.
    pub fn start_replicated(server: ServerCommand, replicas: usize) -> Self {
        Self::start_with(Some(server), replicas, false, Vec::new())
    }

    /// [`Self::start_replicated`] with replica `i` storing PodSets at `etcd_servers[i]` (an etcd of its own, not
    /// kube-apiserver's) when given.
    pub fn start_replicated_on(server: ServerCommand, replicas: usize, etcd_servers: Vec<String>) -> Self {
        assert!((1..=REPLICA_IPS.len()).contains(&replicas));
        Self::start_with(Some(server), replicas, false, etcd_servers)
    }

    /// [`Self::start`] with a node ([`node`]): the PodSets' Pods are scheduled, pulled from the images imported
    /// into containerd, and run. Takes about half a minute more.
    pub fn start_with_node(server: ServerCommand) -> Self {
        Self::start_with(Some(server), 1, true, Vec::new())
    }

    /// The control plane and a node, without podset-apiserver: for deploying it to the node as an admin would
    /// (deploy/, with an image given to [`Self::import_image`]).
    pub fn start_node_only() -> Self {
        Self::start_with(None, 0, true, Vec::new())
    }

    fn start_with(server: Option<ServerCommand>, replicas: usize, with_node: bool, etcd_servers: Vec<String>) -> Self {
        assert!(replicas <= REPLICA_IPS.len() && (replicas > 0) == server.is_some());
        let assets = assets_dir();
        let mut needed = vec!["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"];
        if with_node {
            needed.extend(node::NODE_BINARIES);
        }
        for bin in needed {
            assert!(
                assets.join(bin).exists(),
                "{bin} missing from KUBEBUILDER_ASSETS={} (hack/install-test-assets.sh installs it)",
                assets.display()
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::make(&dir.path().join("pki"));
        let mut cluster = Self {
            kubeconfig: dir.path().join("admin.kubeconfig"),
            apiserver_url: String::new(),
            podset_addr: format!("{NODE_IP}:{}", free_port()).parse().unwrap(),
            dir,
            pki,
            procs: Vec::new(),
            server,
            apiserver_args: Vec::new(),
            replicas,
            etcd_url: String::new(),
            replica_etcd: etcd_servers,
            dead: Vec::new(),
            node: None,
            demo_image: None,
        };
        cluster.start_etcd_and_apiserver(&assets, with_node);
        if cluster.server.is_some() {
            // The namespace and the controller's RBAC exist before our server starts, as in deploy/.
            cluster.apply_text("namespace.yaml", NAMESPACE_YAML);
            cluster.apply_text("rbac.yaml", RBAC_YAML);
            for i in 0..replicas {
                cluster.start_replica(i);
            }
            cluster.register();
        }
        cluster.start_controller_manager(&assets, with_node);
        // The service account controller making `default` shows kube-controller-manager is at work.
        cluster.wait_for("kube-controller-manager to create default/default", Duration::from_secs(120), |c| {
            c.kubectl_try(&["get", "serviceaccount", "default", "-n", "default"]).is_ok()
        });
        if with_node {
            cluster.start_node(&assets);
        }
        cluster
    }

    /// containerd (with the sandbox and demo images imported), the kubelet, kube-scheduler and kube-proxy; returns
    /// once the node is Ready and untainted and kube-proxy routes the `kubernetes` Service.
    fn start_node(&mut self, assets: &Path) {
        let pause = node::build_image("pause", "release");
        let demo = node::build_image("podset-demo", "release");
        let n = node::Node::prepare(self.dir.path(), &node::image_reference(&pause));
        self.procs.push(Proc::spawn("containerd", &mut n.containerd_command(assets)));
        let socket = n.containerd_socket();
        self.node = Some(n);
        self.wait_for("containerd to serve", Duration::from_secs(60), |c| {
            socket.exists() && c.ctr(&["version"]).is_ok()
        });
        self.import_image(&pause);
        self.import_image(&demo);
        self.demo_image = Some(node::image_reference(&demo));

        for user in ["kubelet", "scheduler", "proxy"] {
            std::fs::write(self.dir.path().join(format!("{user}.kubeconfig")), self.kubeconfig_for(user)).unwrap();
        }
        let kubeconfig = |user: &str| self.dir.path().join(format!("{user}.kubeconfig"));
        let kubelet_args = self.node.as_ref().unwrap().kubelet_args(&kubeconfig("kubelet"), &self.pki.path("ca.crt"));
        let mut kubelet = Command::new(assets.join("kubelet"));
        kubelet.args(kubelet_args).env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        self.procs.push(Proc::spawn("kubelet", &mut kubelet));
        let mut scheduler = Command::new(assets.join("kube-scheduler"));
        scheduler.arg(format!("--kubeconfig={}", kubeconfig("scheduler").display())).args([
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--port=0",
            "--leader-elect=false",
        ]);
        self.procs.push(Proc::spawn("kube-scheduler", &mut scheduler));
        let mut proxy = Command::new(assets.join("kube-proxy"));
        proxy
            .arg(format!("--kubeconfig={}", kubeconfig("proxy").display()))
            .args(["--proxy-mode=iptables", "--cluster-cidr", node::POD_SUBNET])
            .arg(format!("--hostname-override={}", node::NODE_NAME))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--healthz-bind-address=127.0.0.1:{}", free_port()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{}", free_port()))
            // Conntrack's table sizes are the machine's (read-only in a network namespace): leave them.
            .args(["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0"])
            .args(["--conntrack-tcp-timeout-close-wait=0"])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        self.procs.push(Proc::spawn("kube-proxy", &mut proxy));

        self.wait_for("the node to be Ready and untainted", Duration::from_secs(120), |c| {
            c.kubectl_try(&[
                "get",
                "node",
                node::NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}/{.spec.taints}",
            ])
            .is_ok_and(|s| s == "True/")
        });
        self.wait_for("kube-proxy to route the kubernetes Service", Duration::from_secs(60), |_| {
            Command::new("iptables")
                .args(["-t", "nat", "-S", "KUBE-SERVICES"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("10.96.0.1/32"))
        });
    }

    /// `ctr` in the node's containerd (`k8s.io` namespace, the kubelet's): its output, or the error.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let node = self.node.as_ref().expect("the cluster has no node (Cluster::start_with_node)");
        let out = node.ctr(&assets_dir()).args(args).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Imports an OCI image archive (hack/build-image.sh's) into the node's containerd, as `ctr images import`
    /// does on any containerd node, and returns the image's name for a Pod's `image`.
    pub fn import_image(&self, archive: &Path) -> String {
        let archive = archive.to_str().unwrap();
        self.ctr(&["images", "import", archive]).unwrap_or_else(|e| panic!("importing {archive}: {e}"));
        node::image_reference(Path::new(archive))
    }

    /// The demo workload's image on the node (images/src/bin/podset-demo.rs): serves /healthz and /readyz on
    /// 8080, exits on `/exit?code=N` or `--exit-after`.
    pub fn demo_image(&self) -> &str {
        self.demo_image.as_deref().expect("the cluster has no node (Cluster::start_with_node)")
    }

    fn start_etcd_and_apiserver(&mut self, assets: &Path, with_node: bool) {
        let (client, peer) = (free_port(), free_port());
        let data_dir = self.dir.path().join("etcd");
        let etcd = Proc::spawn(
            "etcd",
            etcd::command(&assets.join("etcd"), &data_dir, client, peer).arg("--unsafe-no-fsync=false"),
        );
        self.procs.push(etcd);
        self.etcd_url = format!("http://127.0.0.1:{client}");
        let port = free_port();
        self.apiserver_url = format!("https://127.0.0.1:{port}");
        let p = |n| self.pki.path(n);
        self.apiserver_args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--advertise-address={NODE_IP}"),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            format!("--cert-dir={}", self.dir.path().join("apiserver-certs").display()),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
            format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
            "--enable-aggregator-routing=true".into(),
        ];
        if with_node {
            // Pods reach it at the `kubernetes` Service (NODE_IP, through kube-proxy), and the kubelet's identity
            // is for the Node authorizer; it reaches the kubelet (logs, exec) with the admin's certificate.
            for (flag, value) in [
                ("--bind-address", "0.0.0.0".to_owned()),
                ("--authorization-mode", "Node,RBAC".to_owned()),
                ("--kubelet-client-certificate", p("admin.crt")),
                ("--kubelet-client-key", p("admin.key")),
            ] {
                self.apiserver_args.retain(|a| !a.starts_with(&format!("{flag}=")));
                self.apiserver_args.push(format!("{flag}={value}"));
            }
        }
        self.spawn_apiserver();
        std::fs::write(&self.kubeconfig, self.kubeconfig_for("admin")).unwrap();
        std::fs::write(self.controller_kubeconfig(), self.kubeconfig_for("controller")).unwrap();
        self.wait_for("kube-apiserver to be ready", Duration::from_secs(120), |c| {
            c.kubectl_try(&["get", "--raw", "/readyz"]).is_ok_and(|o| o.trim() == "ok")
        });
    }

    fn spawn_apiserver(&mut self) {
        let program = assets_dir().join("kube-apiserver");
        self.procs.push(Proc::spawn("kube-apiserver", Command::new(program).args(&self.apiserver_args)));
    }

    /// The process id of one of the cluster's processes ("etcd", "kube-apiserver", ...), for measuring it.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name).map(|p| p.child.id())
    }

    /// Whether kube-apiserver reports our APIService `Available`.
    pub fn apiservice_available(&self) -> bool {
        self.kubectl_try(&[
            "get",
            "apiservice",
            "v1alpha1.demo.k8s.io",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])
        .is_ok_and(|s| s == "True")
    }

    /// Kills the process called `name` with SIGKILL, waits for it, and hands it back (its log kept).
    fn kill_proc(&mut self, name: &str) -> Option<Proc> {
        let at = self.procs.iter().position(|p| p.name == name)?;
        let mut p = self.procs.remove(at);
        p.kill();
        Some(p)
    }

    /// The client URL of the cluster's etcd (kube-apiserver's `--etcd-servers`), for more servers to share it.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// Kills kube-apiserver (etcd and the rest keep running).
    pub fn stop_apiserver(&mut self) {
        self.kill_proc("kube-apiserver");
    }

    /// Starts kube-apiserver again with the same flags and waits until it is ready.
    pub fn start_apiserver(&mut self) {
        self.spawn_apiserver();
        self.wait_for("kube-apiserver to be ready again", Duration::from_secs(120), |c| {
            c.kubectl_try(&["get", "--raw", "/readyz"]).is_ok_and(|o| o.trim() == "ok")
        });
    }

    /// A PEM file made for this cluster (e.g. `front-proxy-client.crt`, `podset-ca.crt`).
    pub fn pki_file(&self, name: &str) -> PathBuf {
        self.pki.dir.join(name)
    }

    /// A client certificate signed by one of the cluster's CAs (`"ca"`, the cluster CA kube-apiserver's
    /// `--client-ca-file` names, or `"front-proxy-ca"`): PEM (certificate, key).
    pub fn client_cert(&self, ca: &str, cn: &str, org: Option<&str>) -> (String, String) {
        let cert = std::fs::read_to_string(self.pki.dir.join(format!("{ca}.crt"))).unwrap();
        let key = std::fs::read_to_string(self.pki.dir.join(format!("{ca}.key"))).unwrap();
        let issuer = Issuer::from_ca_cert_pem(&cert, KeyPair::from_pem(&key).unwrap()).unwrap();
        let orgs: Vec<&str> = org.into_iter().collect();
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, o);
        }
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = p.signed_by(&leaf_key, &issuer).unwrap();
        (leaf.pem(), leaf_key.serialize_pem())
    }

    fn start_podset_apiserver(&mut self) {
        self.start_replica(0);
    }

    /// Starts replica `i` (0 is the only one unless the cluster is replicated) on its address and the shared port.
    pub fn start_replica(&mut self, i: usize) {
        let cmd = self.server.as_ref().expect("podset-apiserver is deployed, not run by the harness");
        let p = |n| self.pki.path(n);
        let data_dir = match i {
            0 => self.dir.path().join("podset-data"),
            i => self.dir.path().join(format!("podset-data-{i}")),
        };
        let mut command = Command::new(&cmd.program);
        command.args(&cmd.args);
        if self.replicas > 1 {
            let servers = self.replica_etcd.get(i).unwrap_or(&self.etcd_url);
            command.args(["--storage-backend=etcd", &format!("--etcd-servers={servers}")]);
        }
        let server = Proc::spawn(
            REPLICA_NAMES[i],
            command
                .args(["--bind-address", REPLICA_IPS[i], "--secure-port", &self.podset_addr.port().to_string()])
                .env("HOSTNAME", REPLICA_NAMES[i])
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--tls-cert-file", &p("podset.crt"), "--tls-private-key-file", &p("podset.key")])
                .args(["--log-format", "json"])
                // Also its identity for delegated authentication and authorization, which reads the trust
                // anchors from kube-system/extension-apiserver-authentication as in a real cluster.
                .arg("--kubeconfig")
                .arg(self.controller_kubeconfig())
                .env("RUST_LOG", "info"),
        );
        self.procs.push(server);
    }

    /// Kills replica `i` with SIGKILL (as a lost node would); its log is kept for a failing test.
    pub fn kill_replica(&mut self, i: usize) {
        let old = self.kill_proc(REPLICA_NAMES[i]).expect("running");
        self.dead.push(old);
    }

    /// The process id of replica `i`, while it runs.
    pub fn replica_pid(&self, i: usize) -> Option<u32> {
        self.pid(REPLICA_NAMES[i])
    }

    /// The log of replica `i` while it runs.
    pub fn replica_log(&self, i: usize) -> String {
        self.procs.iter().find(|p| p.name == REPLICA_NAMES[i]).map(Proc::log).unwrap_or_default()
    }

    /// The replica holding the controller's Lease, if any.
    pub fn controller_leader(&self) -> Option<usize> {
        let holder = self
            .kubectl_try(&[
                "get",
                "lease",
                "-n",
                "podset-system",
                "podset-controller",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .ok()?;
        Self::replica_named(holder.trim())
    }

    /// The replica (index) whose HOSTNAME an identity (a Lease holder's, say) starts with.
    pub fn replica_named(identity: &str) -> Option<usize> {
        // Longest name first: "podset-apiserver-2_..." also starts with "podset-apiserver".
        (0..REPLICA_NAMES.len()).rev().find(|&i| identity.starts_with(&format!("{}_", REPLICA_NAMES[i])))
    }

    /// Lists only these replicas in the Service's Endpoints (the others as not ready), as the endpoints
    /// controller does once a pod fails its readiness probe.
    pub fn set_ready_replicas(&self, ready: &[usize]) {
        let port = self.podset_addr.port();
        let list = |want: bool| -> String {
            (0..self.replicas)
                .filter(|i| ready.contains(i) == want)
                .map(|i| format!("\n  - ip: {}", REPLICA_IPS[i]))
                .collect()
        };
        let (up, down) = (list(true), list(false));
        let mut subset = String::new();
        if !up.is_empty() {
            subset.push_str(&format!("\n  addresses:{up}"));
        }
        if !down.is_empty() {
            subset.push_str(&format!("\n  notReadyAddresses:{down}"));
        }
        let endpoints = format!(
            "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: podset-apiserver\n  namespace: podset-system\nsubsets:\n- ports:\n  - name: https\n    port: {port}{subset}\n"
        );
        self.apply_text("endpoints-ready.yaml", &endpoints);
    }

    /// Kills podset-apiserver with SIGKILL and starts it again on the same data and port; its log carries on.
    pub fn restart_podset_apiserver(&mut self) {
        let old = self.kill_proc("podset-apiserver").expect("running");
        let earlier = old.log();
        self.start_podset_apiserver();
        if let Some(new) = self.procs.last() {
            new.log.lock().unwrap().insert_str(0, &earlier);
        }
        self.wait_for("podset-apiserver to serve again", Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "--raw", "/apis/demo.k8s.io/v1alpha1/podsets"]).is_ok()
        });
    }

    /// Stops podset-apiserver, deletes its data directory (as a lost volume would), starts it again, and returns
    /// its exit status and log if it exits within `wait` instead of serving.
    pub fn restart_podset_apiserver_empty(&mut self, wait: Duration) -> Option<(std::process::ExitStatus, String)> {
        self.kill_proc("podset-apiserver").expect("running");
        let _ = std::fs::remove_dir_all(self.dir.path().join("podset-data"));
        self.start_podset_apiserver();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            let p = self.procs.last_mut().expect("just started");
            if let Ok(Some(status)) = p.child.try_wait() {
                std::thread::sleep(Duration::from_millis(200));
                return Some((status, p.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// Applies a selector-less Service + Endpoints pointing at our server, and
    /// deploy/base/apiservice.yaml with our CA, then waits for `Available=True`.
    fn register(&mut self) {
        let port = self.podset_addr.port();
        let service = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: podset-apiserver\n  namespace: podset-system\nspec:\n  ports:\n  - name: https\n    port: 443\n    targetPort: {port}\n"
        );
        self.apply_text("service.yaml", &service);
        self.set_ready_replicas(&(0..self.replicas).collect::<Vec<_>>());
        // deploy/base/apiservice.yaml with the caBundle an overlay would add.
        let mut apiservice: serde_yaml::Value =
            serde_yaml::from_str(APISERVICE_YAML).expect("deploy/base/apiservice.yaml");
        apiservice["spec"]["caBundle"] = self.pki.b64("podset-ca.crt").into();
        self.apply_text("apiservice.yaml", &serde_yaml::to_string(&apiservice).expect("YAML"));
        self.wait_for("APIService v1alpha1.demo.k8s.io to be Available", Duration::from_secs(120), |c| {
            c.apiservice_available()
        });
        // Available comes from one controller, the proxy route from another: wait until requests get through.
        self.wait_for("kube-apiserver to proxy demo.k8s.io", Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "--raw", "/apis/demo.k8s.io/v1alpha1"]).is_ok()
        });
    }

    fn start_controller_manager(&mut self, assets: &Path, with_node: bool) {
        // Without a node, the controllers for nodes and volumes have nothing to do. With one, the node lifecycle
        // controller lifts the kubelet's not-ready taint and the binder binds a StatefulSet's claim.
        let controllers = if with_node {
            "*,-nodeipam,-ttl"
        } else {
            "*,-nodeipam,-nodelifecycle,-attachdetach,-persistentvolume-binder,-ttl"
        };
        let kcm = Proc::spawn(
            "kube-controller-manager",
            Command::new(assets.join("kube-controller-manager")).args([
                format!("--kubeconfig={}", self.kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
                "--port=0".into(),
                format!("--controllers={controllers}"),
                "--leader-elect=false".into(),
                format!("--service-account-private-key-file={}", self.pki.path("sa.key")),
                format!("--root-ca-file={}", self.pki.path("ca.crt")),
            ]),
        );
        self.procs.push(kcm);
    }

    /// A kubeconfig for kube-apiserver with the client certificate `<user>.crt`.
    fn kubeconfig_for(&self, user: &str) -> String {
        let mut kubeconfig = String::new();
        write!(
            kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {user}\n    namespace: default\ncurrent-context: e2e\n\
             users:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            self.apiserver_url,
            self.pki.b64("ca.crt"),
            self.pki.b64(&format!("{user}.crt")),
            self.pki.b64(&format!("{user}.key"))
        )
        .unwrap();
        kubeconfig
    }

    /// The kubeconfig our server's controller uses: the ServiceAccount identity deploy/base/rbac.yaml grants.
    pub fn controller_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("controller.kubeconfig")
    }

    pub fn apply_text(&self, name: &str, yaml: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        self.kubectl(&["apply", "-f", path.to_str().unwrap()])
    }

    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(assets_dir().join("kubectl"));
        c.stdin(Stdio::null())
            .args(args)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg("--request-timeout=30s")
            .env("HOME", self.dir.path());
        c
    }

    pub fn kubectl_try(&self, args: &[&str]) -> Result<String, String> {
        let out = self.kubectl_command(args).output().expect("kubectl");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Runs kubectl against kube-apiserver as the cluster admin; panics with its output on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_try(args).unwrap_or_else(|e| panic!("kubectl {args:?}:\n{e}"))
    }

    pub fn wait_for(&self, what: &str, timeout: Duration, mut ok: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !ok(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A kube-rs client for kube-apiserver, as the admin.
    pub async fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config().await).unwrap()
    }

    /// How the admin reaches kube-apiserver: its address, CA and client certificate.
    pub async fn config(&self) -> kube::Config {
        crate::apiserver::tls::provider();
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()
    }

    /// Everything podset-apiserver has logged so far.
    pub fn podset_log(&self) -> String {
        self.procs.iter().find(|p| p.name == "podset-apiserver").map(Proc::log).unwrap_or_default()
    }

    /// A kube client straight at podset-apiserver, bypassing kube-apiserver, with the given credential. Needs a
    /// Tokio runtime context.
    pub fn podset_client(&self, credential: Credential<'_>) -> kube::Client {
        self.replica_client(0, credential)
    }

    /// [`Self::podset_client`] for replica `i`.
    pub fn replica_client(&self, i: usize, credential: Credential<'_>) -> kube::Client {
        crate::apiserver::tls::provider();
        let addr = format!("https://{}:{}", REPLICA_IPS[i], self.podset_addr.port());
        let mut cfg = kube::Config::new(addr.parse().expect("address"));
        let ca = crate::apiserver::tls::read_certs(&self.podset_ca()).expect("our CA");
        cfg.root_cert = Some(ca.iter().map(|c| c.to_vec()).collect());
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        match credential {
            Credential::None => {}
            Credential::Cert((cert, key)) => {
                cfg.auth_info.client_certificate_data = Some(b64(cert));
                cfg.auth_info.client_key_data = Some(b64(key).into());
            }
            Credential::Token(t) => cfg.auth_info.token = Some(t.to_owned().into()),
        }
        kube::Client::try_from(cfg).expect("client")
    }

    /// The front proxy's own certificate (PEM certificate, key), as kube-apiserver presents it to us.
    pub fn front_proxy_cert(&self) -> (String, String) {
        let read = |name: &str| std::fs::read_to_string(self.pki.dir.join(name)).expect("front-proxy PEM");
        (read("front-proxy-client.crt"), read("front-proxy-client.key"))
    }

    /// Our server's serving CA and address, for requests that bypass kube-apiserver.
    pub fn podset_ca(&self) -> PathBuf {
        self.pki.dir.join("podset-ca.crt")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            p.kill();
        }
        if let Some(node) = &self.node {
            node.cleanup();
        }
        if std::thread::panicking() {
            for p in self.dead.iter().chain(&self.procs) {
                let log = p.log();
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!("----- {} (last {} lines) -----", p.name, tail.len());
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
    }
}
