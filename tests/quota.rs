//! ResourceQuota through the aggregator, side by side with kube-apiserver's own for ConfigMaps on the same
//! control plane: the same quota over `count/configmaps` and `count/podsets.demo.k8s.io` refuses the second create
//! with the same code, reason and message, charges `status.used` at once, charges nothing for a dry run, and
//! kube-controller-manager releases the charge after a delete. Then 20 creates at once against a limit of 5 leave
//! exactly 5, on one replica and on two replicas sharing etcd.

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use podset_apiserver::api::PodSet;
use podset_envtest::{Cluster, ServerCommand};
use serde_json::json;

const PODSETS: &str = "count/podsets.demo.k8s.io";
const CONFIGMAPS: &str = "count/configmaps";

fn podset(name: &str) -> PodSet {
    serde_json::from_value(common::podset(name, 0)).unwrap()
}

fn generated_podset(prefix: &str) -> PodSet {
    let mut ps = podset("");
    ps.metadata.name = None;
    ps.metadata.generate_name = Some(prefix.into());
    ps
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// A namespace with one quota `q` over `hard`, once kube-controller-manager has filled in its status for every
/// resource in it (until then our plugin, as kube-apiserver's, refuses with "status unknown").
async fn quota_namespace(client: &kube::Client, ns: &str, hard: serde_json::Value) -> Api<ResourceQuota> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    // kube-controller-manager counts a namespace's objects when a quota is created and then only every five
    // minutes (it recounts on deletes, not creates): the quota must come after kube-root-ca.crt to count it.
    if hard.get(CONFIGMAPS).is_some() {
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        wait(
            Duration::from_secs(120),
            || async { configmaps.get_opt("kube-root-ca.crt").await.unwrap().is_some() },
            "kube-controller-manager to publish kube-root-ca.crt",
        )
        .await;
    }
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let q = json!({"metadata": {"name": "q"}, "spec": {"hard": hard}});
    quotas.create(&PostParams::default(), &serde_json::from_value(q).unwrap()).await.unwrap();
    let keys: Vec<String> = hard.as_object().unwrap().keys().cloned().collect();
    wait(
        Duration::from_secs(120),
        || async {
            let q = quotas.get("q").await.unwrap();
            let used = q.status.and_then(|s| s.used).unwrap_or_default();
            keys.iter().all(|k| used.contains_key(k))
        },
        "kube-controller-manager to fill in the quota's status.used",
    )
    .await;
    // And once podset-apiserver's watch of quotas has that status too: until then it answers "status unknown".
    if keys.iter().any(|k| k == PODSETS) {
        let podsets: Api<PodSet> = Api::namespaced(client.clone(), ns);
        let dry = PostParams { dry_run: true, ..Default::default() };
        wait(
            Duration::from_secs(30),
            || async { podsets.create(&dry, &podset("probe")).await.is_ok() },
            "podset-apiserver to see the quota's status",
        )
        .await;
    }
    quotas
}

async fn used(quotas: &Api<ResourceQuota>, resource: &str) -> String {
    let q = quotas.get("q").await.unwrap();
    q.status.and_then(|s| s.used).and_then(|u| u.get(resource).map(|v| v.0.clone())).unwrap_or_default()
}

