//! The cluster's own control loops on a PodSet, side by side with a ReplicaSet on the same control plane:
//! kube-controller-manager's HorizontalPodAutoscaler controller reaches both only through their `/scale`
//! subresource, and clamps them to the HPA's bounds without metrics (`autoscaling/v1` scaling up to
//! `minReplicas`, `autoscaling/v2beta2` scaling down to `maxReplicas`); its disruption controller finds a budget's
//! expected Pods through the Pods' controller's `/scale` (its `metadata.uid` must be the owner's); on a node, an
//! eviction against a spent budget is refused alike. Tools that judge whether a workload has settled (kstatus, as
//! Flux, kpt and cli-utils run it; `kubectl wait`) see a PodSet progress and settle as a ReplicaSet.

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use common::node::demo_template;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use podset_apiserver::api::PodSet;
use serde_json::{json, Value};

/// The spec a PodSet and a ReplicaSet `name` share: `replicas` Pods labelled `app: <name>` made from `template`
/// (busybox when none is given; it never runs without a node).
fn workload_spec(name: &str, replicas: i32, template: Option<Value>) -> Value {
    let template = template.unwrap_or_else(
        || json!({"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}),
    );
    json!({"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template})
}

fn podset(name: &str, replicas: i32) -> PodSet {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": workload_spec(name, replicas, None)})).unwrap()
}

fn replicaset(name: &str, replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": workload_spec(name, replicas, None)})).unwrap()
}

/// PodSet `ps` and ReplicaSet `rs`, each of `replicas` Pods from `template`, created side by side.
async fn ps_and_rs(client: &kube::Client, replicas: i32, template: impl Fn(&str) -> Option<Value>) {
    let pp = PostParams::default();
    let ps = json!({"metadata": {"name": "ps"}, "spec": workload_spec("ps", replicas, template("ps"))});
    let rs = json!({"metadata": {"name": "rs"}, "spec": workload_spec("rs", replicas, template("rs"))});
    let podsets: Api<PodSet> = Api::default_namespaced(client.clone());
    let replicasets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    podsets.create(&pp, &serde_json::from_value(ps).unwrap()).await.unwrap();
    replicasets.create(&pp, &serde_json::from_value(rs).unwrap()).await.unwrap();
}

/// `policy/v1beta1` PodDisruptionBudgets (kube-apiserver 1.20 has no `policy/v1`).
fn pdbs(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget");
    Api::default_namespaced_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Budget `name` over the Pods labelled `app: <app>`.
async fn create_pdb(pdbs: &Api<DynamicObject>, name: &str, app: &str, max_unavailable: Value) {
    let pdb = json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
}

/// An HPA of `version` (`v1` or `v2beta2`) over `kind` `name` in `api_version`, with these bounds.
fn hpa(version: &str, name: &str, api_version: &str, kind: &str, min: i32, max: i32) -> DynamicObject {
    let target = json!({"apiVersion": api_version, "kind": kind, "name": name});
    let mut spec = json!({"scaleTargetRef": target, "minReplicas": min, "maxReplicas": max});
    match version {
        "v1" => spec["targetCPUUtilizationPercentage"] = json!(80),
        _ => {
            spec["metrics"] = json!([{"type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}])
        }
    }
    serde_json::from_value(json!({
        "apiVersion": format!("autoscaling/{version}"), "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": format!("{name}-{version}")}, "spec": spec,
    }))
    .unwrap()
}

#[test]
fn the_hpa_controller_scales_a_podset_as_it_scales_a_replicaset() {
    in_namespace("the_hpa_controller_scales_a_podset_as_it_scales_a_replicaset", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let podsets: Api<PodSet> = Api::default_namespaced(client.clone());
            let replicasets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
            let pp = PostParams::default();
            // Up: one replica under an autoscaling/v1 HPA whose minReplicas is 3, its target named in v1alpha1.
            // Down: five over an autoscaling/v2beta2 HPA whose maxReplicas is 2, its target named in v1beta1.
            let cases =
                [("up", 1, "v1", 3, 6, "demo.k8s.io/v1alpha1"), ("down", 5, "v2beta2", 1, 2, "demo.k8s.io/v1beta1")];
            for (name, replicas, version, min, max, target) in cases {
                podsets.create(&pp, &podset(name, replicas)).await.unwrap();
                replicasets.create(&pp, &replicaset(name, replicas)).await.unwrap();
                let gvk = GroupVersionKind::gvk("autoscaling", version, "HorizontalPodAutoscaler");
                let hpas: Api<DynamicObject> =
                    Api::default_namespaced_with(client.clone(), &ApiResource::from_gvk(&gvk));
                hpas.create(&pp, &hpa(version, name, target, "PodSet", min, max)).await.unwrap();
                let mut theirs = hpa(version, name, "apps/v1", "ReplicaSet", min, max);
                theirs.metadata.name = Some(format!("{name}-{version}-rs"));
                hpas.create(&pp, &theirs).await.unwrap();
            }
            for (name, want) in [("up", 3), ("down", 2)] {
                wait(
                    Duration::from_secs(120),
                    || async {
                        let ps = podsets.get(name).await.unwrap().spec.replicas;
                        let rs = replicasets.get(name).await.unwrap().spec.replicas;
                        eprintln!("{name}: PodSet {ps:?}, ReplicaSet {rs:?}");
                        ps == Some(want) && rs == Some(want)
                    },
                    &format!("the HPA controller to scale {name} to {want}"),
                )
                .await;
            }
            // The HPA's own status reads the same for both targets.
            let gvk = GroupVersionKind::gvk("autoscaling", "v1", "HorizontalPodAutoscaler");
            let hpas: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &ApiResource::from_gvk(&gvk));
            for name in ["up-v1", "down-v2beta2"] {
                let ours = hpas.get(name).await.unwrap().data["status"]["desiredReplicas"].clone();
                let theirs = hpas.get(&format!("{name}-rs")).await.unwrap().data["status"]["desiredReplicas"].clone();
                assert_eq!(ours, theirs, "{name}: desiredReplicas");
            }
        });
    });
}

#[test]
fn a_disruption_budget_expects_a_podsets_replicas_as_a_replicasets() {
    in_namespace("a_disruption_budget_expects_a_podsets_replicas_as_a_replicasets", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            ps_and_rs(&client, 3, |_| None).await;
            let pdbs = pdbs(&client);
            for (name, budget) in
                [("ps", json!(1)), ("rs", json!(1)), ("ps-pct", json!("50%")), ("rs-pct", json!("50%"))]
            {
                create_pdb(&pdbs, name, name.trim_end_matches("-pct"), budget).await;
            }
            for name in ["ps", "rs", "ps-pct", "rs-pct"] {
                wait(
                    Duration::from_secs(120),
                    || async {
                        let s = pdbs.get(name).await.unwrap().data["status"].clone();
                        eprintln!("{name}: {s}");
                        s["expectedPods"] == json!(3)
                    },
                    &format!("the disruption controller to expect 3 Pods under {name}"),
                )
                .await;
            }
            let status = |name: &'static str| {
                let pdbs = pdbs.clone();
                async move {
                    let s = pdbs.get(name).await.unwrap().data["status"].clone();
                    (s["expectedPods"].clone(), s["desiredHealthy"].clone(), s["disruptionsAllowed"].clone())
                }
            };
            assert_eq!(status("ps").await, status("rs").await);
            assert_eq!(status("ps-pct").await, status("rs-pct").await);
        });
    });
}

