//! Each end-to-end test runs in its own network + PID namespace with its own control plane.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub use podset_envtest::Cluster;
use podset_envtest::{inside_namespace, namespace_command, ServerCommand};

use super::{assets_dir, BIN};

/// A field of the deployed server's Pod (`podset-system/podset-apiserver-0`, as deploy/ names it), by JSONPath.
#[allow(dead_code)] // not every test binary deploys the server
pub fn server_pod_field(c: &Cluster, jsonpath: &str) -> Result<String, String> {
    c.kubectl_try(&["get", "pod", "podset-apiserver-0", "-n", "podset-system", "-o", &format!("jsonpath={jsonpath}")])
}

/// Control planes running at once in one test binary: each is four processes, on a 2-core machine.
const MAX_CLUSTERS: usize = 2;
static RUNNING: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

/// Runs `body` inside a fresh namespace, by re-running the current test there.
pub fn in_namespace(test: &str, body: impl FnOnce()) {
    if inside_namespace() {
        body();
        return;
    }
    let _slot = Slot::take();
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
    // What it printed (figures to report, say) shows with --nocapture, as a test's own output does.
    eprintln!("{}", String::from_utf8_lossy(&out.stderr).trim_end());
    eprintln!("{test}: passed inside its namespace in {:.1}s", started.elapsed().as_secs_f64());
}

struct Slot;

impl Slot {
    fn take() -> Self {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= MAX_CLUSTERS {
            running = FREED.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        FREED.notify_one();
    }
}

/// A cluster with the podset-apiserver binary under test.
pub fn start() -> Cluster {
    Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() })
}

/// A small multi-threaded runtime for a test's async part.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Polls `ok` until it holds, failing the test after `timeout`.
pub async fn wait<F, Fut>(timeout: Duration, mut ok: F, what: &str)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// [`wait`] with the controller tests' patience.
pub async fn eventually<F, Fut>(what: &str, ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait(Duration::from_secs(90), ok, what).await
}

/// [`start`] with a node: Pods run (containerd, kubelet, kube-scheduler, kube-proxy; see envtest::node).
pub fn start_with_node() -> Cluster {
    Cluster::start_with_node(ServerCommand { program: BIN.into(), args: Vec::new() })
}