/// (code, reason, message) of a refused create.
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn quota_refuses_and_charges_podsets_as_kube_apiserver_does_configmaps() {
    in_namespace("quota_refuses_and_charges_podsets_as_kube_apiserver_does_configmaps", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            // Two of each: kube-root-ca.crt and cm-1, ps-0 and ps-1.
            let quotas = quota_namespace(&client, "quota", json!({CONFIGMAPS: "2", PODSETS: "2"})).await;
            let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "quota");
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "quota");
            let pp = PostParams::default();
            let dry = PostParams { dry_run: true, ..Default::default() };
            // The quota came after kube-root-ca.crt, but the quota controller's informer may have counted before
            // seeing it; a change to spec.hard makes it count again (its resync is five minutes).
            let counted = || async { used(&quotas, CONFIGMAPS).await == "1" };
            let (patience, what) = (Duration::from_secs(120), "the quota to count kube-root-ca.crt");
            if tokio::time::timeout(Duration::from_secs(15), wait(patience, counted, what)).await.is_err() {
                let hard = json!({"spec": {"hard": {"count/secrets": "100"}}});
                quotas.patch("q", &PatchParams::default(), &Patch::Merge(hard)).await.unwrap();
                wait(patience, counted, what).await;
            }
            assert_eq!(used(&quotas, PODSETS).await, "0");
            podsets.create(&pp, &podset("ps-0")).await.unwrap();
            assert_eq!(used(&quotas, PODSETS).await, "1");

            // Each create is charged at once, before kube-controller-manager recounts.
            configmaps.create(&pp, &configmap("cm-1")).await.unwrap();
            podsets.create(&pp, &podset("ps-1")).await.unwrap();
            assert_eq!(used(&quotas, CONFIGMAPS).await, "2");
            assert_eq!(used(&quotas, PODSETS).await, "2");

            // Over the limit: the same answer, named as each server names its resource.
            let theirs = refusal(configmaps.create(&pp, &configmap("cm-2")).await);
            let ours = refusal(podsets.create(&pp, &podset("ps-2")).await);
            eprintln!("kube-apiserver: {theirs:?}\npodset-apiserver: {ours:?}");
            assert_eq!((theirs.0, theirs.1.as_str()), (403, "Forbidden"));
            let expected = theirs.2.replace("count/configmaps", PODSETS).replace("configmaps", "podsets.demo.k8s.io");
            assert_eq!(ours, (403, "Forbidden".to_owned(), expected.replace("cm-2", "ps-2")));
            assert_eq!(
                ours.2,
                "podsets.demo.k8s.io \"ps-2\" is forbidden: exceeded quota: q, requested: count/podsets.demo.k8s.io=1, \
                 used: count/podsets.demo.k8s.io=2, limited: count/podsets.demo.k8s.io=2"
            );
            // A dry run is refused the same way, and nothing is stored.
            assert_eq!(refusal(podsets.create(&dry, &podset("ps-3")).await).0, 403);
            assert!(
                podsets.get_opt("ps-2").await.unwrap().is_none() && podsets.get_opt("ps-3").await.unwrap().is_none()
            );

            // A generated name: both refusals name the object by the name it was given.
            let mut cm = configmap("");
            cm.metadata.name = None;
            cm.metadata.generate_name = Some("cm-".into());
            let theirs = refusal(configmaps.create(&pp, &cm).await).2;
            let ours = refusal(podsets.create(&pp, &generated_podset("ps-")).await).2;
            assert!(theirs.starts_with("configmaps \"cm-") && !theirs.starts_with("configmaps \"cm-\""), "{theirs}");
            assert!(
                ours.starts_with("podsets.demo.k8s.io \"ps-") && !ours.starts_with("podsets.demo.k8s.io \"ps-\""),
                "{ours}"
            );

            // kube-controller-manager releases the charge once the object is gone, for both.
            configmaps.delete("cm-1", &DeleteParams::default()).await.unwrap();
            podsets.delete("ps-1", &DeleteParams::default()).await.unwrap();
            for resource in [CONFIGMAPS, PODSETS] {
                wait(
                    Duration::from_secs(120),
                    || async { used(&quotas, resource).await == "1" },
                    &format!("kube-controller-manager to release {resource}"),
                )
                .await;
            }
            // A dry run within the limit is admitted, once the release has reached podset-apiserver's watch of the
            // quota (kube-apiserver's own plugin reads its informer just as late), and charges nothing.
            wait(
                Duration::from_secs(30),
                || async { podsets.create(&dry, &podset("ps-4")).await.is_ok() },
                "the released charge to reach podset-apiserver's quota cache",
            )
            .await;
            assert_eq!(used(&quotas, PODSETS).await, "1");
            podsets.create(&pp, &podset("ps-5")).await.unwrap();
            assert_eq!(used(&quotas, PODSETS).await, "2");

            // A quota over other resources, or one with scopes, does not count PodSets.
            let other = quota_namespace(&client, "other", json!({CONFIGMAPS: "1"})).await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "other");
            podsets.create(&pp, &podset("free")).await.unwrap();
            assert_eq!(used(&other, PODSETS).await, "");
        });
    });
}

