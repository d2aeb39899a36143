//! podset-apiserver's replicas in the cluster: started, killed, restarted, listed as ready or not, and clients
//! straight at each of them.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;

use crate::process::Proc;
use crate::{Cluster, Credential, ServerCommand, APISERVER_ROUTES, REPLICA_IPS, REPLICA_NAMES};

impl Cluster {
    fn start_podset_apiserver(&mut self) {
        self.start_replica(0);
    }

    /// Starts replica `i` (0 is the only one unless the cluster is replicated) on its address and the shared port,
    /// with its build ([`Self::set_replica_server`]) or the cluster's.
    pub fn start_replica(&mut self, i: usize) {
        let cmd = self.replica_server[i].as_ref().or(self.server.as_ref());
        let cmd = cmd.expect("podset-apiserver is deployed, not run by the harness");
        let p = |n| self.pki.path(n);
        let data_dir = match i {
            0 => self.dir.path().join("podset-data"),
            i => self.dir.path().join(format!("podset-data-{i}")),
        };
        let mut command = Command::new(&cmd.program);
        command.args(&cmd.args);
        let mut kubeconfig = self.controller_kubeconfig();
        if self.replicas > 1 {
            let servers = self.replica_etcd.get(i).unwrap_or(&self.etcd_url);
            command.args(["--storage-backend=etcd", &format!("--etcd-servers={servers}")]);
            // Its own way to kube-apiserver, to be cut off alone.
            let port = self.apiserver_url.rsplit(':').next().expect("a port");
            kubeconfig = self.dir.path().join(format!("controller-{i}.kubeconfig"));
            let text = self.kubeconfig_at("controller", &format!("https://{}:{port}", APISERVER_ROUTES[i]));
            std::fs::write(&kubeconfig, text).unwrap();
        }
        if self.policy_api.is_some() {
            // Everything it asks of the cluster goes through the front (then no way of its own to be cut).
            kubeconfig = self.policy_api_controller_kubeconfig();
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
                .arg(kubeconfig)
                .env("RUST_LOG", "info"),
        );
        self.procs.push(server);
    }

    /// Kills replica `i` with SIGKILL (as a lost node would); its log is kept for a failing test.
    pub fn kill_replica(&mut self, i: usize) {
        let old = self.kill_proc(REPLICA_NAMES[i]).expect("running");
        self.dead.push(old);
    }

    /// Stops replica `i` as a rolling update stops a Pod: SIGTERM, then SIGKILL if it has not exited within `grace`.
    /// Its exit status if it exited in time; its log is kept for a failing test.
    pub fn stop_replica(&mut self, i: usize, grace: Duration) -> Option<std::process::ExitStatus> {
        let at = self.procs.iter().position(|p| p.name == REPLICA_NAMES[i]).expect("running");
        let mut p = self.procs.remove(at);
        let status = p.terminate(grace);
        self.dead.push(p);
        status
    }

    /// From its next start on, replica `i` runs `server`, a build serving `versions` (another release's, in a
    /// rolling upgrade or rollback). The Endpoints change when [`Self::set_ready_replicas`] next writes them.
    pub fn set_replica_server(&mut self, i: usize, server: ServerCommand, versions: &[String]) {
        self.replica_server[i] = Some(server);
        self.replica_versions[i] = versions.to_vec();
    }

    /// How replica `i`'s process ended, if it exited on its own (not killed here), with its log.
    pub fn replica_exit(&mut self, i: usize) -> Option<(std::process::ExitStatus, String)> {
        let p = self.procs.iter_mut().find(|p| p.name == REPLICA_NAMES[i])?;
        let status = p.child.try_wait().ok()??;
        Some((status, p.log()))
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

    /// Restarts podset-apiserver as [`Self::restart_podset_apiserver`] does, from now on with `flags` added.
    pub fn restart_podset_apiserver_with(&mut self, flags: &[String]) {
        let server = self.server.as_mut().expect("podset-apiserver is deployed, not run by the harness");
        server.args.extend(flags.iter().map(Into::into));
        self.restart_podset_apiserver();
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
        let addr = format!("https://{}:{}", REPLICA_IPS[i], self.podset_addr.port());
        client_to(&addr, &self.podset_ca(), credential)
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

/// A kube-rs client for the server at `url` (HTTPS), trusting the CA in `ca` and presenting `credential`. Needs a
/// Tokio runtime context.
pub(crate) fn client_to(url: &str, ca: &std::path::Path, credential: Credential<'_>) -> kube::Client {
    podset_apiserver::apiserver::tls::provider();
    let mut cfg = kube::Config::new(url.parse().expect("address"));
    let ca = podset_apiserver::apiserver::tls::read_certs(ca).expect("the CA");
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
