//! The image cannot break on a missing library: the binary the Dockerfile builds (`hack/build-static.sh`) is
//! static, and it starts and serves in an empty root that holds only itself, its certificate files and its data
//! directory, as a non-root user: less than gcr.io/distroless/static gives it (no libc, no /etc, no /proc).
//!
//! It builds with the `static-test` profile (release, opt-level 1; see Cargo.toml) unless `PODSET_STATIC_BIN`
//! names an already built static binary. Needs root, for chroot (tests and CI run as root).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use podset_apiserver::apiserver::tls;

/// The image's user (distroless `nonroot`).
const UID: u32 = 65532;

#[test]
fn static_binary_starts_and_serves_in_an_empty_root_as_non_root() {
    let bin = common::static_binary();
    assert_no_shared_libraries(&bin);

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("certs")).unwrap();
    std::fs::copy(&bin, root.join("podset-apiserver")).unwrap();
    std::fs::set_permissions(root.join("podset-apiserver"), std::fs::Permissions::from_mode(0o755)).unwrap();
    write_serving_cert(&root.join("certs"));
    // The data volume, writable by the image's user; everything else belongs to root.
    std::fs::create_dir(root.join("data")).unwrap();
    chown(root.join("data"), Some(UID), Some(UID)).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tree = list_tree(&root);
    assert_eq!(tree, ["certs", "certs/tls.crt", "certs/tls.key", "data", "podset-apiserver"], "the root holds more");

    let chroot = find_in_path("chroot").expect("chroot (coreutils) is needed");
    let version = Command::new(&chroot).arg(&root).arg("/podset-apiserver").arg("--version").env_clear().output();
    let version = version.expect("chroot (coreutils) is needed; run as root");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(version.status.success(), "--version failed: {version:?}");
    assert!(text.contains(&format!("gitCommit: {}", podset_apiserver::version::GIT_COMMIT)), "{text}");
    assert!(text.contains("buildDate: 20"), "{text}");

    let mut child = Command::new(&chroot)
        .arg(format!("--userspec={UID}:{UID}"))
        .arg(&root)
        .args(["/podset-apiserver", "--insecure-allow-all", "--bind-address=127.0.0.1", "--secure-port=0"])
        .args(["--data-dir=/data", "--tls-cert-file=/certs/tls.crt", "--tls-private-key-file=/certs/tls.key"])
        .args(["--log-format=json", "--enable-controller=false"])
        .env_clear()
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chroot (coreutils) is needed; run as root");
    let (tx, rx) = std::sync::mpsc::channel();
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = logs.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v.pointer("/fields/address").and_then(|a| a.as_str()).map(str::to_owned))
            {
                let _ = tx.send(a);
            }
            sink.lock().unwrap().push(line);
        }
    });
    let log = || logs.lock().unwrap().join("\n");
    let addr: std::net::SocketAddr = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(a) => a.parse().unwrap(),
        Err(_) => {
            let _ = child.kill();
            panic!("the static binary did not start in the empty root ({:?}):\n{}", child.wait(), log());
        }
    };

    let rt = tokio::runtime::Runtime::new().unwrap();
    let ca = tmp.path().join("ca.crt");
    let get = |path: &str| {
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        rt.block_on(common::request_once(addr, &ca, req))
    };
    let (status, body) = get("/version");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v = common::json(&body);
    assert_eq!(v["gitCommit"], podset_apiserver::version::GIT_COMMIT, "{v}");
    assert_eq!(v["gitVersion"], podset_apiserver::version::GIT_VERSION, "{v}");
    assert!(v["buildDate"].as_str().is_some_and(|d| d.len() == 20), "{v}");
    let (status, body) = get("/readyz?verbose");
    assert_eq!(status, 200, "the store does not work in the empty root: {}", String::from_utf8_lossy(&body));
    let (status, body) = get("/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(std::fs::metadata(root.join("data")).unwrap().is_dir());

    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = wait(&mut child, Duration::from_secs(30)).unwrap_or_else(|| panic!("ignored SIGTERM:\n{}", log()));
    assert!(status.success(), "exit {status:?}:\n{}", log());
    // The store was written by the non-root user, in the data volume and nowhere else.
    assert!(!list_tree(&root.join("data")).is_empty(), "nothing written to /data");
    let after = list_tree(&root).into_iter().filter(|p| !p.starts_with("data/")).collect::<Vec<_>>();
    assert_eq!(after, tree, "written outside /data:\n{}", log());
}

/// `cmd` as found on this process's PATH (the chrooted command gets an empty environment).
fn find_in_path(cmd: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(cmd)).find(|p| p.is_file())
}

/// No program interpreter (ld.so) and no DT_NEEDED entries: the kernel runs it as it is.
fn assert_no_shared_libraries(bin: &Path) {
    let readelf = |flag: &str| {
        let out = Command::new("readelf").args([flag, "-W"]).arg(bin).output().expect("readelf (binutils) is needed");
        assert!(out.status.success(), "readelf {flag} {}: {out:?}", bin.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let headers = readelf("--program-headers");
    assert!(!headers.contains("INTERP"), "{} asks for a dynamic loader:\n{headers}", bin.display());
    let dynamic = readelf("--dynamic");
    assert!(!dynamic.contains("(NEEDED)"), "{} needs shared libraries:\n{dynamic}", bin.display());
}

/// A CA and a serving certificate for 127.0.0.1, as a Secret mounted at /certs would hold them.
fn write_serving_cert(dir: &Path) {
    tls::provider();
    let (ca_pem, ca_key, ca_params) = tls::make_ca("static-test-ca").unwrap();
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);
    let (cert, key) = tls::make_serving_cert(&issuer, &["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    // Outside the root: the server never needs the CA.
    std::fs::write(dir.parent().unwrap().parent().unwrap().join("ca.crt"), ca_pem).unwrap();
}

/// Every path under `dir`, relative and sorted.
fn list_tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            out.push(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if entry.file_type().unwrap().is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn wait(child: &mut std::process::Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}
