//! A node for the local control plane, so Pods run: containerd (Debian `containerd`) with runc and the CNI bridge
//! plugins (Debian `containernetworking-plugins`), the kubelet, kube-scheduler and kube-proxy (iptables mode),
//! 1.20.2 like kube-apiserver. Everything stays inside the cluster's namespaces: Pods get addresses on a bridge
//! (`cni0`, [`POD_SUBNET`]) that exists only in the private network namespace; state lives under the cluster's
//! temporary directory; the paths the kubelet and containerd cannot be told (`/run/containerd`, `/var/log/pods`,
//! `/var/log/containers`) are tmpfs mounts in the private mount namespace; Pods' cgroups are under a cgroup root
//! of this cluster's own, removed at the end.
//!
//! kube-proxy rather than the aggregator's endpoint routing alone: our server in a Pod reaches the main API server
//! at `KUBERNETES_SERVICE_HOST` (the `kubernetes` Service's ClusterIP), which only kube-proxy's rules route, as on
//! a real node. (kube-apiserver reaches an APIService's Pod at its endpoint, `--enable-aggregator-routing`.)

use std::path::{Path, PathBuf};
use std::process::Command;

/// The node's name, as the kubelet registers it.
pub const NODE_NAME: &str = "podset-node";
/// Pod addresses (the bridge's host-local range).
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The binaries a node needs in `KUBEBUILDER_ASSETS` (hack/install-test-assets.sh installs them).
pub const NODE_BINARIES: [&str; 5] = ["kubelet", "kube-scheduler", "kube-proxy", "containerd", "ctr"];
/// Paths the kubelet and containerd 1.6 use whatever their flags say: tmpfs in the cluster's mount namespace.
const FIXED_PATHS: [&str; 3] = ["/run/containerd", "/var/log/pods", "/var/log/containers"];
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The node's own files and cgroups; [`Node::cleanup`] takes them away.
pub(super) struct Node {
    pub dir: PathBuf,
    pub cgroup_root: String,
    pub sandbox_image: String,
}

impl Node {
    /// Writes the CNI and containerd configuration, mounts the fixed paths and makes the cgroup root.
    pub fn prepare(cluster_dir: &Path, sandbox_image: &str) -> Self {
        assert!(
            crate::inside_namespace(),
            "a node needs the cluster's private network, PID and mount namespaces (envtest::namespace_command)"
        );
        let dir = cluster_dir.join("node");
        for sub in ["cni/net.d", "cni/networks", "containerd/root", "containerd/state", "kubelet", "volume-plugins"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for path in FIXED_PATHS {
            std::fs::create_dir_all(path).unwrap();
            run("mount", &["-t", "tmpfs", "-o", "mode=0755", "tmpfs", path]);
        }
        let cni = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "podset-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": dir.join("cni/networks"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        std::fs::write(dir.join("cni/net.d/10-podset-node.conflist"), serde_json::to_vec_pretty(&cni).unwrap())
            .unwrap();
        let d = |p: &str| dir.join(p).display().to_string();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  netns_mounts_under_state_dir = true
  # The kubelet asks for a negative oom_score_adj for sandboxes (-998) and Guaranteed Pods; lowering it needs
  # CAP_SYS_RESOURCE, which test sandboxes (this one) may not grant, and runc's init then dies ("can't get final
  # child's PID from pipe"). Clamped to containerd's own (0), as for rootless containerd.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
"#,
            root = d("containerd/root"),
            state = d("containerd/state"),
            sock = d("containerd/containerd.sock"),
            conf = d("cni/net.d"),
        );
        std::fs::write(dir.join("containerd/config.toml"), config).unwrap();
        let cgroup_root = format!("/podset-envtest-{}", cluster_dir.file_name().unwrap().to_string_lossy());
        make_cgroup_root(&cgroup_root);
        Self { dir, cgroup_root, sandbox_image: sandbox_image.to_owned() }
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    pub fn containerd_command(&self, assets: &Path) -> Command {
        let mut c = Command::new(assets.join("containerd"));
        c.arg("--config").arg(self.dir.join("containerd/config.toml"));
        // The runc shim and runc, from the same packages.
        c.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        c
    }

    /// `ctr` in containerd's `k8s.io` namespace, where the kubelet's images are.
    pub fn ctr(&self, assets: &Path) -> Command {
        let mut c = Command::new(assets.join("ctr"));
        c.arg("--address").arg(self.containerd_socket()).args(["--namespace", "k8s.io"]);
        c
    }

    pub fn kubelet_args(&self, kubeconfig: &Path, ca: &str) -> Vec<String> {
        let d = |p: &str| self.dir.join(p).display().to_string();
        vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", d("kubelet")),
            format!("--cert-dir={}", d("kubelet/pki")),
            format!("--volume-plugin-dir={}", d("volume-plugins")),
            "--container-runtime=remote".into(),
            format!("--container-runtime-endpoint=unix://{}", self.containerd_socket().display()),
            format!("--pod-infra-container-image={}", self.sandbox_image),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={}", crate::NODE_IP),
            format!("--address={}", crate::NODE_IP),
            "--read-only-port=0".into(),
            "--healthz-port=0".into(),
            format!("--client-ca-file={ca}"),
            "--anonymous-auth=false".into(),
            "--cgroup-driver=cgroupfs".into(),
            format!("--cgroup-root={}", self.cgroup_root),
            "--fail-swap-on=false".into(),
            // The machine's disk is shared and large: only one nearly full (under 1 GiB free) evicts, not a percentage of it.
            "--eviction-hard=memory.available<50Mi,nodefs.available<1Gi,imagefs.available<1Gi".into(),
            // Images are imported, never pulled (no registry is reachable); keep them however full the disk.
            "--image-gc-high-threshold=100".into(),
            "--image-gc-low-threshold=99".into(),
            "--serialize-image-pulls=false".into(),
        ]
    }

    /// Ends whatever the node left: every other process of the PID namespace (shims and containers, which
    /// containerd does not stop with itself), its mounts, and its cgroups. Called once the node's own
    /// processes are killed.
    pub fn cleanup(&self) {
        kill_namespace_processes();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(unescape_mount_path))
            .filter(|m| m.starts_with(self.dir.to_str().unwrap()) || FIXED_PATHS.iter().any(|f| m.starts_with(f)))
            .collect();
        // Deepest first.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
        remove_cgroup_root(&self.cgroup_root);
    }
}

