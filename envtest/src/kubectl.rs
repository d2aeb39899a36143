//! Talking to the cluster's kube-apiserver as its admin: kubectl and kube-rs clients, and waiting for a condition.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::sandbox::assets_dir;
use crate::Cluster;

impl Cluster {
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
        self.kubectl_command_with(&self.kubeconfig, args)
    }

    /// kubectl with `kubeconfig` (its discovery cache is per server, under the cluster's directory).
    pub(crate) fn kubectl_command_with(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(assets_dir().join("kubectl"));
        c.stdin(Stdio::null())
            .args(args)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=30s")
            .env("HOME", self.dir.path());
        c
    }

    pub fn kubectl_try(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_output(self.kubectl_command(args))
    }

    /// Runs a kubectl command: its output, or its output and errors.
    pub(crate) fn kubectl_output(&self, mut command: Command) -> Result<String, String> {
        let out = command.output().expect("kubectl");
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
        podset_apiserver::apiserver::tls::provider();
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()
    }
}
