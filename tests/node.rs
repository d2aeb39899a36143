//! On a real node (envtest's: containerd, runc, CNI bridge, kubelet, kube-scheduler, kube-proxy): what only a
//! kubelet shows. PodSet Pods run the demo workload (images/src/bin/podset-demo.rs) and become Ready by their
//! readiness probe, and status counts them; a container that exits is restarted in its Pod; a Pod that fails or
//! succeeds (restartPolicy Never) is replaced and left in place, as a ReplicaSet does. And podset-apiserver
//! deployed as an admin deploys it: its image imported into containerd, `kubectl apply -k
//! deploy/overlays/self-signed`, Ready by its own probes, Available through its Service, and back with every
//! PodSet after its Pod is deleted.
//!
//! PodSet has no `minReadySeconds`: a Pod counts as available as soon as it is Ready.

mod common;

use common::cluster::{self, in_namespace, runtime, wait};
use common::node::{demo_template, http_get, phase, pod_ip, ready, POD_WAIT};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use podset_apiserver::api::PodSet;
use podset_envtest::{node, Cluster};
use serde_json::json;

/// The demo workload, Ready two seconds after it starts, restarted by `restart_policy`.
fn template(image: &str, app: &str, restart_policy: &str) -> serde_json::Value {
    let mut t = demo_template(image, app, 2);
    t["spec"]["restartPolicy"] = json!(restart_policy);
    t
}

fn podset(name: &str, replicas: i32, template: serde_json::Value) -> PodSet {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"replicas": replicas, "template": template}}))
        .unwrap()
}

async fn pods_of(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap().items
}

/// The Pods of `app` that are Running and Ready, once there are exactly `n` of them and no other live one.
async fn wait_running_ready(pods: &Api<Pod>, app: &str, n: usize) -> Vec<Pod> {
    let live = || async {
        let all = pods_of(pods, app).await;
        all.into_iter().filter(|p| !matches!(phase(p), "Failed" | "Succeeded")).collect::<Vec<_>>()
    };
    let what = format!("{n} Pods of {app} Running and Ready");
    wait(
        POD_WAIT,
        || async {
            live().await.iter().filter(|p| phase(p) == "Running" && ready(p)).count() == n && live().await.len() == n
        },
        &what,
    )
    .await;
    live().await
}

async fn wait_status(podsets: &Api<PodSet>, name: &str, replicas: i32, ready: i32) {
    wait(
        POD_WAIT,
        || async {
            let s = podsets.get_status(name).await.unwrap().status.unwrap_or_default();
            s.replicas == replicas && s.ready_replicas == ready && s.available_replicas == ready
        },
        &format!("{name}: status replicas {replicas}, readyReplicas and availableReplicas {ready}"),
    )
    .await;
}

/// Creates PodSet `name` of `replicas` demo Pods (restartPolicy `restart_policy`) in `default`, and waits until
/// they are Running and Ready and the PodSet counts them: the PodSets' API, the Pods' API, and the Pods.
async fn running_podset(
    cluster: &Cluster,
    name: &str,
    replicas: i32,
    restart_policy: &str,
) -> (Api<PodSet>, Api<Pod>, Vec<Pod>) {
    let client = cluster.client().await;
    let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let ps = podset(name, replicas, template(cluster.demo_image(), name, restart_policy));
    podsets.create(&PostParams::default(), &ps).await.unwrap();
    let running = wait_running_ready(&pods, name, replicas as usize).await;
    wait_status(&podsets, name, replicas, replicas).await;
    (podsets, pods, running)
}