/// `SIGKILL` to every process of this PID namespace but this one (PID 1) and its threads, then reaps what can be
/// reaped. Only meaningful inside [`crate::namespace_command`]'s namespaces, whose /proc lists nothing else.
fn kill_namespace_processes() {
    let me = std::process::id();
    for _ in 0..50 {
        let others: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me && pid != 1 && !is_zombie(pid))
            .collect();
        if others.is_empty() {
            return;
        }
        for pid in others {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// The cgroup v1 hierarchies (and v2's, if mounted beside them) under /sys/fs/cgroup.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// The kubelet's `--cgroup-root` must exist in every hierarchy; a cpuset child starts with no CPUs or memory
/// nodes, so it gets its parent's.
fn make_cgroup_root(root: &str) {
    for h in cgroup_hierarchies() {
        let dir = h.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("making cgroup {}: {e}", dir.display()));
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(h.join(file)) {
                std::fs::write(dir.join(file), value.trim()).unwrap();
            }
        }
    }
}

/// Removes the cgroup root and everything under it, deepest first (a cgroup goes once its processes are gone).
fn remove_cgroup_root(root: &str) {
    fn remove(dir: &Path) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove(&entry.path());
            }
        }
        for _ in 0..20 {
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    for h in cgroup_hierarchies() {
        remove(&h.join(root.trim_start_matches('/')));
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Builds one of the images with hack/build-image.sh (pause and podset-demo take seconds; podset-apiserver with
/// `profile` static-test a few minutes) and returns the archive.
pub fn build_image(image: &str, profile: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-image.sh");
    let mut cmd = Command::new(&script);
    cmd.args([image, profile]).stderr(std::process::Stdio::inherit());
    // Started from a test, cargo's per-crate variables would make the nested cargo rebuild (see build-static.sh).
    for (var, _) in std::env::vars_os() {
        let var = var.to_string_lossy();
        if var.starts_with("CARGO_") && var != "CARGO_TARGET_DIR" && var != "CARGO_HOME" || var == "OUT_DIR" {
            cmd.env_remove(&*var);
        }
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(out.status.success(), "hack/build-image.sh {image} {profile} failed ({:?}); see above", out.status);
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The name an archive gives its image (`io.containerd.image.name`), e.g. `docker.io/library/podset-demo:v0.1.0`.
pub fn image_reference(archive: &Path) -> String {
    let out = Command::new("tar").arg("-xOf").arg(archive).arg("index.json").output().expect("tar");
    assert!(out.status.success(), "no index.json in {}", archive.display());
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).expect("index.json");
    index["manifests"][0]["annotations"]["io.containerd.image.name"]
        .as_str()
        .unwrap_or_else(|| panic!("{} names no image", archive.display()))
        .to_owned()
}
