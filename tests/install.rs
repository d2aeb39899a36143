//! docs/install.md's life cycle on the local cluster, run as written: its `sh life-cycle:<step>` blocks, in a shell
//! as `hack/local-cluster.sh --no-podset-apiserver` opens it (the same cluster, the same environment), from a
//! copy of the checkout's deploy/ (the blocks write an overlay of their own there). The story: the build before
//! v1beta1 installed with a pinned CA, upgraded to this one with encryption, audit and tracing on, the CA and the
//! encryption key rotated, rolled back, and restored from the CronJob's backup onto a new volume. After each step
//! the test checks what the docs promise: the server runs the image named, the PodSet keeps its uid and its Pods,
//! each APIService that should exist is Available and answers through kube-apiserver, a namespace deletion
//! completes; after the uninstall nothing of ours is left but the namespace holding the backups' claim. The blocks
//! that repeat docs/operate.md's procedures (pinning and rotating the CA) are checked to hold them line for line.
//!
//! This build's image is packed from the tests' static build (`PODSET_STATIC_BIN`, hack/build-image.sh's own
//! switch) rather than the release build the docs' command makes: the same files, minutes sooner. On a cluster
//! without `batch/v1` CronJobs (1.20), deploy/backup's CronJob is applied as `batch/v1beta1`, and the one command
//! that needs `batch/v1` (`kubectl create job --from=cronjob/...`) makes the same Job from the CronJob's template.

mod common;

use std::path::Path;

use serde::Deserialize;
use std::process::Command;

use common::cluster::{in_namespace, server_pod_field};
use podset_envtest::Cluster;

const STEPS: [&str; 9] =
    ["install", "pin", "use", "upgrade", "rotate-ca", "rotate-key", "rollback", "restore", "uninstall"];
/// The build before v1beta1 (hack/install-old-release.sh --image), and this one as the upgrade step names it.
const OLD_IMAGE: &str = "podset-apiserver:v0.1.0-1e229b9174e7";
const NEW_IMAGE: &str = "podset-apiserver:v0.1.0-b";
/// The command of the rollback step that needs `batch/v1` CronJobs.
const JOB_FROM_CRONJOB: &str =
    "kubectl -n podset-system create job --from=cronjob/podset-backup podset-backup-before-rollback";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `sh life-cycle:<step>` blocks of a Markdown text, in order.
fn life_cycle_blocks(doc: &str) -> Vec<(String, String)> {
    tagged_blocks(doc, "life-cycle:")
}

/// The `sh <prefix><tag>` blocks of a Markdown text, in order: (tag, body).
fn tagged_blocks(doc: &str, prefix: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.strip_prefix("```sh ").and_then(|l| l.strip_prefix(prefix)) else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((tag.trim().to_owned(), body.join("\n")));
    }
    blocks
}

/// docs/operate.md's block tagged `tag`, for this life cycle's overlay.
fn operate_block(tag: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/operate.md")).unwrap();
    let found = tagged_blocks(&doc, "").into_iter().find(|(t, _)| t == tag);
    let (_, body) = found.unwrap_or_else(|| panic!("docs/operate.md has no `sh {tag}` block"));
    body.replace("deploy/overlays/self-signed", "deploy/local")
}

/// The APIServices of demo.k8s.io, by name.
fn apiservices(cluster: &Cluster) -> Vec<String> {
    let names = cluster.kubectl(&["get", "apiservices", "-o", "name"]);
    let ours = names.lines().filter_map(|l| l.strip_prefix("apiservice.apiregistration.k8s.io/"));
    ours.filter(|n| n.ends_with(".demo.k8s.io")).map(str::to_owned).collect()
}

/// The CAs (DER) the APIServices pin, which must be the same, without `insecureSkipTLSVerify`.
fn pinned_cas(cluster: &Cluster) -> Vec<Vec<u8>> {
    use base64::Engine;
    use rustls::pki_types::pem::PemObject;
    let mut pinned = Vec::new();
    for name in apiservices(cluster) {
        let spec = cluster.kubectl(&["get", "apiservice", &name, "-o", "jsonpath={.spec}"]);
        let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
        assert!(spec.get("insecureSkipTLSVerify").is_none(), "{name}: {spec}");
        let pem = base64::engine::general_purpose::STANDARD.decode(spec["caBundle"].as_str().unwrap()).unwrap();
        let cas: Vec<Vec<u8>> =
            rustls::pki_types::CertificateDer::pem_slice_iter(&pem).map(|c| c.unwrap().to_vec()).collect();
        pinned.push(cas);
    }
    assert!(pinned.windows(2).all(|w| w[0] == w[1]), "the APIServices pin different CAs");
    pinned.remove(0)
}

