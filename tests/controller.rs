//! The embedded controller against a real control plane (no kubelet: Pods stay Pending unless a test sets their
//! status through `pods/status`, as a kubelet would).

mod common;

use std::time::Duration;

use common::cluster::{eventually, in_namespace, runtime};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use podset_apiserver::api::PodSet;
use podset_envtest::Credential;
use serde_json::json;

fn podset(name: &str, replicas: i32, image: &str) -> PodSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": image}]}
            }
        }
    }))
    .unwrap()
}

/// Live (not terminating, Pending or Running) Pods controlled by `owner`.
async fn live_pods(pods: &Api<Pod>, owner: &PodSet) -> Vec<Pod> {
    let uid = owner.uid().unwrap();
    let mut out: Vec<Pod> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.owner_references().iter().any(|r| r.uid == uid && r.controller == Some(true)))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), None | Some("Pending") | Some("Running"))
        })
        .collect();
    out.sort_by_key(|p| p.name_any());
    out
}

#[test]
fn controller_keeps_replicas_and_reports_status() {
    in_namespace("controller_keeps_replicas_and_reports_status", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let ps = podsets.create(&PostParams::default(), &podset("web", 3, "busybox")).await.unwrap();

            eventually("3 pods", || async { live_pods(&pods, &ps).await.len() == 3 }).await;
            let created = live_pods(&pods, &ps).await;
            for p in &created {
                assert_eq!(p.labels().get("app").map(String::as_str), Some("web"));
                assert!(p.name_any().starts_with("web-"));
                let r = &p.owner_references()[0];
                assert_eq!((r.kind.as_str(), r.name.as_str(), r.block_owner_deletion), ("PodSet", "web", Some(true)));
            }
            let names: Vec<String> = created.iter().map(|p| p.name_any()).collect();
            eventually("status to list the pods", || async {
                let s = podsets.get("web").await.unwrap().status.unwrap_or_default();
                s.pod_names == names && s.replicas == 3 && s.observed_generation == Some(1)
            })
            .await;

            c.kubectl(&["scale", "ps", "web", "--replicas=10"]);
            eventually("10 pods", || async { live_pods(&pods, &ps).await.len() == 10 }).await;
            c.kubectl(&["scale", "ps", "web", "--replicas=2"]);
            eventually("2 pods", || async { live_pods(&pods, &ps).await.len() == 2 }).await;
            // Stays at 2: no extra creates once the deletes are seen.
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(live_pods(&pods, &ps).await.len(), 2);

            // A Pod deleted by hand is replaced.
            let victim = live_pods(&pods, &ps).await[0].name_any();
            pods.delete(&victim, &DeleteParams::default()).await.unwrap();
            eventually("a replacement", || async {
                let live = live_pods(&pods, &ps).await;
                live.len() == 2 && live.iter().all(|p| p.name_any() != victim)
            })
            .await;

            // A Failed Pod no longer counts and is replaced.
            let failed = live_pods(&pods, &ps).await[0].name_any();
            let status = json!({"status": {"phase": "Failed"}});
            pods.patch_status(&failed, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            eventually("the failed pod replaced", || async {
                let live = live_pods(&pods, &ps).await;
                live.len() == 2 && live.iter().all(|p| p.name_any() != failed)
            })
            .await;

            // Readiness is reported.
            let ready = live_pods(&pods, &ps).await[0].name_any();
            let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            pods.patch_status(&ready, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            eventually("readyReplicas 1", || async {
                podsets.get("web").await.unwrap().status.is_some_and(|s| s.ready_replicas == 1 && s.replicas == 2)
            })
            .await;

            // An orphan with matching labels is adopted (and, being one too many, one Pod goes).
            let orphan: Pod = serde_json::from_value(json!({
                "metadata": {"name": "stray", "labels": {"app": "web"}},
                "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}
            }))
            .unwrap();
            pods.create(&PostParams::default(), &orphan).await.unwrap();
            eventually("the orphan adopted or removed, 2 live pods", || async {
                let adopted_or_gone = match pods.get_opt("stray").await.unwrap() {
                    None => true,
                    Some(p) => p.owner_references().iter().any(|r| r.name == "web" && r.controller == Some(true)),
                };
                adopted_or_gone && live_pods(&pods, &ps).await.len() == 2
            })
            .await;

            // The controller runs as the leader, holding and renewing its Lease.
            let leases: Api<Lease> = Api::namespaced(client.clone(), "podset-system");
            let renew = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone()).unwrap().0;
            let first = leases.get("podset-controller").await.unwrap();
            let holder = first.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
            assert!(!holder.is_empty());
            tokio::time::sleep(Duration::from_secs(3)).await;
            let later = leases.get("podset-controller").await.unwrap();
            assert_eq!(later.spec.as_ref().and_then(|s| s.holder_identity.clone()), Some(holder));
            assert!(renew(&later) > renew(&first), "the Lease is renewed");

            // Straight at our server (as the front proxy, for an administrator): the controller's caches have
            // synced, and /metrics shows its queue and its leadership under kube-controller-manager's names.
            let proxy = c.front_proxy_cert();
            let direct = c.podset_client(Credential::Cert(&proxy));
            let get = |path: &'static str| {
                let direct = direct.clone();
                async move {
                    let req = http::Request::get(path)
                        .header("X-Remote-User", "admin")
                        .header("X-Remote-Group", "system:masters")
                        .body(vec![])
                        .unwrap();
                    let (status, _, body) = common::raw(&direct, req).await;
                    (status, String::from_utf8_lossy(&body).into_owned())
                }
            };
            assert_eq!(get("/readyz/informer-sync").await, (200, "ok".to_owned()));
            let (status, metrics) = get("/metrics").await;
            assert_eq!(status, 200, "{metrics}");
            assert!(metrics.contains("leader_election_master_status{name=\"podset-controller\"} 1\n"), "{metrics}");
            let adds = metrics
                .lines()
                .find_map(|l| l.strip_prefix("workqueue_adds_total{name=\"podset\"} "))
                .and_then(|v| v.parse::<f64>().ok());
            assert!(adds.is_some_and(|n| n > 0.0), "{metrics}");
        });
    });
}

