//! Black-box tests with the real kubectl 1.37 pointed straight at the server.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
    _server: TestServer,
}

impl Kubectl {
    fn new() -> Self {
        let server = TestServer::start(&[]);
        let home = tempfile::tempdir().unwrap();
        let kubeconfig = server.write_kubeconfig(home.path());
        Self { bin: assets_dir().join("kubectl"), kubeconfig, home, _server: server }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.stdin(Stdio::null())
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s")
            .env("HOME", self.home.path());
        c
    }

    /// Runs kubectl; returns stdout, panicking with stderr on failure.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().expect("run kubectl");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "kubectl {args:?} failed:\n{stdout}\n{stderr}");
        stdout.into_owned()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.command(args).output().expect("run kubectl");
        assert!(!out.status.success(), "kubectl {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn apply(&self, manifest: &str) -> String {
        let path = self.home.path().join("manifest.yaml");
        std::fs::write(&path, manifest).unwrap();
        self.ok(&["apply", "-f", path.to_str().unwrap()])
    }
}

const WEB: &str = "apiVersion: demo.k8s.io/v1alpha1
kind: PodSet
metadata:
  name: web
  labels:
    team: a
spec:
  replicas: 2
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: main
        image: busybox
        command: [sleep, '3600']
";

#[test]
fn api_resources_and_explain() {
    let k = Kubectl::new();
    let out = k.ok(&["api-resources", "--api-group=demo.k8s.io"]);
    let line = out.lines().find(|l| l.starts_with("podsets")).unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols, vec!["podsets", "ps", "demo.k8s.io/v1beta1", "true", "PodSet"], "the preferred version");
    let out = k.ok(&["explain", "podsets.spec.replicas"]);
    assert!(out.contains("KIND:") && out.contains("PodSet"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("VERSION:") && l.ends_with("v1beta1")), "the preferred version: {out}");
    assert!(out.contains("Defaults to 1"), "{out}");
    let out = k.ok(&["explain", "podsets.spec.template.spec.containers.image"]);
    assert!(out.contains("image"), "{out}");
    let out = k.ok(&["explain", "podsets.spec.minReadySeconds"]);
    assert!(out.contains("available"), "{out}");
    let out = k.ok(&["explain", "podsets.spec", "--api-version=demo.k8s.io/v1alpha1"]);
    assert!(out.lines().any(|l| l.starts_with("VERSION:") && l.ends_with("v1alpha1")), "{out}");
    assert!(!out.contains("minReadySeconds"), "v1alpha1 has no spec.minReadySeconds: {out}");
}

#[test]
fn apply_get_patch_scale_delete() {
    let k = Kubectl::new();
    assert!(k.apply(WEB).contains("podset.demo.k8s.io/web created"));
    // Re-applying a change goes through a JSON merge patch.
    let changed = WEB.replace("replicas: 2", "replicas: 3");
    assert!(k.apply(&changed).contains("podset.demo.k8s.io/web configured"));
    assert!(k.apply(&changed).contains("podset.demo.k8s.io/web unchanged"));

    let out = k.ok(&["get", "ps"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, vec!["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], &["web", "3", "0", "0"]);

    let wide = k.ok(&["get", "podsets", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("SELECTOR"), "{wide}");
    assert!(wide.contains("app=web"), "{wide}");
    let yaml = k.ok(&["get", "podset", "web", "-o", "yaml"]);
    assert!(yaml.contains("kind: PodSet") && yaml.contains("replicas: 3"), "{yaml}");
    assert_eq!(k.ok(&["get", "ps", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image}"]), "busybox");
    assert_eq!(k.ok(&["get", "ps", "-l", "team=a", "-o", "name"]).trim(), "podset.demo.k8s.io/web");
    assert_eq!(k.ok(&["get", "ps", "-l", "team=b", "-o", "name"]).trim(), "");
    let all = k.ok(&["get", "all"]);
    assert!(all.lines().any(|l| l.split_whitespace().next() == Some("web")), "category 'all': {all}");

    assert!(k.ok(&["scale", "ps", "web", "--replicas=5"]).contains("podset.demo.k8s.io/web scaled"));
    assert_eq!(k.ok(&["get", "ps", "web", "-o", "jsonpath={.spec.replicas}"]), "5");
    k.ok(&["patch", "ps", "web", "--type=merge", "-p", r#"{"spec":{"replicas":1}}"#]);
    assert_eq!(k.ok(&["get", "ps", "web", "-o", "jsonpath={.spec.replicas}"]), "1");
    k.ok(&["patch", "ps", "web", "--type=json", "-p", r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#]);
    assert_eq!(k.ok(&["get", "ps", "web", "-o", "jsonpath={.spec.replicas}"]), "4");
    let err = k.fails(&["patch", "ps", "web", "--type=merge", "-p", r#"{"spec":{"replicas":-1}}"#]);
    assert!(err.contains("spec.replicas: Invalid value: -1"), "{err}");
    let err = k.fails(&["get", "ps", "nope"]);
    assert!(err.contains(r#"podsets.demo.k8s.io "nope" not found"#), "{err}");

    assert!(k.ok(&["delete", "ps", "web"]).contains("podset.demo.k8s.io \"web\" deleted"));
    k.ok(&["wait", "--for=delete", "ps/web", "--timeout=10s"]);
    assert!(k.ok(&["get", "ps"]).is_empty() || k.ok(&["get", "ps", "-o", "name"]).trim().is_empty());
}

#[test]
fn get_watch_sees_added_modified_deleted() {
    let k = Kubectl::new();
    let (mut child, rx) = common::spawn_lines(k.command(&["get", "ps", "--watch", "--output-watch-events"]));
    // Let the watch start before changing anything.
    std::thread::sleep(Duration::from_millis(1500));
    k.apply(WEB);
    k.ok(&["scale", "ps", "web", "--replicas=7"]);
    k.ok(&["delete", "ps", "web"]);
    let mut events = Vec::new();
    while events.len() < 3 {
        let line =
            rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("watch output so far: {events:?}"));
        let cols: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if cols.first().map(String::as_str) == Some("EVENT") {
            continue;
        }
        events.push(cols);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(events[0][..3], ["ADDED", "web", "2"], "{events:?}");
    assert_eq!(events[1][..3], ["MODIFIED", "web", "7"], "{events:?}");
    assert_eq!(events[2][..2], ["DELETED", "web"], "{events:?}");
}
