//! The cluster itself: starting etcd, kube-apiserver, kube-controller-manager, podset-apiserver's replicas and a
//! node, registering the APIService, and stopping it all when dropped.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};

use crate::pki::Pki;
use crate::process::Proc;
use crate::sandbox::{assets_dir, free_port};

use crate::aggregation::all_versions;
use crate::{etcd, node, NAMESPACE_YAML, NODE_IP, RBAC_YAML, REPLICA_IPS};

/// The Services' ClusterIPs.
const SERVICE_CIDR: &str = "10.96.0.0/24";

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
    pub(crate) pki: Pki,
    pub(crate) procs: Vec<Proc>,
    /// None when podset-apiserver is not run by the harness (deployed to the node instead).
    pub(crate) server: Option<ServerCommand>,
    /// Per replica, the build it runs instead of `server` once replaced ([`Self::set_replica_server`]).
    pub(crate) replica_server: Vec<Option<ServerCommand>>,
    /// Per replica, the versions its build serves: a Service's Endpoints list only replicas serving its versions.
    pub(crate) replica_versions: Vec<Vec<String>>,
    /// The versions registered with the aggregator.
    pub(crate) registered: Vec<String>,
    /// The replicas the Endpoints list as ready.
    pub(crate) ready: std::sync::Mutex<Vec<usize>>,
    pub(crate) apiserver_args: Vec<String>,
    /// How many podset-apiservers run; with more than one, they share the cluster's etcd.
    pub(crate) replicas: usize,
    pub(crate) etcd_url: String,
    /// Per replica, the `--etcd-servers` it stores PodSets in, when not the cluster's etcd.
    pub(crate) replica_etcd: Vec<String>,
    /// Logs of replicas killed for good, printed if the test fails.
    pub(crate) dead: Vec<Proc>,
    pub(crate) node: Option<node::Node>,
    /// kube-apiserver dials each APIService's Service at its ClusterIP, which kube-proxy routes to one endpoint per
    /// connection, instead of picking an endpoint per request (`--enable-aggregator-routing`).
    pub(crate) cluster_ip_routing: bool,
    /// The demo workload's image on the node (`podset-demo`), once there is one.
    pub(crate) demo_image: Option<String>,
    /// In front of kube-apiserver, serving the ValidatingAdmissionPolicies and bindings 1.20 lacks
    /// ([`Self::start_with_policy_api`]).
    pub(crate) policy_api: Option<crate::PolicyApi>,
}

impl Cluster {
    pub fn start(server: ServerCommand) -> Self {
        Self::start_replicated(server, 1)
    }

    /// `replicas` podset-apiservers (at most 3) on [`REPLICA_IPS`], the same port, behind the Services
    /// deploy/base/apiservice.yaml names, whose Endpoints list them all (kube-apiserver runs with
    /// `--enable-aggregator-routing`, so it picks one per request). With more than one they store PodSets in the cluster's etcd (`--storage-backend=etcd`) and elect a
    /// leader for the controller.
    pub fn start_replicated(server: ServerCommand, replicas: usize) -> Self {
        Self::start_with(Some(server), replicas, false, false, Vec::new(), all_versions(), false)
    }

    /// [`Self::start`] with a front for kube-apiserver ([`crate::PolicyApi`]) that also serves
    /// `admissionregistration.k8s.io/v1` Validating- and MutatingAdmissionPolicies and their bindings from memory, as
    /// a 1.36+ kube-apiserver would. podset-apiserver's `--kubeconfig` points at the front, so all it asks
    /// of the cluster (informers, delegated authentication and authorization) goes through it; tests reach it with
    /// [`Self::policy_api_kubectl`] and [`Self::policy_api_client`]. The aggregator still calls our server directly.
    pub fn start_with_policy_api(server: ServerCommand) -> Self {
        Self::start_with(Some(server), 1, false, false, Vec::new(), all_versions(), true)
    }

    /// [`Self::start_replicated`] with aggregated requests routed as in a real cluster: kube-apiserver, without
    /// `--enable-aggregator-routing`, dials each APIService's Service at its ClusterIP, and kube-proxy (iptables
    /// mode, no node) sends each new connection to one of the Endpoints. kube-apiserver keeps one HTTP/2 connection
    /// per Service, so a version's requests all go to one replica until that connection ends
    /// (kubernetes/kubernetes#61296). [`Self::set_ready_replicas`] returns once kube-proxy routes as it says.
    pub fn start_replicated_behind_cluster_ip(server: ServerCommand, replicas: usize) -> Self {
        assert!((1..=REPLICA_IPS.len()).contains(&replicas));
        Self::start_with(Some(server), replicas, false, true, Vec::new(), all_versions(), false)
    }

    /// [`Self::start_replicated`] with replica `i` storing PodSets at `etcd_servers[i]` (an etcd of its own, not
    /// kube-apiserver's) when given.
    pub fn start_replicated_on(server: ServerCommand, replicas: usize, etcd_servers: Vec<String>) -> Self {
        Self::start_replicated_serving(server, replicas, etcd_servers, &all_versions())
    }

