//! The quick start as a user runs it: `podset-local-cluster -- <command>` starts the local cluster in its own
//! namespaces, runs the command against it, and stops it all.

use std::process::{Command, Stdio};

#[test]
fn local_cluster_quick_start_runs_a_command() {
    if podset_envtest::inside_namespace() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_podset-local-cluster"))
        .args(["--", "kubectl", "api-resources", "--api-group=demo.k8s.io"])
        .env("KUBEBUILDER_ASSETS", podset_envtest::assets_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("podsets") && l.contains("demo.k8s.io/v1beta1")), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("KUBECONFIG="));
}
