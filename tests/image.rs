//! The images as `hack/build-image.sh` makes them: OCI archives, the same bytes from the same inputs, with the
//! labels, user and entrypoint docs/install.md promises, and run as a container runtime runs them: umoci turns the image
//! into a runtime bundle (user, entrypoint and environment from the image's config), runc starts it with a
//! read-only root and no capabilities. podset-apiserver's `/version` then names the commit it was built from.
//!
//! Builds with the `static-test` profile, as tests/static_binary.rs. Needs root, runc and umoci
//! (hack/install-test-assets.sh installs them).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podset_apiserver::apiserver::tls;
use serde_json::{json, Value};

#[test]
fn archive_is_reproducible_and_labelled_with_the_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let first = build_image("podset-apiserver", &tmp.path().join("a"), &[]);
    let config = image_config(&first);
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.revision"], podset_apiserver::version::GIT_COMMIT, "{config}");
    assert_eq!(labels["org.opencontainers.image.title"], "podset-apiserver");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], json!(["/podset-apiserver"]));
    let created = labels["org.opencontainers.image.created"].as_str().unwrap().to_owned();
    assert_eq!(config["created"], created.as_str());

    // The same binary and time: the same bytes. Another time: other bytes, and the image says that time.
    let binary = static_binary();
    let epoch = epoch_of(&created);
    let again = build_image(
        "podset-apiserver",
        &tmp.path().join("b"),
        &[("PODSET_STATIC_BIN", binary.to_str().unwrap()), ("SOURCE_DATE_EPOCH", &epoch.to_string())],
    );
    assert_eq!(sha256(&first), sha256(&again), "two builds from the same inputs differ");
    let later = build_image(
        "podset-apiserver",
        &tmp.path().join("c"),
        &[("PODSET_STATIC_BIN", binary.to_str().unwrap()), ("SOURCE_DATE_EPOCH", &(epoch + 60).to_string())],
    );
    assert_ne!(sha256(&first), sha256(&later));
    assert_ne!(image_config(&later)["created"], created.as_str());
}

#[test]
fn image_runs_under_runc_read_only_as_its_user_and_names_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = build_image("podset-apiserver", &tmp.path().join("out"), &[]);
    let bundle = unpack(&archive, &tmp.path().join("bundle"));

    // A Secret's files and an emptyDir, as the kubelet would mount them.
    let certs = tmp.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    tls::provider();
    let (ca_pem, ca_key, ca_params) = tls::make_ca("image-test-ca").unwrap();
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);
    let (cert, key) = tls::make_serving_cert(&issuer, &["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(certs.join("tls.crt"), cert).unwrap();
    std::fs::write(certs.join("tls.key"), key).unwrap();
    let ca = tmp.path().join("ca.crt");
    std::fs::write(&ca, ca_pem).unwrap();
    // Readable by the image's user only through the group, as fsGroup gives it.
    for f in ["tls.crt", "tls.key"] {
        std::os::unix::fs::chown(certs.join(f), None, Some(65532)).unwrap();
        std::fs::set_permissions(certs.join(f), std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    }

    let container = Runc::start(&bundle, "podset-apiserver-image", |spec| {
        spec["process"]["args"].as_array_mut().unwrap().extend(
            [
                "--insecure-allow-all",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--data-dir=/var/lib/podset-apiserver",
                "--tls-cert-file=/certs/tls.crt",
                "--tls-private-key-file=/certs/tls.key",
                "--log-format=json",
                "--enable-controller=false",
            ]
            .map(Value::from),
        );
        spec["process"]["env"].as_array_mut().unwrap().push("RUST_LOG=info".into());
        let mounts = spec["mounts"].as_array_mut().unwrap();
        mounts.push(json!({"destination": "/certs", "type": "bind", "source": certs, "options": ["rbind", "ro"]}));
        mounts.push(json!({
            "destination": "/var/lib/podset-apiserver", "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=0700", "uid=65532", "gid=65532"]
        }));
    });

    let addr: std::net::SocketAddr = container
        .wait_for_log(Duration::from_secs(60), |line| {
            serde_json::from_str::<Value>(line).ok()?.pointer("/fields/address")?.as_str().map(str::to_owned)
        })
        .parse()
        .unwrap();
    let pid = container.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(uid.split_whitespace().skip(1).collect::<Vec<_>>(), ["65532"; 4], "{uid}");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo.lines().find(|l| l.split(' ').nth(4) == Some("/")).expect("a root mount");
    assert!(root.split(' ').nth(5).unwrap().split(',').any(|o| o == "ro"), "root is not read-only: {root}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let get = |path: &str| {
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        rt.block_on(common::request_once(addr, &ca, req))
    };
    let (code, body) = get("/version");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let v = common::json(&body);
    assert_eq!(v["gitCommit"], podset_apiserver::version::GIT_COMMIT, "{v}");
    assert_eq!(v["gitCommit"], image_config(&archive)["config"]["Labels"]["org.opencontainers.image.revision"]);
    let (code, body) = get("/readyz?verbose");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));

    container.signal("TERM");
    let exit = container.wait(Duration::from_secs(60));
    assert_eq!(exit, Some(0), "podset-apiserver did not stop cleanly on SIGTERM:\n{}", container.log());
}

