//! Test support: runs the real `podset-apiserver` binary on a free port and gives clients for it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tempfile::TempDir;

pub mod cluster;
pub mod node;

pub const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");

/// A running server process. Killed on drop; its log is printed if the test failed.
pub struct TestServer {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    pub ca: PathBuf,
    logs: Arc<Mutex<Vec<String>>>,
    _tmp: Option<Arc<TempDir>>,
    extra_args: Vec<String>,
}

impl TestServer {
    /// Starts a server in a fresh data dir with `--insecure-allow-all` plus `args`.
    pub fn start(args: &[&str]) -> Self {
        let tmp = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut all = vec!["--insecure-allow-all".to_owned()];
        all.extend(args.iter().map(|s| s.to_string()));
        Self::start_in(tmp.path().to_owned(), Some(tmp), all)
    }

    /// Starts a server on `data_dir` with exactly `args` (plus port, address, data dir and log format).
    pub fn start_in(data_dir: PathBuf, tmp: Option<Arc<TempDir>>, args: Vec<String>) -> Self {
        Self::start_program(Path::new(BIN), data_dir, tmp, args)
    }

    /// The same with another build of the server (one that takes the same flags).
    pub fn start_program(program: &Path, data_dir: PathBuf, tmp: Option<Arc<TempDir>>, args: Vec<String>) -> Self {
        let mut child = Command::new(program)
            .args(["--bind-address", "127.0.0.1", "--secure-port", "0", "--log-format", "json", "--data-dir"])
            .arg(&data_dir)
            .args(&args)
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start podset-apiserver");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if let Some(addr) = v.pointer("/fields/address").and_then(|a| a.as_str()) {
                        let _ = tx.send(addr.to_owned());
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("address"),
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start:\n{}", logs.lock().unwrap().join("\n"));
            }
        };
        let ca = data_dir.join("certs/ca.crt");
        Self { child: Some(child), addr, data_dir, ca, logs, _tmp: tmp, extra_args: args }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Waits (up to 10 s) for the log to contain `needle`: log lines arrive after the response they describe.
    pub fn log_contains(&self, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.logs().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = c.try_wait().expect("wait") {
                return s;
            }
            assert!(Instant::now() < deadline, "server ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the same server again on the same data dir.
    pub fn restart(&self) -> Self {
        Self::start_in(self.data_dir.clone(), self._tmp.clone(), self.extra_args.clone())
    }

    pub fn kube_config(&self) -> kube::Config {
        let mut cfg = kube::Config::new(self.url().parse().unwrap());
        cfg.root_cert = Some(vec![pem_to_der(&self.ca)]);
        cfg.read_timeout = Some(Duration::from_secs(300));
        cfg
    }

    pub fn client(&self) -> kube::Client {
        podset_apiserver::apiserver::tls::provider();
        kube::Client::try_from(self.kube_config()).expect("client")
    }

    /// A TLS connection to the server that negotiated HTTP/2 (ALPN `h2`), for an HTTP/2 client of one's own.
    pub async fn h2_tls(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_to_der(&self.ca).into()).unwrap();
        podset_apiserver::apiserver::tls::provider();
        let mut cfg = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap()
    }

    /// A kubeconfig file for kubectl.
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&self.ca).unwrap());
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: podsets\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: podsets\n  context:\n    cluster: podsets\n    user: dev\n    namespace: default\ncurrent-context: podsets\nusers:\n- name: dev\n  user:\n    token: dev\n",
                self.url()
            ),
        )
        .unwrap();
        path
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("----- podset-apiserver log -----\n{}\n-----", self.logs());
        }
    }
}

pub fn pem_to_der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_file_iter(path).unwrap().next().unwrap().unwrap().to_vec()
}

/// A raw request through a kube client: (status, headers, body).
pub async fn raw(client: &kube::Client, req: Request<Vec<u8>>) -> (u16, http::HeaderMap, Bytes) {
    let req = req.map(kube::client::Body::from);
    let resp: Response<kube::client::Body> = client.send(req).await.expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, body)
}

pub fn json(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

pub const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";

pub fn podset(name: &str, replicas: i32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "demo.k8s.io/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas}
    })
}

pub use podset_envtest::assets_dir;