/// 20 creates at once against a limit of 5 through the aggregator.
async fn twenty_creates_against_five(c: &Cluster, ns: &str) {
    let client = c.client().await;
    let quotas = quota_namespace(&client, ns, json!({PODSETS: "5"})).await;
    let podsets: Api<PodSet> = Api::namespaced(client.clone(), ns);
    let creates = (0..20).map(|i| {
        let podsets = podsets.clone();
        async move { podsets.create(&PostParams::default(), &podset(&format!("ps-{i}"))).await }
    });
    let results = futures::future::join_all(creates).await;
    let created = results.iter().filter(|r| r.is_ok()).count();
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        let kube::Error::Api(s) = r else { panic!("{r:?}") };
        // Over quota, or a conflict on the quota's status that outlasted the retries (kube answers that too).
        assert!(s.code == 403 || s.code == 409, "{s:?}");
    }
    let stored = podsets.list(&Default::default()).await.unwrap().items.len();
    eprintln!("{ns}: {created} of 20 created, {stored} stored, used {}", used(&quotas, PODSETS).await);
    assert_eq!(stored, created);
    assert_eq!(created, 5, "exactly the limit is created");
    assert_eq!(used(&quotas, PODSETS).await, "5");
}

#[test]
fn twenty_creates_at_once_leave_exactly_the_limit() {
    in_namespace("twenty_creates_at_once_leave_exactly_the_limit", || {
        let c = common::cluster::start();
        runtime().block_on(twenty_creates_against_five(&c, "burst"));
    });
}

#[test]
fn twenty_creates_at_once_on_two_replicas_leave_exactly_the_limit() {
    in_namespace("twenty_creates_at_once_on_two_replicas_leave_exactly_the_limit", || {
        let c = Cluster::start_replicated(ServerCommand { program: common::BIN.into(), args: Vec::new() }, 2);
        runtime().block_on(twenty_creates_against_five(&c, "burst"));
    });
}

