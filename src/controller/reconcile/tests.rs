use kube::Resource;
use serde_json::{json, Value};

use super::super::events::Record;
use super::super::pods::is_available;
use super::super::{controller, Controller};
use super::claims::{related_pods, siblings};
use super::*;
use crate::api::PodSetStatus;

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn counted<'a>(active: &'a [&'a Pod]) -> Counted<'a> {
    Counted { active, terminating: 0 }
}

#[test]
fn pods_carry_the_template_and_a_controller_reference() {
    let mut ps: PodSet =
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}})).unwrap();
    crate::api::defaults::default_podset(&mut ps, crate::api::Version::V1alpha1);
    let p = pod_from_template(&ps);
    assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(p.labels().get(crate::api::DEFAULT_LABEL).map(String::as_str), Some("web"));
    let r = &p.owner_references()[0];
    assert_eq!((r.uid.as_str(), r.controller, r.block_owner_deletion), ("u1", Some(true), Some(true)));
    assert_eq!(
        controller(&Pod { metadata: ObjectMeta { namespace: Some("ns".into()), ..p.metadata.clone() }, ..p }),
        Controller::PodSet { key: PodSetKey::new("ns", "web"), uid: "u1".into() }
    );
}

#[test]
fn ready_and_reconciling_follow_kstatus_replicaset_rule_and_keep_their_transition_time() {
    let ready_pod = |n: &str| {
        pod(
            json!({"metadata": {"name": n}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        )
    };
    let pending = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Pending"}}));
    let mut ps: PodSet =
        serde_json::from_value(json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 2}})).unwrap();
    let cond = |s: &PodSetStatus, t: &str| {
        let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    };
    let (a, b) = (ready_pod("a"), ready_pod("b"));
    let s = status_of(&ps, &counted(&[&a, &pending]), None, jiff::Timestamp::now());
    assert_eq!(cond(&s, "Ready"), ("False".into(), "LessAvailable".into(), "Available: 1/2".into()));
    assert_eq!(cond(&s, "Reconciling"), ("True".into(), "LessAvailable".into(), "Available: 1/2".into()));
    assert_eq!(s.conditions[0].observed_generation, Some(2));

    ps.status = Some(s.clone());
    let settled = status_of(&ps, &counted(&[&a, &b]), None, jiff::Timestamp::now());
    assert_eq!(cond(&settled, "Ready"), ("True".into(), "Available".into(), "PodSet is available. Replicas: 2".into()));
    assert_eq!(cond(&settled, "Reconciling").0, "False");
    ps.status = Some(settled.clone());
    assert_eq!(
        status_of(&ps, &counted(&[&a, &b]), None, jiff::Timestamp::now()),
        settled,
        "nothing changed: the same status, no write"
    );

    let extra = ready_pod("c");
    let s = status_of(&ps, &counted(&[&a, &b, &extra]), None, jiff::Timestamp::now());
    assert_eq!(cond(&s, "Reconciling"), ("True".into(), "ExtraPods".into(), "Pending termination: 1".into()));
    let s = status_of(&ps, &counted(&[&a, &b]), Some("quota exceeded"), jiff::Timestamp::now());
    assert_eq!(cond(&s, "Ready").1, "ReplicaFailure");
    assert_eq!(cond(&s, "ReplicaFailure").0, "True");
}

#[test]
fn a_pod_is_available_once_ready_for_min_ready_seconds() {
    let ready_since = |t: &str| {
        pod(json!({"metadata": {"name": "a"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t}]}}))
    };
    let now: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    let (old, new) = (ready_since("2026-01-01T00:00:00Z"), ready_since("2026-01-01T00:00:50Z"));
    assert!(is_available(&new, 0, now), "available as soon as ready without minReadySeconds");
    assert!(is_available(&old, 60, now) && !is_available(&new, 60, now));
    assert!(!is_available(&pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Pending"}})), 0, now));
    let mut ps: PodSet =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "minReadySeconds": 30}}))
            .unwrap();
    ps.metadata.generation = Some(1);
    let s = status_of(&ps, &counted(&[&old, &new]), None, now);
    assert_eq!((s.ready_replicas, s.available_replicas), (2, 1));
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.message.as_str()), ("False", "Available: 1/2"));
}
fn api_error(code: u16, reason: &str, message: &str, causes: Value) -> kube::Error {
    let status = json!({"status": "Failure", "code": code, "reason": reason, "message": message,
        "details": {"causes": causes}});
    kube::Error::Api(Box::new(serde_json::from_value(status).unwrap()))
}

