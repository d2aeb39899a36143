//! docs/install.md's life cycle on the local cluster, run as written: its `sh life-cycle:<step>` blocks, in a shell
//! as `hack/local-cluster.sh --no-podset-apiserver` opens it (the same cluster, the same environment), from a
//! copy of the checkout's deploy/ (the blocks write an overlay of their own there). Between the steps, the test
//! checks what the docs promise: the server runs the image named, PodSets keep their uids and their Pods across the
//! upgrade and the rollback, and after the uninstall nothing of ours is left but the namespace holding the backups'
//! claim.
//!
//! The image is packed from the tests' static build (`PODSET_STATIC_BIN`, hack/build-image.sh's own switch) rather
//! than the release build the docs' command makes: the same files, minutes sooner.

mod common;

use std::path::Path;

use serde::Deserialize;
use std::process::Command;

use common::cluster::{in_namespace, server_pod_field};
use podset_envtest::Cluster;

const STEPS: [&str; 5] = ["install", "use", "upgrade", "rollback", "uninstall"];

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

/// The CAs (DER) both APIServices pin, which must be the same, without `insecureSkipTLSVerify`.
fn pinned_cas(cluster: &Cluster) -> Vec<Vec<u8>> {
    use base64::Engine;
    use rustls::pki_types::pem::PemObject;
    let mut pinned = Vec::new();
    for name in ["v1alpha1.demo.k8s.io", "v1beta1.demo.k8s.io"] {
        let spec = cluster.kubectl(&["get", "apiservice", name, "-o", "jsonpath={.spec}"]);
        let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
        assert!(spec.get("insecureSkipTLSVerify").is_none(), "{name}: {spec}");
        let pem = base64::engine::general_purpose::STANDARD.decode(spec["caBundle"].as_str().unwrap()).unwrap();
        let cas: Vec<Vec<u8>> =
            rustls::pki_types::CertificateDer::pem_slice_iter(&pem).map(|c| c.unwrap().to_vec()).collect();
        pinned.push(cas);
    }
    assert_eq!(pinned[0], pinned[1], "the APIServices pin different CAs");
    pinned.remove(0)
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
    eprintln!("--- life-cycle:{step}\n{script}");
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .envs(cluster.shell_env())
        .env("HOME", dir)
        .env("PODSET_STATIC_BIN", static_bin)
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
    let uid = cluster.kubectl(&["get", "podset", "web", "-o", "jsonpath={.metadata.uid}"]);
    let pods = cluster.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.uid}"]);
    let mut pods: Vec<&str> = pods.split_whitespace().collect();
    pods.sort();
    (uid, pods.join(" "))
}

