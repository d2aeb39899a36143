//! Each end-to-end test runs in its own network + PID namespace with its own control plane.

use std::time::Instant;

pub use podset_apiserver::envtest::Cluster;
use podset_apiserver::envtest::{inside_namespace, namespace_command, ServerCommand};

use super::{assets_dir, BIN};

/// Runs `body` inside a fresh namespace, by re-running the current test there.
pub fn in_namespace(test: &str, body: impl FnOnce()) {
    if inside_namespace() {
        body();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = [test, "--exact", "--nocapture", "--test-threads=1"].map(String::from).to_vec();
    let started = Instant::now();
    let out = namespace_command(&exe, &args)
        .env("KUBEBUILDER_ASSETS", assets_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare (util-linux) and ip (iproute2) are needed; run as root");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} failed inside its namespace ({:?}):\n{text}",
        out.status
    );
    eprintln!("{test}: passed inside its namespace in {:.1}s", started.elapsed().as_secs_f64());
}

/// A cluster with the podset-apiserver binary under test.
pub fn start() -> Cluster {
    Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() })
}