#[test]
fn podset_pods_run_become_ready_and_are_counted() {
    in_namespace("podset_pods_run_become_ready_and_are_counted", || {
        let cluster = cluster::start_with_node();
        runtime().block_on(async {
            let (podsets, _, running) = running_podset(&cluster, "web", 3, "Always").await;
            for p in &running {
                assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some(node::NODE_NAME));
                assert!(pod_ip(p).starts_with("10.244.0."), "{:?}", p.status);
                assert_eq!(http_get(&pod_ip(p), "/readyz").0, 200);
            }
            let mut names: Vec<String> = running.iter().map(|p| p.name_any()).collect();
            names.sort();
            assert_eq!(podsets.get_status("web").await.unwrap().status.unwrap().pod_names, names);
            // What an admin sees: READY 3 of DESIRED 3.
            let row = cluster.kubectl(&["get", "podsets", "web", "--no-headers"]);
            let columns: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(&columns[..4], ["web", "3", "3", "3"], "NAME DESIRED CURRENT READY: {row}");
        });
    });
}

#[test]
fn container_that_exits_restarts_in_its_pod() {
    in_namespace("container_that_exits_restarts_in_its_pod", || {
        let cluster = cluster::start_with_node();
        runtime().block_on(async {
            let (podsets, pods, mut running) = running_podset(&cluster, "restarts", 1, "Always").await;
            let before = running.remove(0);

            assert_eq!(http_get(&pod_ip(&before), "/exit?code=7"), (200, "exiting with 7".to_owned()));
            wait(
                POD_WAIT,
                || async {
                    let p = pods.get(&before.name_any()).await.unwrap();
                    let c = &p.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
                    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
                    c.restart_count == 1 && last == Some(7) && ready(&p)
                },
                "the container restarted once, after exiting with 7, and Ready again",
            )
            .await;
            // The same Pod: no replacement, and the PodSet counts it ready again.
            let after = wait_running_ready(&pods, "restarts", 1).await.remove(0);
            assert_eq!(after.uid(), before.uid());
            wait_status(&podsets, "restarts", 1, 1).await;
        });
    });
}

#[test]
fn failed_and_succeeded_pods_are_replaced_and_kept_as_a_replicaset_does() {
    in_namespace("failed_and_succeeded_pods_are_replaced_and_kept_as_a_replicaset_does", || {
        let cluster = cluster::start_with_node();
        runtime().block_on(async {
            let (podsets, pods, first) = running_podset(&cluster, "once", 2, "Never").await;

            // One fails (exit 1), one succeeds (exit 0); with restartPolicy Never neither comes back.
            assert_eq!(http_get(&pod_ip(&first[0]), "/exit?code=1").0, 200);
            assert_eq!(http_get(&pod_ip(&first[1]), "/exit?code=0").0, 200);
            let replacements = wait(
                POD_WAIT,
                || async {
                    let all = pods_of(&pods, "once").await;
                    let phase_of = |of: &Pod| all.iter().find(|p| p.uid() == of.uid()).map(|p| phase(p).to_owned());
                    phase_of(&first[0]).as_deref() == Some("Failed")
                        && phase_of(&first[1]).as_deref() == Some("Succeeded")
                },
                "the Pods Failed and Succeeded",
            );
            replacements.await;
            let now = wait_running_ready(&pods, "once", 2).await;
            let old: Vec<_> = first.iter().map(|p| p.uid()).collect();
            assert!(
                now.iter().all(|p| !old.contains(&p.uid())),
                "not replaced: {:?}",
                now.iter().map(|p| p.name_any())
            );
            wait_status(&podsets, "once", 2, 2).await;
            let mut names: Vec<String> = now.iter().map(|p| p.name_any()).collect();
            names.sort();
            assert_eq!(podsets.get_status("once").await.unwrap().status.unwrap().pod_names, names);
            // Kept for their logs and exit codes, as kube-controller-manager leaves a ReplicaSet's.
            assert_eq!(pods_of(&pods, "once").await.len(), 4);
        });
    });
}