/// kstatus (sigs.k8s.io/cli-utils/pkg/kstatus) on an object: its generic rules (generation observed, then a
/// `Reconciling` or `Stalled` condition), then its ReplicaSet rule for a ReplicaSet. (status, reason, message).
fn kstatus(obj: &Value) -> (String, String, String) {
    let progress = |reason: &str, message: String| ("InProgress".to_owned(), reason.to_owned(), message);
    if obj["status"]["observedGeneration"] != obj["metadata"]["generation"] {
        return progress("LatestGenerationNotObserved", "generation not observed".into());
    }
    let conditions = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    for c in &conditions {
        let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
        if c["type"] == "Reconciling" && c["status"] == "True" {
            return progress(&text("reason"), text("message"));
        }
        if c["type"] == "Stalled" && c["status"] == "True" {
            return ("Failed".into(), text("reason"), text("message"));
        }
    }
    if obj["kind"] != "ReplicaSet" {
        return ("Current".into(), String::new(), "Resource is current".into());
    }
    if conditions.iter().any(|c| c["type"] == "ReplicaFailure" && c["status"] == "True") {
        return progress("ReplicaFailure", "Replica Failure condition. Check Pods".into());
    }
    let int = |path: &str, default: i64| obj.pointer(path).and_then(Value::as_i64).unwrap_or(default);
    let (desired, replicas) = (int("/spec/replicas", 1), int("/status/replicas", 0));
    let (ready, available) = (int("/status/readyReplicas", 0), int("/status/availableReplicas", 0));
    if desired > available {
        return progress("LessAvailable", format!("Available: {available}/{desired}"));
    }
    if desired > ready {
        return progress("LessReady", format!("Ready: {ready}/{desired}"));
    }
    if replicas > desired {
        return progress("ExtraPods", format!("Pending termination: {}", replicas - desired));
    }
    ("Current".into(), String::new(), "Resource is current".into())
}

