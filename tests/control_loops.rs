//! The cluster's own control loops on a PodSet, side by side with a ReplicaSet on the same control plane:
//! kube-controller-manager's HorizontalPodAutoscaler controller reaches both only through their `/scale`
//! subresource, and clamps them to the HPA's bounds without metrics (`autoscaling/v1` scaling up to
//! `minReplicas`, `autoscaling/v2beta2` scaling down to `maxReplicas`); its disruption controller finds a budget's
//! expected Pods through the Pods' controller's `/scale` (its `metadata.uid` must be the owner's).

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use podset_apiserver::api::PodSet;
use serde_json::json;

fn podset(name: &str, replicas: i32) -> PodSet {
    serde_json::from_value(json!({
        "apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .unwrap()
}

fn replicaset(name: &str, replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .unwrap()
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
            // Up: one replica under an autoscaling/v1 HPA whose minReplicas is 3. Down: five over an
            // autoscaling/v2beta2 HPA whose maxReplicas is 2.
            for (name, replicas, version, min, max) in [("up", 1, "v1", 3, 6), ("down", 5, "v2beta2", 1, 2)] {
                podsets.create(&pp, &podset(name, replicas)).await.unwrap();
                replicasets.create(&pp, &replicaset(name, replicas)).await.unwrap();
                let gvk = GroupVersionKind::gvk("autoscaling", version, "HorizontalPodAutoscaler");
                let hpas: Api<DynamicObject> =
                    Api::default_namespaced_with(client.clone(), &ApiResource::from_gvk(&gvk));
                hpas.create(&pp, &hpa(version, name, "demo.k8s.io/v1alpha1", "PodSet", min, max)).await.unwrap();
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
            let podsets: Api<PodSet> = Api::default_namespaced(client.clone());
            let replicasets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
            let pp = PostParams::default();
            podsets.create(&pp, &podset("ps", 3)).await.unwrap();
            replicasets.create(&pp, &replicaset("rs", 3)).await.unwrap();
            let gvk = GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget");
            let pdbs: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &ApiResource::from_gvk(&gvk));
            for (name, budget) in [
                ("ps", json!({"maxUnavailable": 1})),
                ("rs", json!({"maxUnavailable": 1})),
                ("ps-pct", json!({"maxUnavailable": "50%"})),
                ("rs-pct", json!({"maxUnavailable": "50%"})),
            ] {
                let app = name.trim_end_matches("-pct");
                let mut spec = budget;
                spec["selector"] = json!({"matchLabels": {"app": app}});
                let pdb = json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
                                 "metadata": {"name": name}, "spec": spec});
                pdbs.create(&pp, &serde_json::from_value(pdb).unwrap()).await.unwrap();
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