#[test]
fn demo_workload_serves_readiness_turns_unready_and_exits_when_told() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = build_image("podset-demo", &tmp.path().join("out"), &[]);
    assert_eq!(image_config(&archive)["config"]["User"], "65532:65532");
    let bundle = unpack(&archive, &tmp.path().join("bundle"));
    let port = podset_envtest::free_port();
    let container = Runc::start(&bundle, "podset-demo-image", |spec| {
        spec["process"]["args"]
            .as_array_mut()
            .unwrap()
            .extend([format!("--port={port}"), "--ready-after=1".into()].map(Value::from));
    });
    container.wait_for_log(Duration::from_secs(10), |l| l.contains("serving").then_some(()));
    let get = |path: &str| http_get(port, path);
    assert_eq!(get("/healthz").0, 200);
    // Not ready at first, then ready; only the order is asserted.
    let mut seen = vec![];
    while seen.last() != Some(&200) {
        assert!(seen.len() < 300, "never ready: {seen:?}\n{}", container.log());
        seen.push(get("/readyz").0);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(seen.iter().all(|&s| s == 503 || s == 200), "{seen:?}");
    // Told so, it stays unready: its probe fails from then on.
    assert_eq!(get("/unready"), (200, "not ready from now on".to_owned()));
    assert_eq!(get("/readyz").0, 503);
    assert_eq!(get("/exit?code=3"), (200, "exiting with 3".to_owned()));
    assert_eq!(container.wait(Duration::from_secs(10)), Some(3), "{}", container.log());
}

/// `hack/build-image.sh IMAGE static-test` into `out`, in this test run's target directory; the archive's path.
fn build_image(image: &str, out: &Path, env: &[(&str, &str)]) -> PathBuf {
    // <target dir>/debug/podset-apiserver
    let target_dir = Path::new(common::BIN).parent().and_then(Path::parent).expect("target directory");
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(manifest_dir.join("hack/build-image.sh"))
        .args([image, "static-test"])
        .env("CARGO_TARGET_DIR", target_dir)
        .env("PODSET_IMAGE_DIR", out)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .expect("running hack/build-image.sh");
    assert!(output.status.success(), "hack/build-image.sh {image} failed ({:?}); its output is above", output.status);
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// The archive unpacked into an OCI image layout.
fn layout(archive: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("tar").arg("-C").arg(dir.path()).arg("-xf").arg(archive).status().unwrap();
    assert!(status.success());
    dir
}

fn read_blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(layout.join("blobs/sha256").join(digest.strip_prefix("sha256:").unwrap())).unwrap()
}