    /// [`Self::start_replicated_on`] with a build that serves only `versions` (an older build): only their
    /// APIServices are registered.
    pub fn start_replicated_serving(
        server: ServerCommand,
        replicas: usize,
        etcd_servers: Vec<String>,
        versions: &[String],
    ) -> Self {
        assert!((1..=REPLICA_IPS.len()).contains(&replicas));
        Self::start_with(Some(server), replicas, false, false, etcd_servers, versions.to_vec(), false)
    }

    /// [`Self::start`] with a node ([`node`]): the PodSets' Pods are scheduled, pulled from the images imported
    /// into containerd, and run. Takes about half a minute more.
    pub fn start_with_node(server: ServerCommand) -> Self {
        Self::start_with(Some(server), 1, true, false, Vec::new(), all_versions(), false)
    }

    /// The control plane and a node, without podset-apiserver: for deploying it to the node as an admin would
    /// (deploy/, with an image given to [`Self::import_image`]). The node has three 1 Gi PersistentVolumes, as a
    /// cluster's storage class would make them: for the server's claim, the backups' claim (deploy/backup), and the
    /// new data claim a restore makes.
    pub fn start_node_only() -> Self {
        let cluster = Self::start_with(None, 0, true, false, Vec::new(), Vec::new(), false);
        for name in ["podset-volume-1", "podset-volume-2", "podset-volume-3"] {
            cluster.add_local_volume(name);
        }
        cluster
    }

