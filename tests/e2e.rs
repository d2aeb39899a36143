//! End to end through kube-apiserver's aggregator: real etcd, kube-apiserver, kube-controller-manager and kubectl 1.37.
//! Each test runs in its own network and PID namespace (see `common::cluster`).

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use futures::{StreamExt, TryStreamExt};
use http::Request;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use podset_envtest::{Cluster, Credential};
use serde_json::json;

const WEB: &str = "apiVersion: demo.k8s.io/v1alpha1
kind: PodSet
metadata:
  name: web
spec:
  replicas: 2
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - {name: main, image: busybox, command: [sleep, '3600']}
";

#[test]
fn kubectl_through_the_aggregator() {
    in_namespace("kubectl_through_the_aggregator", || {
        let c = common::cluster::start();
        let out = c.kubectl(&["api-resources", "--api-group=demo.k8s.io"]);
        let line = out.lines().find(|l| l.starts_with("podsets")).unwrap_or_else(|| panic!("{out}"));
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            vec!["podsets", "ps", "demo.k8s.io/v1beta1", "true", "PodSet"],
            "the preferred version"
        );

        // A watch opened before the changes sees all of them.
        let (mut watch, rx) =
            common::spawn_lines(c.kubectl_command(&["get", "ps", "--watch", "--output-watch-events"]));
        std::thread::sleep(Duration::from_secs(2));

        // The same manifest in each version, applied, scaled, patched and deleted alike.
        let beta = WEB
            .replace("v1alpha1", "v1beta1")
            .replace("  replicas: 2\n", "  replicas: 2\n  selector:\n    matchLabels: {app: web}\n");
        for manifest in [WEB, beta.as_str()] {
            assert!(c.apply_text("web.yaml", manifest).contains("podset.demo.k8s.io/web created"), "{manifest}");
            assert!(c.apply_text("web.yaml", &manifest.replace("replicas: 2", "replicas: 3")).contains("configured"));
            let table = c.kubectl(&["get", "ps"]);
            let mut lines = table.lines();
            assert_eq!(
                lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
                vec!["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
            );
            assert_eq!(lines.next().unwrap().split_whitespace().take(2).collect::<Vec<_>>(), vec!["web", "3"]);
            assert!(c.kubectl(&["scale", "ps", "web", "--replicas=5"]).contains("scaled"));
            assert_eq!(c.kubectl(&["get", "ps", "web", "-o", "jsonpath={.spec.replicas}"]), "5");
            c.kubectl(&["patch", "ps", "web", "--type=merge", "-p", r#"{"spec":{"replicas":4}}"#]);
            assert_eq!(c.kubectl(&["get", "ps", "web", "-o", "jsonpath={.spec.replicas}"]), "4");
            assert!(c.kubectl(&["delete", "ps", "web"]).contains("deleted"));
        }
        let explain = c.kubectl(&["explain", "podsets.spec.replicas"]);
        assert!(explain.contains("Defaults to 1"), "{explain}");

        let mut events = Vec::new();
        while events.iter().filter(|e: &&String| e.starts_with("DELETED")).count() < 2 {
            let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("watch saw only {events:?}"));
            if !line.starts_with("EVENT") {
                events.push(line);
            }
        }
        let _ = watch.kill();
        let _ = watch.wait();
        let kinds: Vec<&str> = events.iter().map(|e| e.split_whitespace().next().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"ADDED"), "{events:?}");
        assert_eq!(kinds.iter().filter(|k| **k == "ADDED").count(), 2, "{events:?}");
        assert!(kinds.contains(&"MODIFIED"), "{events:?}");

        // The requests reached us on the front proxy's certificate, naming the real caller.
        let log = c.podset_log();
        assert!(log.contains(r#""method":"POST""#) && log.contains(r#""user":"admin""#), "{log}");

        // On the same cluster (a control plane of its own would cost more than the checks): the last, as it
        // takes the server out.
        check_passes_then_names_what_failed(&c);
    });
}

/// Fails unless `out` holds every one of `lines`.
fn says(out: &str, lines: &[&str]) {
    for line in lines {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// `podset-apiserver check`, the real binary against this install.
fn check_passes_then_names_what_failed(c: &Cluster) {
    let started = std::time::Instant::now();
    let check = |c: &Cluster| {
        let out = std::process::Command::new(common::BIN)
            .args(["check", "--kubeconfig"])
            .arg(&c.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, out) = check(c);
    assert_eq!(code, Some(0), "{out}");
    says(
        &out,
        &[
            "APIService v1beta1.demo.k8s.io Available: ok",
            "APIService v1alpha1.demo.k8s.io Available: ok",
            "discovery of demo.k8s.io: ok",
            "discovery of demo.k8s.io/v1beta1: ok",
            "discovery of demo.k8s.io/v1alpha1: ok",
            "dry-run create of a demo.k8s.io/v1beta1 PodSet in default: ok",
            "dry-run create of a demo.k8s.io/v1alpha1 PodSet in default: ok",
            // The harness's replicas are processes, not Pods: readiness as the Endpoints list it.
            "(in the Endpoints of podset-system/podset-apiserver): ok (listed ready;",
        ],
    );
    assert!(!out.contains("FAILED"), "{out}");
    eprintln!("podset-apiserver check, passing:\n{out}");

    // The replica out of the Endpoints, as a failing readiness probe takes it: the aggregator marks the APIServices
    // unavailable, and the check says so, and why.
    c.set_ready_replicas(&[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while c.apiservice_available() {
        assert!(std::time::Instant::now() < deadline, "the APIServices stayed Available");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (code, out) = check(c);
    assert_eq!(code, Some(1), "{out}");
    says(
        &out,
        &[
            "APIService v1beta1.demo.k8s.io Available: FAILED: Available=False: MissingEndpoints",
            "discovery of demo.k8s.io/v1beta1: FAILED",
            "dry-run create of a demo.k8s.io/v1beta1 PodSet in default: FAILED",
            "(in the Endpoints of podset-system/podset-apiserver): FAILED: listed not ready",
            "checks failed",
        ],
    );
    assert!(!out.contains("kube_client"), "the client's own log repeats what the checks say:\n{out}");
    eprintln!("podset-apiserver check, failing:\n{out}\nboth in {:.1}s", started.elapsed().as_secs_f64());

    // `--wait`, started while the replica is out: it checks again until the replica is back and the aggregator
    // finds it, then passes.
    let waiting = std::process::Command::new(common::BIN)
        .args(["check", "--wait", "60s", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    c.set_ready_replicas(&[0]);
    let done = waiting.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&done.stdout).into_owned() + &String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(0), "{out}");
    says(&out, &["checks failed; checking again", "APIService v1beta1.demo.k8s.io Available: ok"]);
}

#[test]
fn kube_rs_watch_resumes_and_forged_identity_is_refused() {
    in_namespace("kube_rs_watch_resumes_and_forged_identity_is_refused", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let api: Api<PodSet> = Api::namespaced(client.clone(), "default");
            let a = api
                .create(&PostParams::default(), &serde_json::from_value(common::podset("a", 1)).unwrap())
                .await
                .unwrap();
            let rv = a.metadata.resource_version.unwrap();
            api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
            api.create(&PostParams::default(), &serde_json::from_value(common::podset("b", 1)).unwrap()).await.unwrap();
            // Events after `rv` replay in order (the controller's status writes may come in between).
            let mut stream = api.watch(&WatchParams::default().timeout(20), &rv).await.unwrap().boxed();
            let mut seen = Vec::new();
            while !seen.contains(&("ADDED", "b".to_owned())) {
                match stream.try_next().await.unwrap().expect("watch ended") {
                    WatchEvent::Added(p) => seen.push(("ADDED", p.metadata.name.unwrap())),
                    WatchEvent::Modified(p) => seen.push(("MODIFIED", p.metadata.name.unwrap())),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(seen[0], ("MODIFIED", "a".to_owned()), "{seen:?}");

            // Straight at our Service address, claiming to be an admin without the front proxy's certificate.
            let direct = c.podset_client(Credential::None);
            let req = Request::get(common::PODSETS)
                .header("X-Remote-User", "admin")
                .header("X-Remote-Group", "system:masters");
            let (status, _, _) = common::raw(&direct, req.body(vec![]).unwrap()).await;
            assert_eq!(status, 401);
        });
    });
}

#[test]
fn garbage_collector_and_namespace_deletion_reach_podsets() {
    in_namespace("garbage_collector_and_namespace_deletion_reach_podsets", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
            podsets
                .create(&PostParams::default(), &serde_json::from_value(common::podset("owner", 1)).unwrap())
                .await
                .unwrap();
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            // The controller makes the Pod, owned through a controller reference...
            let owned_by = |p: &Pod| p.metadata.owner_references.iter().flatten().any(|r| r.name == "owner");
            wait(
                Duration::from_secs(60),
                || async { pods.list(&Default::default()).await.unwrap().items.iter().any(owned_by) },
                "the controller to create the Pod",
            )
            .await;
            let items = pods.list(&Default::default()).await.unwrap().items;
            let owned = items.iter().find(|p| owned_by(p)).unwrap().metadata.name.clone().unwrap();
            // ...which the garbage collector keeps while its owner exists...
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert!(pods.get_opt(&owned).await.unwrap().is_some(), "GC deleted a Pod whose owner exists");
            // ...and deletes once the owner is gone.
            podsets.delete("owner", &DeleteParams::default()).await.unwrap();
            wait(
                Duration::from_secs(90),
                || async { pods.get_opt(&owned).await.unwrap().is_none() },
                "GC to delete the owned Pod",
            )
            .await;

            // Foreground deletion: the PodSet waits, finalized, until the collector has removed its Pods.
            podsets
                .create(&PostParams::default(), &serde_json::from_value(common::podset("fg", 2)).unwrap())
                .await
                .unwrap();
            let owned_by_fg = |p: &Pod| p.metadata.owner_references.iter().flatten().any(|r| r.name == "fg");
            let count_fg = || async {
                pods.list(&Default::default()).await.unwrap().items.iter().filter(|p| owned_by_fg(p)).count()
            };
            wait(Duration::from_secs(60), || async { count_fg().await == 2 }, "2 pods of fg").await;
            podsets.delete("fg", &DeleteParams::foreground()).await.unwrap();
            let fg = podsets.get_opt("fg").await.unwrap();
            assert!(
                fg.is_none()
                    || fg.unwrap().metadata.finalizers.unwrap_or_default().contains(&"foregroundDeletion".to_owned())
            );
            wait(
                Duration::from_secs(90),
                || async { podsets.get_opt("fg").await.unwrap().is_none() && count_fg().await == 0 },
                "foreground deletion of fg and its pods",
            )
            .await;

            // Deleting a namespace deletes the PodSets in it.
            c.kubectl(&["create", "namespace", "doomed"]);
            let doomed: Api<PodSet> = Api::namespaced(client.clone(), "doomed");
            doomed
                .create(&PostParams::default(), &serde_json::from_value(common::podset("x", 1)).unwrap())
                .await
                .unwrap();
            c.kubectl(&["delete", "namespace", "doomed", "--wait=false"]);
            wait(
                Duration::from_secs(90),
                || async { c.kubectl_try(&["get", "namespace", "doomed"]).is_err() },
                "namespace deletion",
            )
            .await;
            let direct_list = podsets_in(&c, "doomed").await;
            assert_eq!(direct_list, 0, "PodSets left in a deleted namespace");
        });
    });
}

async fn podsets_in(c: &Cluster, ns: &str) -> usize {
    let api: Api<PodSet> = Api::namespaced(c.client().await, ns);
    api.list(&Default::default()).await.unwrap().items.len()
}