#[test]
fn a_stalled_or_stopped_main_api_server_refuses_the_create_and_nothing_is_stored() {
    in_namespace("a_stalled_or_stopped_main_api_server_refuses_the_create_and_nothing_is_stored", || {
        let mut c = common::cluster::start();
        let rt = runtime();
        rt.block_on(async {
            let quotas = quota_namespace(&c.client().await, "down", json!({PODSETS: "5"})).await;
            assert_eq!(used(&quotas, PODSETS).await, "0");
        });
        // Straight at podset-apiserver, as an admin of the cluster CA (no review needed): kube-apiserver is the one
        // that stalls or stops.
        let admin = c.client_cert("ca", "admin", Some("system:masters"));
        let create = |name: &str| {
            let body = serde_json::to_vec(&common::podset(name, 0)).unwrap();
            http::Request::post("/apis/demo.k8s.io/v1alpha1/namespaces/down/podsets")
                .header("content-type", "application/json")
                .body(body)
                .unwrap()
        };
        let get = |name: &str| {
            http::Request::get(format!("/apis/demo.k8s.io/v1alpha1/namespaces/down/podsets/{name}"))
                .body(vec![])
                .unwrap()
        };

        // Stalled (SIGSTOP): the charge cannot be written; after the plugin's 10 s, kube's timeout answer.
        let apiserver = c.pid("kube-apiserver").unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-STOP", &apiserver]).status().unwrap().success());
        let (code, body, took) = rt.block_on(async {
            let direct = c.podset_client(podset_envtest::Credential::Cert(&admin));
            let started = std::time::Instant::now();
            let (code, _, body) = common::raw(&direct, create("stalled")).await;
            (code, common::json(&body), started.elapsed())
        });
        assert!(std::process::Command::new("kill").args(["-CONT", &apiserver]).status().unwrap().success());
        eprintln!("stalled: {code} after {took:?}: {body}");
        assert_eq!((code, body["reason"].as_str()), (500, Some("InternalError")), "{body}");
        assert_eq!(body["message"], "Internal error occurred: resource quota evaluation timed out");
        assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(30), "{took:?}");

        // Stopped: the write is refused at once; the client's error, as a Status without a reason.
        c.stop_apiserver();
        let (code, body, stored) = rt.block_on(async {
            let direct = c.podset_client(podset_envtest::Credential::Cert(&admin));
            let (code, _, body) = common::raw(&direct, create("stopped")).await;
            let stored = [common::raw(&direct, get("stalled")).await.0, common::raw(&direct, get("stopped")).await.0];
            (code, common::json(&body), stored)
        });
        eprintln!("stopped: {code}: {body}");
        assert_eq!(code, 500, "{body}");
        assert_eq!(body["kind"], "Status");
        assert!(body["message"].as_str().unwrap_or_default().contains("Connection refused"), "{body}");
        assert_eq!(stored, [404, 404], "nothing was stored");

        // Back: the same create passes and is charged once.
        c.start_apiserver();
        rt.block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "down");
            wait(
                Duration::from_secs(60),
                || async { podsets.create(&PostParams::default(), &podset("back")).await.is_ok() },
                "a create once kube-apiserver is back",
            )
            .await;
            // The stalled write may still land once kube-apiserver resumes (kube's own plugin leaves such a charge
            // too, for kube-controller-manager's resync to correct): one PodSet is charged once or twice.
            let quotas: Api<ResourceQuota> = Api::namespaced(client, "down");
            let charged = used(&quotas, PODSETS).await;
            assert!(charged == "1" || charged == "2", "{charged}");
            assert_eq!(podsets.list(&Default::default()).await.unwrap().items.len(), 1);
        });
    });
}

#[test]
fn kube_controller_managers_metadata_informers_list_and_watch_podsets_through_the_aggregator() {
    in_namespace("kube_controller_managers_metadata_informers_list_and_watch_podsets_through_the_aggregator", || {
        let mut c = common::cluster::start();
        let (flags, audit) = common::audit_flags(c.dir.path(), common::AUDIT_METADATA);
        c.restart_podset_apiserver_with(&flags);
        runtime().block_on(async {
            let client = c.client().await;
            let quotas = quota_namespace(&client, "monitored", json!({PODSETS: "5"})).await;
            let podsets: Api<PodSet> = Api::namespaced(client.clone(), "monitored");
            podsets.create(&PostParams::default(), &podset("web")).await.unwrap();
            assert_eq!(used(&quotas, PODSETS).await, "1");
            // kube-controller-manager's quota monitor and garbage collector use one metadata client, whose
            // requests carry this user agent: every request of it asks for PartialObjectMetadata(List).
            let verbs = || -> Vec<(String, u64)> {
                std::fs::read_to_string(&audit)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter(|e| {
                        e["userAgent"].as_str().is_some_and(|a| {
                            a.starts_with("kube-controller-manager/") && a.ends_with("/metadata-informers")
                        }) && e["objectRef"]["resource"] == "podsets"
                            && e["stage"] != "RequestReceived"
                    })
                    .map(|e| {
                        (
                            e["verb"].as_str().unwrap_or_default().to_owned(),
                            e["responseStatus"]["code"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            };
            wait(
                Duration::from_secs(60),
                || {
                    std::future::ready({
                        let v = verbs();
                        v.contains(&("list".into(), 200)) && v.iter().any(|(verb, _)| verb == "watch")
                    })
                },
                "kube-controller-manager's metadata informers to list and watch PodSets",
            )
            .await;
            // Deleting the PodSet releases the charge: the quota controller saw it through that watch.
            podsets.delete("web", &DeleteParams::default()).await.unwrap();
            wait(
                Duration::from_secs(60),
                || async { used(&quotas, PODSETS).await == "0" },
                "the charge to be released",
            )
            .await;
        });
    });
}