/// What `kubectl get pods -l app=<app>` shows as READY (`1/1`) for every Pod, and their count.
fn kubectl_ready_pods(cluster: &Cluster, app: &str) -> (usize, usize) {
    let out = cluster.kubectl(&["get", "pods", "-l", &format!("app={app}"), "--no-headers"]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    let running_ready = rows.iter().filter(|r| r.get(1) == Some(&"1/1") && r.get(2) == Some(&"Running")).count();
    (rows.len(), running_ready)
}

#[test]
fn deployed_as_an_admin_does_it_serves_and_comes_back_with_its_podsets() {
    in_namespace("deployed_as_an_admin_does_it_serves_and_comes_back_with_its_podsets", || {
        let cluster = Cluster::start_node_only();
        let archive = node::build_image("podset-apiserver", "static-test");
        let image = cluster.import_image(&archive);
        let (name, tag) = image.rsplit_once(':').unwrap();
        let dir = cluster.dir.path();

        // The overlay as docs/install.md says to use it, with the image set. kustomize takes only relative paths.
        let kustomize = dir.join("kustomize");
        std::fs::create_dir(&kustomize).unwrap();
        let up = "../".repeat(kustomize.components().count() - 1);
        let overlay = format!("{up}{}/deploy/overlays/self-signed", env!("CARGO_MANIFEST_DIR").trim_start_matches('/'));
        std::fs::write(
            kustomize.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\nimages:\n- {{name: podset-apiserver, newName: {name}, newTag: {tag}}}\n",
                overlay
            ),
        )
        .unwrap();
        cluster.kubectl(&["apply", "-k", kustomize.to_str().unwrap()]);

        let server_ready = |c: &Cluster| {
            cluster::server_pod_field(c, "{.status.conditions[?(@.type==\"Ready\")].status}").is_ok_and(|s| s == "True")
        };
        let available = |c: &Cluster| c.apiservice_available() && c.kubectl_try(&["get", "podsets", "-A"]).is_ok();
        cluster.wait_for("podset-apiserver-0 Ready by its probes", POD_WAIT, server_ready);
        cluster.wait_for("the APIService Available through the Service", POD_WAIT, available);
        let version = cluster.kubectl(&["get", "--raw", "/apis/demo.k8s.io/v1alpha1"]);
        assert!(version.contains("podsets"), "{version}");
        let uid = cluster::server_pod_field(&cluster, "{.metadata.uid}").unwrap();

        let ps = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"replicas": 3, "template": template(cluster.demo_image(), "web", "Always")}});
        cluster.apply_text("web.yaml", &serde_json::to_string(&ps).unwrap());
        let ready_3 = |c: &Cluster| {
            c.kubectl_try(&["get", "podsets", "web", "--no-headers"])
                .is_ok_and(|row| row.split_whitespace().nth(3) == Some("3"))
                && kubectl_ready_pods(c, "web") == (3, 3)
        };
        cluster.wait_for("PodSet web: READY 3, its 3 Pods Running 1/1", POD_WAIT, ready_3);

        // A Pod deleted is replaced.
        let victim = cluster.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"]);
        cluster.kubectl(&["delete", "pod", &victim, "--wait=true"]);
        cluster.wait_for("a new Pod in place of the deleted one", POD_WAIT, |c| {
            ready_3(c) && !c.kubectl(&["get", "pods", "-l", "app=web", "-o", "name"]).contains(&victim)
        });
        let pods_before = cluster.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.uid}"]);
        let podset_uid = cluster.kubectl(&["get", "podsets", "web", "-o", "jsonpath={.metadata.uid}"]);

        // The server's Pod deleted: the StatefulSet makes it again on the same volume, and the PodSet is still there.
        cluster.kubectl(&["delete", "pod", "podset-apiserver-0", "-n", "podset-system", "--wait=true"]);
        cluster.wait_for("podset-apiserver-0 back and Ready", POD_WAIT, |c| {
            server_ready(c) && cluster::server_pod_field(c, "{.metadata.uid}").is_ok_and(|u| u != uid)
        });
        cluster.wait_for("the APIService Available again", POD_WAIT, available);
        assert_eq!(cluster.kubectl(&["get", "podsets", "web", "-o", "jsonpath={.metadata.uid}"]), podset_uid);
        cluster.wait_for("PodSet web still READY 3", POD_WAIT, ready_3);
        let pods_after = cluster.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.uid}"]);
        assert_eq!(pods_after, pods_before, "the Pods were replaced across the server's restart");
    });
}