fn named_pod(name: &str) -> Pod {
    pod(json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")}}))
}

// Mirrors RealPodControl.createPods and DeletePod: one event per Pod, the API server's message as it is.
#[test]
fn events_name_each_pod_and_quote_the_api_servers_message() {
    let web = named_pod("web-7xk2p");
    let reference = Some(web.object_ref(&()));
    assert_eq!(
        created(&web),
        Record {
            warning: false,
            reason: "SuccessfulCreate",
            note: "Created pod: web-7xk2p".into(),
            related: reference.clone()
        }
    );
    assert_eq!(
        deleted(&web),
        Record {
            warning: false,
            reason: "SuccessfulDelete",
            note: "Deleted pod: web-7xk2p".into(),
            related: reference.clone()
        }
    );
    let quota = "pods \"web-x\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2";
    let refused = api_error(403, "Forbidden", quota, json!([]));
    assert_eq!(
        create_failed(&refused),
        Some(Record { warning: true, reason: "FailedCreate", note: format!("Error creating: {quota}"), related: None })
    );
    assert_eq!(Error::Create(refused).to_string(), quota, "ReplicaFailure's message is the API server's");
    let terminating = api_error(
        403,
        "Forbidden",
        "unable to create new content in namespace ns because it is being terminated",
        json!([{"reason": "NamespaceTerminating", "message": "namespace ns is being terminated", "field": "metadata.namespace"}]),
    );
    assert_eq!(create_failed(&terminating), None, "no event while the namespace goes away");

    let busy = api_error(500, "InternalError", "Internal error occurred: etcdserver: request timed out", json!([]));
    assert_eq!(
        delete_failed(&busy, &web),
        Some(Record {
            warning: true,
            reason: "FailedDelete",
            note: "Error deleting: Internal error occurred: etcdserver: request timed out".into(),
            related: reference
        })
    );
    assert_eq!(
        Error::Delete(busy).to_string(),
        "unable to delete pods: Internal error occurred: etcdserver: request timed out"
    );
    let gone = api_error(404, "NotFound", "pods \"web-x\" not found", json!([]));
    assert_eq!(delete_failed(&gone, &web), None, "a Pod already gone is no failure");
}

// The Pod each event concerns is its related object (events.k8s.io's `related`); a failed create made none.
#[test]
fn each_pods_event_relates_to_its_pod() {
    let (a, b) = (named_pod("web-a"), named_pod("web-b"));
    let related = |ev: Record| {
        let r = ev.related.expect("the Pod as the related object");
        (r.api_version, r.kind, r.namespace, r.name, r.uid)
    };
    let of = |name: &str| {
        (Some("v1".into()), Some("Pod".into()), Some("ns".into()), Some(name.into()), Some(format!("uid-{name}")))
    };
    assert_eq!([related(created(&a)), related(created(&b))], [of("web-a"), of("web-b")]);
    assert_eq!([related(deleted(&a)), related(deleted(&b))], [of("web-a"), of("web-b")]);
    let busy = api_error(500, "InternalError", "Internal error occurred", json!([]));
    assert_eq!(related(delete_failed(&busy, &a).unwrap()), of("web-a"));
    let refused = api_error(403, "Forbidden", "pods \"web-\" is forbidden", json!([]));
    assert_eq!(create_failed(&refused).unwrap().related, None, "no Pod was made");
}

// Stricter than upstream on purpose (docs/design.md): a replica that may have lost its Lease writes no status.
#[test]
fn a_lapsed_lease_is_no_replica_failure() {
    assert_eq!(replica_failure(&Error::NotLeading), None);
    let quota = api_error(403, "Forbidden", "exceeded quota: q", json!([]));
    assert_eq!(replica_failure(&Error::Create(quota)).as_deref(), Some("exceeded quota: q"));
}

// Mirrors calculateStatus: ReplicaFailure's reason by direction, set once, kept while failing, removed after.
#[test]
fn replica_failure_says_whether_creates_or_deletes_failed() {
    let ready_pod = |n: &str| {
        pod(json!({"metadata": {"name": n}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}}))
    };
    let (a, b, c) = (ready_pod("a"), ready_pod("b"), ready_pod("c"));
    let mut ps: PodSet =
        serde_json::from_value(json!({"metadata": {"name": "web", "generation": 1}, "spec": {"replicas": 2}})).unwrap();
    let failure = |s: &PodSetStatus| {
        let c = s.conditions.iter().find(|c| c.type_ == "ReplicaFailure")?;
        Some((c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let quota = "pods \"web-x\" is forbidden: exceeded quota: q";
    let s = status_of(&ps, &counted(&[&a]), Some(quota), jiff::Timestamp::now());
    assert_eq!(failure(&s), Some(("True".into(), "FailedCreate".into(), quota.into())));
    let deleting = "unable to delete pods: Internal error occurred";
    let s = status_of(&ps, &counted(&[&a, &b, &c]), Some(deleting), jiff::Timestamp::now());
    assert_eq!(failure(&s), Some(("True".into(), "FailedDelete".into(), deleting.into())));

    // Once set, a later failure leaves it as it is, reason and message included.
    ps.status = Some(status_of(&ps, &counted(&[&a]), Some(quota), jiff::Timestamp::now()));
    let s = status_of(&ps, &counted(&[&a, &b, &c]), Some(deleting), jiff::Timestamp::now());
    assert_eq!(failure(&s), Some(("True".into(), "FailedCreate".into(), quota.into())));
    let s = status_of(&ps, &counted(&[&a, &b]), None, jiff::Timestamp::now());
    assert_eq!(failure(&s), None, "removed once manageReplicas succeeds");
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Available"));
}

// Mirrors syncReplicaSet's FilterActivePods before claimPods, and ClaimObject's rules.
#[test]
fn only_active_pods_are_claimed_adopted_or_released() {
    let selector = crate::api::selector::Selector::parse("app=web").unwrap();
    let ours = json!([{"apiVersion": API_VERSION, "kind": KIND, "name": "web", "uid": "u1", "controller": true}]);
    let theirs =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u2", "controller": true}]);
    let pod_with = |name: &str, app: &str, owners: &Value, phase: &str| {
        Arc::new(pod(json!({"metadata": {"name": name, "labels": {"app": app}, "ownerReferences": owners},
            "status": {"phase": phase}})))
    };
    let none = json!([]);
    let pods = [
        pod_with("owned", "web", &ours, "Running"),
        pod_with("owned-unknown", "web", &ours, "Unknown"),
        pod_with("owned-relabelled", "db", &ours, "Running"),
        pod_with("owned-failed-relabelled", "db", &ours, "Failed"),
        pod_with("orphan", "web", &none, "Pending"),
        pod_with("orphan-unknown", "web", &none, "Unknown"),
        pod_with("orphan-failed", "web", &none, "Failed"),
        pod_with("orphan-succeeded", "web", &none, "Succeeded"),
        pod_with("orphan-other-app", "db", &none, "Running"),
        pod_with("someone-elses", "web", &theirs, "Running"),
        Arc::new(pod(json!({"metadata": {"name": "orphan-deleting", "labels": {"app": "web"},
            "deletionTimestamp": "2026-01-01T00:00:00Z"}}))),
    ];
    let got: Vec<(String, Claim)> =
        claims(&pods, "u1", &selector).into_iter().map(|(p, c)| (p.name_any(), c)).collect();
    let want = [
        ("owned", Claim::Owned),
        ("owned-unknown", Claim::Owned),
        ("owned-relabelled", Claim::Release),
        ("orphan", Claim::Adopt),
        ("orphan-unknown", Claim::Adopt),
    ];
    assert_eq!(got, want.map(|(n, c)| (n.to_owned(), c)));
}

// Mirrors calculateStatus's fullyLabeledReplicas, and syncReplicaSet's FilterTerminatingPods then
// FilterClaimedPods for terminatingReplicas.
#[test]
fn status_counts_fully_labelled_pods_and_the_podsets_terminating_ones() {
    let ps: PodSet = serde_json::from_value(json!({"metadata": {"name": "web", "uid": "u1"}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web", "tier": "front"}}}}}))
    .unwrap();
    let ours = json!([{"apiVersion": API_VERSION, "kind": KIND, "name": "web", "uid": "u1", "controller": true}]);
    let old = json!([{"apiVersion": API_VERSION, "kind": KIND, "name": "web", "uid": "u0", "controller": true}]);
    let with = |name: &str, labels: Value, owners: &Value, deleting: bool, phase: &str| {
        let mut meta = json!({"name": name, "labels": labels, "ownerReferences": owners});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(pod(json!({"metadata": meta, "status": {"phase": phase}})))
    };
    let (full, partial) = (json!({"app": "web", "tier": "front", "extra": "x"}), json!({"app": "web"}));
    let pods = [
        with("full", full.clone(), &ours, false, "Running"),
        with("partial", partial.clone(), &ours, false, "Running"),
        with("stopping", full.clone(), &ours, true, "Running"),
        with("stopping-relabelled", json!({"app": "db"}), &ours, true, "Running"),
        with("stopped", full.clone(), &ours, true, "Succeeded"),
        with("stopping-of-a-former-web", full.clone(), &old, true, "Running"),
        with("stopping-orphan", full, &json!([]), true, "Running"),
    ];
    let selector = ps.selector().unwrap();
    assert_eq!(terminating(&pods, "u1", &selector), 1, "only `stopping` is ours, selected and not yet stopped");
    let active = [pods[0].as_ref(), pods[1].as_ref()];
    let s = status_of(&ps, &Counted { active: &active, terminating: 1 }, None, jiff::Timestamp::now());
    assert_eq!((s.replicas, s.fully_labeled_replicas, s.terminating_replicas), (2, 1, Some(1)));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!((json["fullyLabeledReplicas"].clone(), json["terminatingReplicas"].clone()), (json!(1), json!(1)));
    let none = status_of(&ps, &counted(&[]), None, jiff::Timestamp::now());
    let json = serde_json::to_value(&none).unwrap();
    assert_eq!(json.get("fullyLabeledReplicas"), None, "omitted when 0, as a ReplicaSet's");
    assert_eq!(json["terminatingReplicas"], 0, "always reported, as kube 1.35's ReplicaSet controller");
}

// Mirrors getIndirectlyRelatedPods: every PodSet of the same controller selects related Pods, each counted once.
#[test]
fn related_pods_are_those_of_every_podset_of_the_same_controller() {
    let podset = |name: &str, app: &str| -> PodSet {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": app}}}}))
        .unwrap()
    };
    let labelled = |name: &str, labels: Value| {
        Arc::new(pod(json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels}})))
    };
    let pods = [
        labelled("a", json!({"app": "web"})),
        labelled("b", json!({"app": "web", "tier": "front"})),
        labelled("c", json!({"app": "api"})),
        labelled("d", json!({"app": "db"})),
    ];
    let owned_by = |mut ps: PodSet, uid: &str| {
        ps.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "d".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        ps
    };
    let all = vec![
        owned_by(podset("web", "web"), "d1"),
        owned_by(podset("front", "web"), "d1"),
        owned_by(podset("api", "api"), "d1"),
        owned_by(podset("db", "db"), "d2"),
        podset("alone", "db"),
    ];
    let siblings = siblings("d1", all);
    let names: Vec<String> = siblings.iter().map(|s| s.name_any()).collect();
    assert_eq!(names, ["web", "front", "api"], "only the PodSets of the same controller, by UID");
    let related: Vec<String> = related_pods(&siblings, &pods).iter().map(|p| p.name_any()).collect();
    assert_eq!(related, ["a", "b", "c"]);
    assert!(related_pods(&[], &pods).is_empty(), "no controller: no related Pods, every rank 0");
}