/// The PodSets kube-rs's watcher lists with streaming lists (client-go's WatchList) before it says the initial
/// list is done, sorted by name.
pub async fn streaming_list_names(api: kube::Api<podset_apiserver::api::PodSet>) -> Vec<String> {
    use futures::{StreamExt, TryStreamExt};
    use kube::runtime::watcher;
    let mut events = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut names = Vec::new();
    let collect = async {
        while let Some(e) = events.try_next().await.unwrap() {
            match e {
                watcher::Event::InitApply(p) => names.push(p.metadata.name.unwrap()),
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), collect).await.expect("kube-rs's streaming list to finish");
    names.sort();
    names
}

/// Starts `cmd` and streams its standard output line by line (e.g. `kubectl get -w`).
pub fn spawn_lines(mut cmd: Command) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// One HTTP/1.1 request over TLS to `addr`, trusting `ca`, with no retries (kube's client retries 503s).
pub async fn request_once(addr: SocketAddr, ca: &Path, req: Request<Vec<u8>>) -> (u16, Bytes) {
    podset_apiserver::apiserver::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_to_der(ca).into()).unwrap();
    let cfg = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::from(addr.ip());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(req.map(|b| http_body_util::Full::new(Bytes::from(b)))).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// A small tmpfs, mounted for one test (tests run as root), unmounted on drop.
pub struct Tmpfs {
    _tmp: tempfile::TempDir,
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs failed: this test needs root");
        Self { _tmp: tmp, path }
    }

    /// Writes a file until the disk is full.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let filler = self.path.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Builds the static binary with `hack/build-static.sh`, in this test run's target directory.
#[allow(dead_code)] // not every test binary packs or runs it
pub fn static_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("PODSET_STATIC_BIN") {
        return bin.into();
    }
    // <target dir>/debug/podset-apiserver
    let target_dir = Path::new(BIN).parent().and_then(Path::parent).expect("target directory");
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let started = std::time::Instant::now();
    let out = Command::new(manifest_dir.join("hack/build-static.sh"))
        .arg("static-test")
        .env("CARGO_TARGET_DIR", target_dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("running hack/build-static.sh");
    assert!(out.status.success(), "hack/build-static.sh static-test failed ({:?}); its output is above", out.status);
    eprintln!("static build: {:.0}s", started.elapsed().as_secs_f64());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The build before demo.k8s.io/v1beta1 (1e229b9), for rolling upgrades and rollbacks:
/// `PODSET_OLD_RELEASE_BIN`, or `hack/install-old-release.sh`'s build of it (once, into the test-asset cache).
#[allow(dead_code)] // not every test binary runs it
pub fn old_release_binary() -> PathBuf {
    old_release("PODSET_OLD_RELEASE_BIN", &[])
}

/// The image archive of the same build, for the local node: `PODSET_OLD_RELEASE_IMAGE`, or
/// `hack/install-old-release.sh --image`'s build of it (once, into the test-asset cache).
#[allow(dead_code)] // not every test binary runs it
pub fn old_release_image() -> PathBuf {
    old_release("PODSET_OLD_RELEASE_IMAGE", &["--image"])
}

/// What `var` names, else the path hack/install-old-release.sh prints with `args`.
#[allow(dead_code)]
fn old_release(var: &str, args: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return path.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/install-old-release.sh");
    let out = Command::new(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "hack/install-old-release.sh {args:?} failed ({:?}); its output is above",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// An audit policy that records every request at the Metadata level.
pub const AUDIT_METADATA: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n";

/// The flags that audit to `<dir>/audit.log` with `policy` (written to `<dir>/audit-policy.yaml`).
pub fn audit_flags(dir: &Path, policy: &str) -> (Vec<String>, PathBuf) {
    let (policy_file, log) = (dir.join("audit-policy.yaml"), dir.join("audit.log"));
    std::fs::write(&policy_file, policy).unwrap();
    let flags =
        vec![format!("--audit-policy-file={}", policy_file.display()), format!("--audit-log-path={}", log.display())];
    (flags, log)
}

/// The audit log's events, once `done` says they are all there (or after 10 s).
pub fn audit_events(path: &Path, done: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let events: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("one JSON event per line")).collect();
        if done(&events) || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