    /// The directory of the local PersistentVolume `name` (made by [`Self::add_local_volume`]).
    pub fn local_volume_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join("volumes").join(name)
    }

    /// A 1 Gi `ReadWriteOnce` PersistentVolume on the node (a directory under the cluster's), free for a claim as
    /// a storage class would make one; returns the directory.
    pub fn add_local_volume(&self, name: &str) -> PathBuf {
        let volume = self.local_volume_dir(name);
        std::fs::create_dir_all(&volume).unwrap();
        self.apply_text(
            &format!("pv-{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Retain\n  local: {{path: {}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kubernetes.io/hostname, operator: In, values: [{}]}}\n",
                volume.display(),
                node::NODE_NAME
            ),
        );
        volume
    }

    /// What a shell needs to use this cluster as an admin: `KUBECONFIG`, kubectl and ctr first on `PATH`,
    /// `ctr` pointed at the node's containerd (in the kubelet's `k8s.io` namespace) when there is a node.
    pub fn shell_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        let path = format!("{}:{}", assets_dir().display(), std::env::var("PATH").unwrap_or_default());
        let mut env = vec![("KUBECONFIG", self.kubeconfig.clone().into_os_string()), ("PATH", path.into())];
        if let Some(n) = &self.node {
            env.push(("CONTAINERD_ADDRESS", n.containerd_socket().into_os_string()));
            env.push(("CONTAINERD_NAMESPACE", "k8s.io".into()));
        }
        env
    }

    fn start_with(
        server: Option<ServerCommand>,
        replicas: usize,
        with_node: bool,
        cluster_ip_routing: bool,
        etcd_servers: Vec<String>,
        versions: Vec<String>,
        policy_api: bool,
    ) -> Self {
        assert!(replicas <= REPLICA_IPS.len() && (replicas > 0) == server.is_some());
        assert!(!(with_node && cluster_ip_routing), "a node runs its own kube-proxy");
        let assets = assets_dir();
        let mut needed = vec!["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"];
        if with_node {
            needed.extend(node::NODE_BINARIES);
        }
        if cluster_ip_routing {
            needed.push("kube-proxy");
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
            replica_server: vec![None; replicas],
            replica_versions: vec![versions; replicas],
            registered: Vec::new(),
            ready: std::sync::Mutex::new((0..replicas).collect()),
            apiserver_args: Vec::new(),
            replicas,
            etcd_url: String::new(),
            replica_etcd: etcd_servers,
            dead: Vec::new(),
            node: None,
            cluster_ip_routing,
            demo_image: None,
            policy_api: None,
        };
        cluster.start_etcd_and_apiserver(&assets, with_node);
        if cluster_ip_routing {
            cluster.start_service_proxy(&assets);
        }
        if policy_api {
            // Before our server, whose kubeconfig points at it.
            cluster.start_policy_api();
        }
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

        for user in ["kubelet", "scheduler"] {
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
        let mut proxy = self.kube_proxy(assets);
        proxy.args(["--cluster-cidr", node::POD_SUBNET]);
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
        self.wait_for_kube_proxy();
    }

    /// kube-proxy in iptables mode, as a node runs it (its kubeconfig written first).
    fn kube_proxy(&self, assets: &Path) -> Command {
        let kubeconfig = self.dir.path().join("proxy.kubeconfig");
        std::fs::write(&kubeconfig, self.kubeconfig_for("proxy")).unwrap();
        let mut proxy = Command::new(assets.join("kube-proxy"));
        proxy
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--proxy-mode=iptables")
            .arg(format!("--hostname-override={}", node::NODE_NAME))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--healthz-bind-address=127.0.0.1:{}", free_port()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{}", free_port()))
            // Conntrack's table sizes are the machine's (read-only in a network namespace): leave them.
            .args(["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0"])
            .args(["--conntrack-tcp-timeout-close-wait=0"])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        proxy
    }

    fn wait_for_kube_proxy(&self) {
        self.wait_for("kube-proxy to route the kubernetes Service", Duration::from_secs(60), |_| {
            Command::new("iptables")
                .args(["-t", "nat", "-S", "KUBE-SERVICES"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("10.96.0.1/32"))
        });
    }

    /// kube-proxy alone, for kube-apiserver to reach our Services at their ClusterIPs
    /// ([`Self::start_replicated_behind_cluster_ip`]).
    fn start_service_proxy(&mut self, assets: &Path) {
        assert!(
            crate::inside_namespace(),
            "kube-proxy's rules need the cluster's private network namespace (envtest::namespace_command)"
        );
        // A connection to a ClusterIP needs a route before kube-proxy's DNAT (OUTPUT) gives it a replica's address,
        // which is on this loopback too.
        let out = Command::new("ip").args(["route", "replace", SERVICE_CIDR, "dev", "lo"]).output().expect("ip");
        assert!(out.status.success(), "ip route: {}", String::from_utf8_lossy(&out.stderr));
        let mut proxy = self.kube_proxy(assets);
        // Endpoints rather than the EndpointSlices kube-controller-manager mirrors from them: it starts only once
        // the APIServices are Available, which now takes kube-proxy's routes.
        proxy.arg("--feature-gates=EndpointSliceProxying=false");
        self.procs.push(Proc::spawn("kube-proxy", &mut proxy));
        self.wait_for_kube_proxy();
    }

    /// The replicas kube-proxy's rules send `service` (in podset-system) to: each endpoint's DNAT.
    pub(crate) fn routed_replicas(service: &str) -> Vec<usize> {
        let out = Command::new("iptables").args(["-t", "nat", "-S"]).output().expect("iptables");
        let comment = format!("--comment \"podset-system/{service}:https\"");
        let mut routed: Vec<usize> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&comment))
            .filter_map(|l| l.split("--to-destination ").nth(1)?.split(':').next())
            .filter_map(|ip| REPLICA_IPS.iter().position(|r| *r == ip))
            .collect();
        routed.sort_unstable();
        routed.dedup();
        routed
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
    /// 8080, unready from `/unready` on, exits on `/exit?code=N` or `--exit-after`.
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
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
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
        if self.cluster_ip_routing {
            // Its default: Services at their ClusterIPs.
            self.apiserver_args.retain(|a| a != "--enable-aggregator-routing=true");
        }
        if self.replicas > 1 {
            // Each replica dials it at an address of its own (APISERVER_ROUTES).
            self.apiserver_args.retain(|a| !a.starts_with("--bind-address="));
            self.apiserver_args.push("--bind-address=0.0.0.0".into());
        }
        if with_node {
            // Pods reach it at the `kubernetes` Service (NODE_IP, through kube-proxy), and the kubelet's identity
            // is for the Node authorizer; it reaches the kubelet (logs, exec) with the admin's certificate, at the
            // node's IP (the node's name resolves nowhere here).
            for (flag, value) in [
                ("--kubelet-preferred-address-types", "InternalIP".to_owned()),
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

    /// Kills the process called `name` with SIGKILL, waits for it, and hands it back (its log kept).
    pub(crate) fn kill_proc(&mut self, name: &str) -> Option<Proc> {
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

    /// Starts kube-apiserver again with `flags` (`--name=value`, each replacing any of the same name), waits until
    /// it is ready and serves our APIServices again.
    pub fn restart_apiserver_with(&mut self, flags: &[String]) {
        self.stop_apiserver();
        for flag in flags {
            let name = flag.split('=').next().unwrap_or(flag);
            self.apiserver_args.retain(|a| a.split('=').next() != Some(name));
            self.apiserver_args.push(flag.clone());
        }
        self.start_apiserver();
        self.wait_for("the APIServices to be Available again", Duration::from_secs(120), |c| c.apiservice_available());
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
        self.kubeconfig_at(user, &self.apiserver_url)
    }

    /// The same, reaching kube-apiserver at `server`.
    pub(crate) fn kubeconfig_at(&self, user: &str, server: &str) -> String {
        let mut kubeconfig = String::new();
        write!(
            kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {user}\n    namespace: default\ncurrent-context: e2e\n\
             users:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            server,
            self.pki.b64("ca.crt"),
            self.pki.b64(&format!("{user}.crt")),
            self.pki.b64(&format!("{user}.key"))
        )
        .unwrap();
        kubeconfig
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