#[test]
fn failing_template_reports_and_backs_off() {
    in_namespace("failing_template_reports_and_backs_off", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
            // An empty image passes our validation but not kube-apiserver's Pod validation.
            podsets.create(&PostParams::default(), &podset("bad", 3, "")).await.unwrap();
            eventually("a ReplicaFailure condition", || async {
                podsets.get("bad").await.unwrap().status.is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "ReplicaFailure" && c.status == "True" && c.message.contains("image"))
                })
            })
            .await;
            let events = c.kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=bad",
                "-o",
                "jsonpath={.items[*].reason}",
            ]);
            assert!(events.contains("FailedCreate"), "{events}");
            // Exponential backoff: a handful of attempts in ten seconds, not a storm.
            let before = c.podset_log().matches("reconcile failed").count();
            tokio::time::sleep(Duration::from_secs(10)).await;
            let attempts = c.podset_log().matches("reconcile failed").count() - before;
            assert!(attempts <= 12, "{attempts} failed reconciles in 10 s");
            let pods: Api<Pod> = Api::namespaced(client, "default");
            assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());
        });
    });
}

#[test]
fn never_more_pods_than_asked_even_across_a_restart() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    in_namespace("never_more_pods_than_asked_even_across_a_restart", || {
        let mut c = common::cluster::start();
        let rt = runtime();
        let client = rt.block_on(c.client());
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // Watch every Pod of the PodSet and remember the most that were ever alive at once.
        let live: Arc<Mutex<HashSet<String>>> = Arc::default();
        let max = Arc::new(AtomicUsize::new(0));
        let (l, m, api) = (live.clone(), max.clone(), pods.clone());
        rt.spawn(async move {
            let mut events = watcher(api, watcher::Config::default().labels("app=big")).boxed();
            while let Some(Ok(ev)) = events.next().await {
                let mut live = l.lock().unwrap();
                match ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let alive = p.metadata.deletion_timestamp.is_none()
                            && matches!(
                                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                                None | Some("Pending") | Some("Running")
                            );
                        if alive {
                            live.insert(p.name_any());
                        } else {
                            live.remove(&p.name_any());
                        }
                    }
                    watcher::Event::Delete(p) => {
                        live.remove(&p.name_any());
                    }
                    _ => {}
                }
                m.fetch_max(live.len(), Ordering::SeqCst);
            }
        });
        let podsets: Api<PodSet> = Api::namespaced(client, "default");
        rt.block_on(podsets.create(&PostParams::default(), &podset("big", 200, "busybox"))).unwrap();
        rt.block_on(eventually("the scale-up to be under way", || async { live.lock().unwrap().len() >= 30 }));
        let at_restart = live.lock().unwrap().len();
        c.restart_podset_apiserver();
        assert!(at_restart < 200, "the restart came after the scale-up finished ({at_restart} pods)");
        rt.block_on(eventually("200 pods", || async { live.lock().unwrap().len() == 200 }));
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(live.lock().unwrap().len(), 200);
        assert!(max.load(Ordering::SeqCst) <= 200, "at one point {} pods were alive", max.load(Ordering::SeqCst));
        let restarted = c.podset_log().matches("controller started").count();
        assert_eq!(restarted, 2, "the controller ran before and after the restart");
    });
}