/// The image's config (index → manifest → config).
fn image_config(archive: &Path) -> Value {
    let dir = layout(archive);
    let index: Value = serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let manifest: Value =
        serde_json::from_slice(&read_blob(dir.path(), index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    serde_json::from_slice(&read_blob(dir.path(), manifest["config"]["digest"].as_str().unwrap())).unwrap()
}

/// The static binary build-image.sh packed: where hack/build-static.sh leaves it.
fn static_binary() -> PathBuf {
    let target_dir = Path::new(common::BIN).parent().and_then(Path::parent).unwrap();
    let host = Command::new("rustc").arg("-vV").output().unwrap();
    let host = String::from_utf8(host.stdout).unwrap();
    let host = host.lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_owned();
    target_dir.join(host).join("static-test/podset-apiserver")
}

/// Seconds since the epoch of `2006-01-02T15:04:05Z`.
fn epoch_of(rfc3339: &str) -> i64 {
    let out = Command::new("date").args(["-u", "-d", rfc3339, "+%s"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_owned()
}

/// `umoci unpack`: a runtime bundle made from the image's config, as a container runtime makes one.
fn unpack(archive: &Path, bundle: &Path) -> PathBuf {
    let dir = layout(archive);
    let index: Value = serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap();
    let out = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{tag}", dir.path().display()))
        .arg(bundle)
        .output()
        .expect("umoci (Debian umoci) is needed: hack/install-test-assets.sh installs it");
    assert!(out.status.success(), "umoci unpack: {out:?}");
    bundle.to_owned()
}

/// A container started by `runc run` in the foreground (so its output is ours), deleted on drop.
struct Runc {
    id: String,
    state: tempfile::TempDir,
    child: Mutex<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Runc {
    /// Starts the bundle with a read-only root, no capabilities, and this process's network (loopback only is
    /// used), after `edit` has changed its spec.
    fn start(bundle: &Path, id: &str, edit: impl FnOnce(&mut Value)) -> Self {
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["root"]["readonly"] = true.into();
        spec["process"]["terminal"] = false.into();
        for set in ["bounding", "effective", "inheritable", "permitted", "ambient"] {
            spec["process"]["capabilities"][set] = json!([]);
        }
        spec["linux"]["namespaces"].as_array_mut().unwrap().retain(|n| n["type"] != "network");
        edit(&mut spec);
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

        let state = tempfile::tempdir().unwrap();
        let mut child = Command::new("runc")
            .arg("--root")
            .arg(state.path())
            .args(["run", "--bundle"])
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runc (Debian runc) is needed: hack/install-test-assets.sh installs it");
        let log = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            });
        }
        Self { id: id.to_owned(), state, child: Mutex::new(child), log }
    }

    fn runc(&self, args: &[&str]) -> std::process::Output {
        Command::new("runc").arg("--root").arg(self.state.path()).args(args).output().unwrap()
    }

    /// The container's first process, as the host sees it.
    fn pid(&self) -> u32 {
        let out = self.runc(&["state", &self.id]);
        assert!(out.status.success(), "runc state: {out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["pid"].as_u64().unwrap() as u32
    }

    fn signal(&self, signal: &str) {
        let out = self.runc(&["kill", &self.id, signal]);
        assert!(out.status.success(), "runc kill: {out:?}");
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The first `Some` that `found` makes of a log line; fails the test (with the log) after `timeout`.
    fn wait_for_log<T>(&self, timeout: Duration, found: impl Fn(&str) -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(t) = self.log.lock().unwrap().iter().find_map(|l| found(l)) {
                return t;
            }
            if std::time::Instant::now() > deadline || self.child.lock().unwrap().try_wait().unwrap().is_some() {
                panic!("the container did not get there:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status of the container's process (runc run returns it), or None after `timeout`.
    fn wait(&self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Runc {
    fn drop(&mut self) {
        let _ = self.runc(&["delete", "--force", &self.id]);
        let _ = self.child.lock().unwrap().wait();
        if std::thread::panicking() {
            eprintln!("----- container {} -----\n{}", self.id, self.log());
        }
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1: status and body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}