#[test]
fn status_tools_see_a_podset_progress_and_settle_as_a_replicaset() {
    in_namespace("status_tools_see_a_podset_progress_and_settle_as_a_replicaset", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            ps_and_rs(&client, 2, |_| None).await;
            let get = |kind: &str, name: &str| {
                let out = c.kubectl(&["get", kind, name, "-o", "json"]);
                serde_json::from_str::<Value>(&out).unwrap()
            };
            // No node: the Pods stay Pending, both workloads are still progressing.
            wait(
                Duration::from_secs(60),
                || async {
                    get("replicaset", "rs")["status"]["replicas"] == 2 && get("podset", "ps")["status"]["replicas"] == 2
                },
                "both controllers to make their Pods",
            )
            .await;
            let (rs, ps) = (kstatus(&get("replicaset", "rs")), kstatus(&get("podset", "ps")));
            assert_eq!(rs, ("InProgress".into(), "LessAvailable".into(), "Available: 0/2".into()));
            assert_eq!(ps, rs, "kstatus judges the PodSet as the ReplicaSet");
            c.kubectl(&["wait", "--for=condition=Reconciling", "podset/ps", "--timeout=30s"]);
            let describe = c.kubectl(&["describe", "podset", "ps"]);
            for shown in ["Replicas:", "Type:", "Reconciling", "Available: 0/2"] {
                assert!(describe.contains(shown), "kubectl describe shows {shown:?}:\n{describe}");
            }

            // Scaled to nothing, both settle.
            c.kubectl(&["scale", "replicaset/rs", "--replicas=0"]);
            c.kubectl(&["scale", "podset/ps", "--replicas=0"]);
            c.kubectl(&["wait", "--for=condition=Ready", "podset/ps", "--timeout=60s"]);
            wait(
                Duration::from_secs(60),
                || async {
                    kstatus(&get("replicaset", "rs")).0 == "Current" && kstatus(&get("podset", "ps")).0 == "Current"
                },
                "both to be Current",
            )
            .await;
            let ready = c.kubectl(&[
                "get",
                "podset",
                "ps",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}",
            ]);
            assert_eq!(ready, "PodSet is available. Replicas: 0");
        });
    });
}

/// The demo workload, Ready two seconds after it starts, gone a second after it is told to stop.
fn running_template(image: &str, app: &str) -> Value {
    let mut t = demo_template(image, app, 2);
    t["spec"]["terminationGracePeriodSeconds"] = json!(1);
    t
}