/// deploy/backup/ as docs/operate.md uses it, on the installed server: the CronJob's Job backs up to a volume of
/// its own, the data volume is lost, restore.yaml's Job restores the newest backup into a new one, and the server
/// comes back with the same PodSet and the same Pods.
fn backup_by_cronjob_and_restore_by_job(
    cluster: &Cluster,
    before: &(String, String),
    pin: impl Fn(),
) -> std::path::PathBuf {
    // The only free volume, so the backups' claim takes it (the spare one comes once the claim is bound).
    let backups = cluster.add_local_volume("backups");
    // The image as installed; on 1.20 (no batch/v1 CronJob before 1.21) the CronJob as batch/v1beta1.
    let old_cluster = !cluster.kubectl(&["get", "--raw", "/apis/batch/v1"]).contains("\"cronjobs\"");
    let manifest = |file: &str| {
        let text = std::fs::read_to_string(repo().join("deploy/backup").join(file)).unwrap();
        let text = text.replace("image: podset-apiserver:latest", "image: podset-apiserver:v0.1.0-a");
        if old_cluster {
            text.replace("apiVersion: batch/v1\nkind: CronJob", "apiVersion: batch/v1beta1\nkind: CronJob")
        } else {
            text
        }
    };
    cluster.apply_text("backup.yaml", &manifest("backup.yaml"));
    // What `kubectl create job --from=cronjob/podset-backup podset-backup-now` makes.
    let cronjob: serde_json::Value = serde_json::from_str(&cluster.kubectl(&[
        "-n",
        "podset-system",
        "get",
        "cronjob",
        "podset-backup",
        "-o",
        "json",
    ]))
    .unwrap();
    let job = serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "podset-backup-now", "namespace": "podset-system",
                     "annotations": {"cronjob.kubernetes.io/instantiate": "manual"}},
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    });
    cluster.apply_text("backup-now.json", &job.to_string());
    let complete = |job: &str| {
        cluster.kubectl(&["-n", "podset-system", "wait", "--for=condition=Complete", job, "--timeout=300s"]);
        cluster.kubectl(&["-n", "podset-system", "logs", job])
    };
    let log = complete("job/podset-backup-now");
    assert!(log.contains("backed up 1 PodSets to /backups/podsets-"), "{log}");
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(backups.join("latest.json")).unwrap()).unwrap();
    assert_eq!(latest["items"][0]["metadata"]["uid"].as_str(), Some(before.0.as_str()));

    // The data volume lost, with the server stopped; a new one for the restore's claim.
    cluster.add_local_volume("spare");
    cluster.kubectl(&["-n", "podset-system", "scale", "statefulset/podset-apiserver", "--replicas=0"]);
    cluster.kubectl(&["-n", "podset-system", "wait", "--for=delete", "pod/podset-apiserver-0", "--timeout=120s"]);
    cluster.kubectl(&["-n", "podset-system", "delete", "pvc", "data-podset-apiserver-0", "--wait=true"]);
    cluster.apply_text("restore.yaml", &manifest("restore.yaml"));
    let log = complete("job/podset-restore");
    assert!(log.contains("restored 1 PodSets"), "{log}");
    cluster.kubectl(&["-n", "podset-system", "scale", "statefulset/podset-apiserver", "--replicas=1"]);
    cluster.kubectl(&["-n", "podset-system", "rollout", "status", "statefulset/podset-apiserver", "--timeout=300s"]);
    let claim = cluster.kubectl(&[
        "-n",
        "podset-system",
        "get",
        "pvc",
        "data-podset-apiserver-0",
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    assert_ne!(claim, "podset-apiserver-data", "the server is back on its old volume");
    // A new volume, a new CA: pinned again.
    pin();
    cluster.wait_for("the PodSet served again, Ready", std::time::Duration::from_secs(180), |c| {
        c.kubectl_try(&["wait", "--for=condition=Ready", "podset/web", "--timeout=5s"]).is_ok()
    });
    assert_eq!(&web(cluster), before, "the PodSet or its Pods changed across the restore");
    backups
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
        let step = |i: usize| run_step(&cluster, dir.path(), &static_bin, &blocks[i].0, &blocks[i].1);

        step(0);
        let (first_pod, image) = server_pod(&cluster);
        assert_eq!(image, "podset-apiserver:v0.1.0-a");
        assert!(cluster.kubectl(&["get", "--raw", "/apis/demo.k8s.io/v1alpha1"]).contains("\"podsets\""));

        let listed = step(1);
        assert!(listed.contains("web"), "{listed}");
        let before = web(&cluster);
        assert_eq!(before.1.split(' ').count(), 2, "{before:?}");

        step(2);
        let (upgraded_pod, image) = server_pod(&cluster);
        assert_eq!(image, "podset-apiserver:v0.1.0-b");
        assert_ne!(upgraded_pod, first_pod, "the server's Pod was not replaced");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the upgrade");
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
        // docs/operate.md: the CA pinned (pinned-ca listed in the overlay, as an admin lists it), then rotated.
        let overlay = dir.path().join("deploy/overlays/self-signed/kustomization.yaml");
        let text = std::fs::read_to_string(&overlay).unwrap();
        let own = "- ../../components/self-signed\n";
        assert!(text.contains(own), "{text}");
        std::fs::write(&overlay, text.replace(own, &format!("{own}- ../../components/pinned-ca\n"))).unwrap();
        let pin = || drop(run_step(&cluster, dir.path(), &static_bin, "pin-ca", &operate_block("pin-ca")));
        pin();
        let pinned = pinned_cas(&cluster);
        assert_eq!(pinned.len(), 1);
        run_step(&cluster, dir.path(), &static_bin, "rotate-ca", &operate_block("rotate-ca"));
        let rotated = pinned_cas(&cluster);
        assert_eq!(rotated.len(), 1);
        assert_ne!(rotated, pinned, "the CA pinned is the one from before the rotation");
        // kube-apiserver's proxy verifies the certificate served against the CA pinned now.
        // Available is the availability controller's, which skips verifying; the proxy route is updated apart.
        for version in ["v1alpha1", "v1beta1"] {
            let get = ["get", &format!("podsets.{version}.demo.k8s.io"), "web", "-o", "name"];
            let started = std::time::Instant::now();
            let listed = loop {
                match cluster.kubectl_try(&get) {
                    Ok(listed) => break listed,
                    Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => {
                        let logs = cluster.kubectl_try(&["-n", "podset-system", "logs", "podset-apiserver-0"]);
                        panic!("{version} after the rotation: {e}\n{}", logs.unwrap_or_else(|e| e))
                    }
                    Err(e) => eprintln!("{version} after the rotation, {:?}: {e}", started.elapsed()),
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            };
            assert_eq!(listed.trim(), "podset.demo.k8s.io/web");
        }
        assert_eq!(server_pod(&cluster).0, upgraded_pod, "the rotation restarted the server");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the rotation");

        let backup = std::fs::read_to_string(dir.path().join("podsets-backup.json")).unwrap();
        let backup: serde_json::Value = serde_json::from_str(&backup).unwrap();
        assert_eq!(backup["items"][0]["metadata"]["uid"].as_str(), Some(before.0.as_str()));

        step(3);
        let (rolled_back_pod, image) = server_pod(&cluster);
        assert_eq!(image, "podset-apiserver:v0.1.0-a");
        assert_ne!(rolled_back_pod, upgraded_pod, "the server's Pod was not replaced");
        assert_eq!(web(&cluster), before, "the PodSet or its Pods changed across the rollback");

        let backups = backup_by_cronjob_and_restore_by_job(&cluster, &before, pin);

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

        step(4);
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
