//! A local Kubernetes control plane with podset-apiserver registered, to try PodSets through kube-apiserver.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Parser;
use podset_envtest::{assets_dir, inside_namespace, namespace_command, node, Cluster, ServerCommand};

/// Starts etcd, kube-apiserver and kube-controller-manager (from KUBEBUILDER_ASSETS; hack/install-test-assets.sh
/// installs them), podset-apiserver registered as an APIService, and a node (containerd, kubelet, kube-scheduler,
/// kube-proxy) where PodSets' Pods run, all in private namespaces (needs root), then opens a shell there with
/// KUBECONFIG and kubectl set up. Leaving the shell stops everything.
#[derive(Parser)]
#[command(name = "podset-local-cluster", version)]
struct Args {
    /// No node: Pods are created and stay Pending (starts about half a minute sooner).
    #[arg(long, conflicts_with = "no_podset_apiserver")]
    no_node: bool,
    /// The control plane and the node only, to deploy podset-apiserver yourself as on any cluster (docs/install.md):
    /// `ctr` imports images into the node's containerd, and a 1 Gi PersistentVolume awaits the server's claim.
    #[arg(long)]
    no_podset_apiserver: bool,
    /// Run this command instead of a shell, e.g. `-- kubectl get podsets`.
    #[arg(last = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // Internal: the cluster starts this same binary as its podset-apiserver.
    if argv.get(1).is_some_and(|a| a == "serve") {
        return serve(argv[2..].to_vec());
    }
    let args = Args::parse();
    let exe = std::env::current_exe().expect("own path");
    if !inside_namespace() {
        let forwarded: Vec<String> = argv[1..].iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let status = namespace_command(&exe, &forwarded)
            .env("KUBEBUILDER_ASSETS", assets_dir())
            .status()
            .expect("unshare (util-linux) and ip (iproute2) are needed, as root");
        return ExitCode::from(status.code().unwrap_or(1) as u8);
    }

    let server = ServerCommand { program: exe, args: vec!["serve".into()] };
    let cluster = if args.no_podset_apiserver {
        eprintln!("starting etcd, kube-apiserver, kube-controller-manager and a node ...");
        Cluster::start_node_only()
    } else if args.no_node {
        eprintln!("starting etcd, kube-apiserver, kube-controller-manager and podset-apiserver ...");
        Cluster::start(server)
    } else {
        eprintln!("starting etcd, kube-apiserver, kube-controller-manager, podset-apiserver and a node ...");
        Cluster::start_with_node(server)
    };
    if args.no_podset_apiserver {
        eprintln!(
            "ready, without podset-apiserver: deploy it as docs/install.md says (ctr reaches the node's containerd)"
        );
    } else {
        eprintln!("ready: podset-apiserver is registered as v1beta1.demo.k8s.io and v1alpha1.demo.k8s.io");
    }
    if !args.no_node {
        eprintln!(
            "node {} is Ready; its images: {} (the demo workload, port 8080)",
            node::NODE_NAME,
            cluster.demo_image()
        );
    }
    eprintln!("KUBECONFIG={}", cluster.kubeconfig.display());
    let mut cmd = match args.command.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest);
            c
        }
        None => {
            eprintln!(
                "try: kubectl get apiservices; kubectl api-resources --api-group=demo.k8s.io; kubectl get podsets"
            );
            eprintln!("exit the shell to stop the cluster");
            Command::new(std::env::var_os("SHELL").map(PathBuf::from).unwrap_or_else(|| "bash".into()))
        }
    };
    // The shell's HOME is the cluster's (kubectl's caches go with it); cargo, rustup and the asset cache keep the
    // user's, so hack/build-image.sh and hack/install-old-release.sh build and find what they cached before.
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let keep = |var: &str, default: PathBuf| std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    let cache = keep("XDG_CACHE_HOME", home.join(".cache"));
    cmd.env("CARGO_HOME", keep("CARGO_HOME", home.join(".cargo")))
        .env("RUSTUP_HOME", keep("RUSTUP_HOME", home.join(".rustup")))
        .env("PODSET_ASSETS_DIR", keep("PODSET_ASSETS_DIR", cache.join("podset-apiserver/assets")));
    let status = cmd.envs(cluster.shell_env()).env("HOME", cluster.dir.path()).status().expect("run the command");
    drop(cluster);
    ExitCode::from(status.code().unwrap_or(1) as u8)
}

fn serve(flags: Vec<OsString>) -> ExitCode {
    let mut argv = vec![OsString::from("podset-apiserver")];
    argv.extend(flags);
    let opts = podset_apiserver::cmd::Options::parse_from(argv);
    let _logs = podset_apiserver::cmd::init_logs(opts.log_format);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(podset_apiserver::cmd::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podset-apiserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}