#[test]
fn an_eviction_against_a_spent_budget_is_refused_for_a_podset_as_for_a_replicaset() {
    in_namespace("an_eviction_against_a_spent_budget_is_refused_for_a_podset_as_for_a_replicaset", || {
        let c = common::cluster::start_with_node();
        runtime().block_on(async {
            let client = c.client().await;
            ps_and_rs(&client, 2, |app| Some(running_template(c.demo_image(), app))).await;
            let pdbs = pdbs(&client);
            for app in ["ps", "rs"] {
                create_pdb(&pdbs, app, app, json!(1)).await;
            }
            for app in ["ps", "rs"] {
                wait(
                    Duration::from_secs(240),
                    || async { pdbs.get(app).await.unwrap().data["status"]["disruptionsAllowed"] == json!(1) },
                    &format!("both Pods of {app} ready and one disruption allowed"),
                )
                .await;
            }
            // Settled: kstatus says Current for both, and `kubectl wait` returns for the PodSet.
            c.kubectl(&["wait", "--for=condition=Ready", "podset/ps", "--timeout=60s"]);
            let rs: Value = serde_json::from_str(&c.kubectl(&["get", "replicaset", "rs", "-o", "json"])).unwrap();
            let ps: Value = serde_json::from_str(&c.kubectl(&["get", "podset", "ps", "-o", "json"])).unwrap();
            assert_eq!((kstatus(&ps).0.as_str(), kstatus(&rs).0.as_str()), ("Current", "Current"));

            // Pods made from now on never become ready, so the budget stays spent once an eviction spends it
            // (neither controller replaces its running Pods for a template change).
            for (kind, app) in [("replicaset", "rs"), ("podset", "ps")] {
                let mut template = running_template(c.demo_image(), app);
                template["spec"]["containers"][0]["args"] = json!(["--ready-after=3600"]);
                let patch = json!({"spec": {"template": template}}).to_string();
                c.kubectl(&["patch", kind, app, "--type=merge", "-p", &patch]);
            }
            let pods: Api<Pod> = Api::default_namespaced(client.clone());
            // kube-rs retries a 429 by default; kubectl drain and client-go do not, and the answer is what counts.
            let mut config = c.config().await;
            config.default_retry = false;
            let evictor = kube::Client::try_from(config).unwrap();
            let mut answers = Vec::new();
            for app in ["ps", "rs"] {
                let names: Vec<String> = pods
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await
                    .unwrap()
                    .items
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .collect();
                let mut codes = Vec::new();
                for pod in &names[..2] {
                    let eviction = json!({"apiVersion": "policy/v1beta1", "kind": "Eviction",
                        "metadata": {"name": pod, "namespace": "default"}});
                    let req = http::Request::post(format!("/api/v1/namespaces/default/pods/{pod}/eviction"))
                        .header("content-type", "application/json")
                        .body(eviction.to_string().into_bytes())
                        .unwrap();
                    let (code, _, body) = common::raw(&evictor, req).await;
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    eprintln!("{app}: evicting {pod}: {code} {body}");
                    codes.push((code, body["reason"].as_str().unwrap_or_default().to_owned(), body["message"].clone()));
                }
                answers.push(codes);
            }
            assert_eq!(answers[0], answers[1], "the same answers for the PodSet's Pods and the ReplicaSet's");
            assert_eq!(answers[0][0].0, 201, "the first eviction spends the budget");
            assert_eq!((answers[0][1].0, answers[0][1].1.as_str()), (429, "TooManyRequests"), "the second is refused");
            // And each controller replaces its evicted Pod.
            for app in ["ps", "rs"] {
                wait(
                    Duration::from_secs(120),
                    || async {
                        let lp = ListParams::default().labels(&format!("app={app}"));
                        let live = pods.list(&lp).await.unwrap().items;
                        live.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count() == 2
                    },
                    &format!("{app}'s evicted Pod replaced"),
                )
                .await;
            }
        });
    });
}