#[test]
fn controller_rides_out_a_main_api_server_outage() {
    in_namespace("controller_rides_out_a_main_api_server_outage", || {
        let mut c = common::cluster::start();
        let rt = runtime();
        let client = rt.block_on(c.client());
        let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let ps = rt.block_on(podsets.create(&PostParams::default(), &podset("steady", 2, "busybox"))).unwrap();
        rt.block_on(eventually("2 pods", || async { live_pods(&pods, &ps).await.len() == 2 }));

        c.stop_apiserver();
        let failures_before = c.podset_log().matches("Pod watch failed").count();
        // While kube-apiserver is down, scale straight through our server, as the front proxy would.
        let proxy = c.front_proxy_cert();
        let direct = {
            let _runtime = rt.enter();
            c.podset_client(Credential::Cert(&proxy))
        };
        let req = http::Request::patch(format!("{}/steady", common::PODSETS))
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
            .header("content-type", "application/merge-patch+json")
            .body(br#"{"spec":{"replicas":4}}"#.to_vec())
            .unwrap();
        let (status, _, body) = rt.block_on(common::raw(&direct, req));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        std::thread::sleep(Duration::from_secs(30));
        let failures = c.podset_log().matches("Pod watch failed").count() - failures_before;
        assert!(failures >= 1, "the controller noticed the outage");
        assert!(failures <= 20, "{failures} watch retries in 30 s: no backoff");

        c.start_apiserver();
        rt.block_on(eventually("4 pods after the outage", || async { live_pods(&pods, &ps).await.len() == 4 }));

        // Losing the data dir while those Pods exist: the server refuses to start rather than orphan them.
        let (status, log) = c.restart_podset_apiserver_empty(Duration::from_secs(60)).expect("the server kept running");
        assert!(!status.success());
        assert!(log.contains("refusing to start"), "{log}");
    });
}

#[test]
fn terminating_pods_do_not_count_and_mismatched_pods_are_released() {
    in_namespace("terminating_pods_do_not_count_and_mismatched_pods_are_released", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let ps = podsets.create(&PostParams::default(), &podset("keep", 2, "busybox")).await.unwrap();
            eventually("2 pods", || async { live_pods(&pods, &ps).await.len() == 2 }).await;

            // A finalizer holds a deleted Pod in Terminating: it no longer counts, so it is replaced.
            let held = live_pods(&pods, &ps).await[0].name_any();
            let fin = Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}}));
            pods.patch(&held, &PatchParams::default(), &fin).await.unwrap();
            pods.delete(&held, &DeleteParams::default()).await.unwrap();
            eventually("a replacement beside the terminating pod", || async {
                let live = live_pods(&pods, &ps).await;
                live.len() == 2 && live.iter().all(|p| p.name_any() != held)
            })
            .await;
            assert!(pods.get(&held).await.unwrap().metadata.deletion_timestamp.is_some());
            pods.patch(&held, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
                .await
                .unwrap();

            // A Pod whose labels stop matching is released (and replaced), not deleted.
            let moved = live_pods(&pods, &ps).await[0].name_any();
            let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "elsewhere"}}}));
            pods.patch(&moved, &PatchParams::default(), &relabel).await.unwrap();
            eventually("the relabelled pod released and replaced", || async {
                let released =
                    pods.get(&moved).await.unwrap().owner_references().iter().all(|r| r.uid != ps.uid().unwrap());
                released && live_pods(&pods, &ps).await.len() == 2
            })
            .await;

            // Pods controlled by someone else are never touched, even when their labels match.
            let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "default");
            let cm = cms
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
                )
                .await
                .unwrap();
            let foreign: Pod = serde_json::from_value(json!({
                "metadata": {"name": "foreign", "labels": {"app": "keep"}, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": cm.uid().unwrap(),
                    "controller": true
                }]},
                "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}
            }))
            .unwrap();
            pods.create(&PostParams::default(), &foreign).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let f = pods.get("foreign").await.unwrap();
            assert_eq!(f.owner_references()[0].kind, "ConfigMap");
            assert!(f.metadata.deletion_timestamp.is_none());
            assert_eq!(live_pods(&pods, &ps).await.len(), 2);
        });
    });
}