/// What every step leaves: exactly `versions` registered, each Available and answering through kube-apiserver's
/// proxy (which verifies the certificate against the pinned CA; Available alone is from a check that does not),
/// and a namespace deletion that completes (it stalls while a registered version does not answer).
fn healthy(cluster: &Cluster, step: &str, versions: &[&str]) {
    let mut registered = apiservices(cluster);
    registered.sort();
    let mut wanted: Vec<String> = versions.iter().map(|v| format!("{v}.demo.k8s.io")).collect();
    wanted.sort();
    assert_eq!(registered, wanted, "after {step}: the APIServices");
    for version in versions {
        let available = cluster.kubectl(&[
            "get",
            "apiservice",
            &format!("{version}.demo.k8s.io"),
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Available')].status}",
        ]);
        assert_eq!(available, "True", "after {step}: {version} not Available");
        let get = ["get", &format!("podsets.{version}.demo.k8s.io"), "web", "-o", "name"];
        let started = std::time::Instant::now();
        loop {
            match cluster.kubectl_try(&get) {
                Ok(listed) => {
                    assert_eq!(listed.trim(), "podset.demo.k8s.io/web");
                    break;
                }
                Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => {
                    let logs = cluster.kubectl_try(&["-n", "podset-system", "logs", "podset-apiserver-0"]);
                    panic!("after {step}: {version}: {e}\n{}", logs.unwrap_or_else(|e| e))
                }
                Err(e) => eprintln!("after {step}, {:?}: {version}: {e}", started.elapsed()),
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
    let namespace = format!("deleted-after-{step}");
    cluster.kubectl(&["create", "namespace", &namespace]);
    let deleted = cluster.kubectl_try(&["delete", "namespace", &namespace, "--timeout=90s"]);
    assert!(deleted.is_ok(), "after {step}: a namespace deletion stalls: {deleted:?}");
}

#[test]
fn the_docs_blocks_are_the_steps_in_order() {
    let doc = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    let steps: Vec<String> = life_cycle_blocks(&doc).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, STEPS, "docs/install.md's life-cycle blocks");
    assert_eq!(
        life_cycle_blocks("x\n```sh life-cycle:a\none\ntwo\n```\n```sh\nno\n```\n"),
        [("a".into(), "one\ntwo".into())]
    );
}

/// Runs one block with bash (`-euo pipefail`, so any failed command fails it) in `dir`.
fn run_step(cluster: &Cluster, dir: &Path, static_bin: &Path, step: &str, script: &str) -> String {
    static OLD_IMAGE_ARCHIVE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let old_image = OLD_IMAGE_ARCHIVE.get_or_init(common::old_release_image);
    eprintln!("--- life-cycle:{step}\n{script}");
    // A step that waits for what never comes ends, failing, instead of holding the suite.
    let out = Command::new("timeout")
        .args(["900", "bash", "-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .envs(cluster.shell_env())
        .env("HOME", dir)
        .env("PODSET_STATIC_BIN", static_bin)
        // What hack/install-old-release.sh --image prints, found with the real HOME (the step's is its own).
        .env("PODSET_OLD_RELEASE_IMAGE", old_image)
        // As hack/local-cluster.sh's shell: cargo, rustup and the asset cache keep the user's.
        .envs(["CARGO_HOME", "RUSTUP_HOME"].iter().filter_map(|v| Some((*v, std::env::var_os(v)?))))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "life-cycle:{step} failed ({}):\n{text}", out.status);
    text
}

fn server_pod(cluster: &Cluster) -> (String, String) {
    let out = server_pod_field(cluster, "{.metadata.uid} {.spec.containers[0].image}").unwrap();
    let (uid, image) = out.split_once(' ').unwrap();
    (uid.to_owned(), image.to_owned())
}

/// The PodSet's uid and its Pods' uids, sorted.
fn web(cluster: &Cluster) -> (String, String) {
    // v1alpha1, served by every build: discovery cached before a rollback would still name v1beta1.
    let uid = cluster.kubectl(&["get", "podsets.v1alpha1.demo.k8s.io", "web", "-o", "jsonpath={.metadata.uid}"]);
    let pods = cluster.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.uid}"]);
    let mut pods: Vec<&str> = pods.split_whitespace().collect();
    pods.sort();
    (uid, pods.join(" "))
}

/// Every object the installed manifests make (the local overlay, the backup, the metrics reader), as
/// (kind, namespace, name), from `kubectl kustomize` and the files: never a list written by hand.
fn made_by_deploy(cluster: &Cluster, dir: &Path) -> Vec<(String, Option<String>, String)> {
    let mut text = cluster.kubectl(&["kustomize", dir.join("deploy/local").to_str().unwrap()]);
    for file in ["deploy/backup/backup.yaml", "deploy/metrics-reader.yaml"] {
        text.push_str("\n---\n");
        text.push_str(&std::fs::read_to_string(repo().join(file)).unwrap());
    }
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let Ok(v) = serde_yaml::Value::deserialize(doc) else { continue };
        let s = |p: &[&str]| p.iter().try_fold(&v, |v, k| v.get(*k)).and_then(|v| v.as_str()).map(str::to_owned);
        if let (Some(kind), Some(name)) = (s(&["kind"]), s(&["metadata", "name"])) {
            out.push((kind, s(&["metadata", "namespace"]), name));
        }
    }
    // The Binding the docs have an admin create for Prometheus.
    out.push(("ClusterRoleBinding".into(), None, "prometheus-podset-metrics".into()));
    out
}

#[test]
fn the_life_cycle_holds_operate_md_procedures_line_for_line() {
    let doc = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    let blocks = life_cycle_blocks(&doc);
    let block = |step: &str| blocks.iter().find(|(s, _)| s == step).unwrap().1.clone();
    let lines = |text: &str| -> Vec<String> {
        let commands = text.lines().map(|l| l.split(" #").next().unwrap().trim_end().to_owned());
        commands.filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
    };
    // Pinning: the same commands, the edit that lists pinned-ca between them.
    let pin = lines(&block("pin"));
    for line in lines(&operate_block("pin-ca")) {
        assert!(pin.contains(&line), "life-cycle:pin lacks docs/operate.md's pin-ca line {line:?}");
    }
    let key = lines(&block("rotate-key"));
    // The Secret replaced as "Encryption at rest" says (its hash line is for the metrics, not used here).
    let change = lines(&operate_block("encryption-change")).into_iter().filter(|l| !l.starts_with("sha256sum"));
    for line in lines(&operate_block("encryption-wait")).into_iter().chain(change) {
        assert!(key.contains(&line), "life-cycle:rotate-key lacks docs/operate.md's line {line:?}");
    }
    let rotate = lines(&block("rotate-ca"));
    for line in lines(&operate_block("rotate-ca")) {
        assert!(rotate.contains(&line), "life-cycle:rotate-ca lacks docs/operate.md's rotate-ca line {line:?}");
    }
}

#[test]
fn installed_upgraded_rolled_back_and_uninstalled_as_the_docs_say() {
    in_namespace("installed_upgraded_rolled_back_and_uninstalled_as_the_docs_say", || {
        let doc = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
        let blocks = life_cycle_blocks(&doc);
        assert_eq!(blocks.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(), STEPS);
        let static_bin = common::static_binary();
        let cluster = Cluster::start_node_only();

        // A checkout of our own: deploy/ copied (the steps write into it), hack/ as it is.
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("cp").arg("-r").arg(repo().join("deploy")).arg(dir.path()).status().unwrap();
        assert!(status.success());
        std::os::unix::fs::symlink(repo().join("hack"), dir.path().join("hack")).unwrap();
        let old_cluster = !cluster.kubectl(&["get", "--raw", "/apis/batch/v1"]).contains("\"cronjobs\"");
        if old_cluster {
            let path = dir.path().join("deploy/backup/backup.yaml");
            let text = std::fs::read_to_string(&path).unwrap();
            let v1beta1 =
                text.replace("apiVersion: batch/v1\nkind: CronJob", "apiVersion: batch/v1beta1\nkind: CronJob");
            assert_ne!(v1beta1, text);
            std::fs::write(&path, v1beta1).unwrap();
        }
        let step = |name: &str| {
            let (_, script) = blocks.iter().find(|(s, _)| s == name).unwrap();
            let script = match old_cluster {
                true => script.replace(
                    JOB_FROM_CRONJOB,
                    "spec=\"$(kubectl -n podset-system get cronjob podset-backup -o jsonpath='{.spec.jobTemplate.spec}')\"
printf '{\"apiVersion\":\"batch/v1\",\"kind\":\"Job\",\"metadata\":{\"name\":\"podset-backup-before-rollback\",\"namespace\":\"podset-system\"},\"spec\":%s}' \"$spec\" | kubectl create -f -",
                ),
                false => script.clone(),
            };
            run_step(&cluster, dir.path(), &static_bin, name, &script)
        };
        let args = || server_pod_field(&cluster, "{.spec.containers[0].args}").unwrap();

        step("install");
        let (installed_pod, image) = server_pod(&cluster);
        assert_eq!(image, OLD_IMAGE);
        let version = cluster.kubectl(&["get", "--raw", "/version"]);
        assert!(cluster.kubectl(&["get", "--raw", "/apis/demo.k8s.io"]).contains("v1alpha1"), "{version}");
        assert!(cluster.kubectl_try(&["get", "--raw", "/apis/demo.k8s.io/v1beta1"]).is_err());
        let volume_of = |claim: &str| {
            let jsonpath = "jsonpath={.spec.volumeName}";
            cluster.kubectl(&["-n", "podset-system", "get", "pvc", claim, "-o", jsonpath])
        };
        let data_volume = volume_of("data-podset-apiserver-0");

        // Twice, as an admin may run it again: the same CA pinned, the component listed once.
        step("pin");
        step("pin");
        let kustomization = std::fs::read_to_string(dir.path().join("deploy/local/kustomization.yaml")).unwrap();
        assert_eq!(kustomization.matches("pinned-ca").count(), 1, "{kustomization}");
        let pinned = pinned_cas(&cluster);
        assert_eq!(pinned.len(), 1);

        let listed = step("use");
        assert!(listed.contains("web"), "{listed}");
        let before = web(&cluster);
        assert_eq!(before.1.split(' ').count(), 2, "{before:?}");
        healthy(&cluster, "use", &["v1alpha1"]);

        step("upgrade");
        let (upgraded_pod, image) = server_pod(&cluster);
        assert_eq!(image, NEW_IMAGE);
        assert_ne!(upgraded_pod, installed_pod, "the server's Pod was not replaced");
        for flag in ["--encryption-provider-config=", "--audit-policy-file=", "--tracing-config-file="] {
            assert!(args().contains(flag), "{flag} not on: {}", args());
        }
        let backup = std::fs::read_to_string(dir.path().join("podsets-backup.json")).unwrap();
        let backup: serde_json::Value = serde_json::from_str(&backup).unwrap();
        assert_eq!(backup["items"][0]["metadata"]["uid"].as_str(), Some(before.0.as_str()));

        // Twice in a row: the second run is a rotation of its own, from the CA the first one left.
        step("rotate-ca");
        let once = pinned_cas(&cluster);
        step("rotate-ca");
        assert_ne!(pinned_cas(&cluster), once, "the second rotation pinned a new CA");
        let rotated = pinned_cas(&cluster);
        assert_eq!(rotated.len(), 1);
        assert_ne!(rotated, pinned, "the CA pinned is the one from before the rotation");
        assert_eq!(server_pod(&cluster).0, upgraded_pod, "the rotation restarted the server");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the upgrade");
        healthy(&cluster, "rotate-ca", &["v1alpha1", "v1beta1"]);
        // The install checked as docs/install.md says: each replica's /readyz through kube-apiserver's pods proxy.
        let out = Command::new(&static_bin)
            .args(["check", "--kubeconfig"])
            .arg(&cluster.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("/readyz of Pod podset-system/podset-apiserver-0: ok"), "{text}");

        step("rotate-key");
        assert_eq!(server_pod(&cluster).0, upgraded_pod, "the key rotation restarted the server");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the key rotation");
        healthy(&cluster, "rotate-key", &["v1alpha1", "v1beta1"]);

        step("rollback");
        let (rolled_back_pod, image) = server_pod(&cluster);
        assert_eq!(image, OLD_IMAGE);
        assert_ne!(rolled_back_pod, upgraded_pod, "the server's Pod was not replaced");
        assert!(!args().contains("--encryption-provider-config"), "{}", args());
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the rollback");
        healthy(&cluster, "rollback", &["v1alpha1"]);
        assert!(cluster.kubectl_try(&["-n", "podset-system", "get", "service", "podset-apiserver-v1beta1"]).is_err());
        let backups = cluster.local_volume_dir(&volume_of("podset-backups"));
        let latest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(backups.join("latest.json")).unwrap()).unwrap();
        assert_eq!(latest["items"][0]["metadata"]["uid"].as_str(), Some(before.0.as_str()));

        let restored = step("restore");
        assert!(restored.contains("restored 1 PodSets"), "{restored}");
        assert_ne!(volume_of("data-podset-apiserver-0"), data_volume, "the server is back on its old volume");
        assert_ne!(pinned_cas(&cluster), rotated, "the CA made on the new volume is not pinned");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the restore");
        healthy(&cluster, "restore", &["v1alpha1"]);

        // What docs/operate.md adds: the metrics reader, bound to a Prometheus.
        cluster.kubectl(&["apply", "-f", repo().join("deploy/metrics-reader.yaml").to_str().unwrap()]);
        cluster.kubectl(&[
            "create",
            "clusterrolebinding",
            "prometheus-podset-metrics",
            "--clusterrole=podset-apiserver-metrics-reader",
            "--serviceaccount=monitoring:prometheus",
        ]);
        let rendered = made_by_deploy(&cluster, dir.path());
        assert!(rendered.len() > 20, "{rendered:?}");

        step("uninstall");
        // Nothing the manifests make is left, but the namespace and the backups' claim, which stays bound.
        for (kind, namespace, name) in &rendered {
            let kept = (kind == "Namespace" && name == "podset-system")
                || (kind == "PersistentVolumeClaim" && name == "podset-backups");
            let mut args = vec!["get", kind.as_str(), name.as_str(), "-o", "name"];
            if let Some(ns) = namespace {
                args.extend(["-n", ns.as_str()]);
            }
            match (kept, cluster.kubectl_try(&args)) {
                (true, Ok(_)) => {}
                (false, Err(e)) if e.contains("NotFound") => {}
                (kept, found) => panic!("{kind} {namespace:?}/{name}: kept {kept}, found {found:?}"),
            }
        }
        let claim =
            cluster.kubectl(&["-n", "podset-system", "get", "pvc", "podset-backups", "-o", "jsonpath={.status.phase}"]);
        assert_eq!(claim, "Bound");
        assert!(backups.join("latest.json").exists(), "the backups are gone");
        // And nothing the server made at run time, nor any cluster-scoped object of ours by another way.
        let left = cluster.kubectl(&[
            "-n",
            "podset-system",
            "get",
            "pods,services,statefulsets,deployments,pvc,serviceaccounts,roles,rolebindings,leases,cronjobs,jobs",
            "-o",
            "name",
        ]);
        let left: Vec<&str> = left.lines().filter(|l| *l != "serviceaccount/default").collect();
        assert_eq!(left, ["persistentvolumeclaim/podset-backups"]);
        let cluster_wide = cluster.kubectl(&["get", "clusterroles,clusterrolebindings,apiservices", "-o", "name"]);
        let ours: Vec<&str> =
            cluster_wide.lines().filter(|l| l.contains("podset") || l.contains("demo.k8s.io")).collect();
        assert!(ours.is_empty(), "{ours:?}");
        // Foreground deletion returned only once the Pods were gone.
        assert_eq!(cluster.kubectl(&["get", "pods", "-A", "-l", "app=web", "-o", "name"]), "");
    });
}
