//! One PodSet, one pass: claim Pods (adopt orphans, release mismatches), create or delete toward `spec.replicas`,
//! then write status if it changed.

use std::cmp::Reverse;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Context;
use crate::api::{PodSet, PodSetStatus, UserInfo, API_VERSION, KIND};
use crate::registry::{self, PodSetKey, Revision, WriteOptions};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the PodSet: {0}")]
    Read(#[source] registry::Error),
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("writing status: {0}")]
    Status(#[source] registry::Error),
    #[error("creating pods failed: {0}")]
    Create(#[source] kube::Error),
    #[error("PodSet status changed underneath; retrying")]
    Conflict,
    #[error("the controller's Lease may have lapsed: no more writes until it is renewed")]
    NotLeading,
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    pod.metadata.deletion_timestamp.is_none() && (phase == "Pending" || phase == "Running")
}

/// The Pod's Ready condition, when it is true.
fn ready(pod: &Pod) -> Option<&PodCondition> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True")
}

fn is_ready(pod: &Pod) -> bool {
    ready(pod).is_some()
}

/// kube's `IsPodAvailable`: ready, and for at least `min_ready_seconds` by its Ready condition's last transition.
fn is_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    let Some(ready) = ready(pod) else { return false };
    if min_ready_seconds <= 0 {
        return true;
    }
    ready
        .last_transition_time
        .as_ref()
        .is_some_and(|t| t.0.as_second() + i64::from(min_ready_seconds) <= now.as_second())
}

/// Which Pods to delete first: unscheduled, then Pending, then not ready, then the newest.
fn deletion_rank(pod: &Pod) -> (bool, bool, bool, Reverse<i64>) {
    let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0);
    (scheduled, running, is_ready(pod), Reverse(created))
}

fn owner_reference(ps: &PodSet) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        name: ps.name_any(),
        uid: ps.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn object_reference(ps: &PodSet) -> ObjectReference {
    ObjectReference {
        api_version: Some(API_VERSION.into()),
        kind: Some(KIND.into()),
        name: ps.metadata.name.clone(),
        namespace: ps.metadata.namespace.clone(),
        uid: ps.metadata.uid.clone(),
        resource_version: ps.metadata.resource_version.clone(),
        field_path: None,
    }
}

fn pod_from_template(ps: &PodSet) -> Pod {
    let template = ps.spec.template.clone().unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ps.name_any())),
            namespace: ps.namespace(),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![owner_reference(ps)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// One pass over one PodSet: a root span of its own, each call to kube-apiserver its child.
pub(crate) async fn reconcile(ctx: &Arc<Context>, key: &PodSetKey) -> Result<(), Error> {
    let span =
        || tracing::info_span!(target: crate::trace::ROOT, "reconcile", namespace = %key.namespace, name = %key.name);
    crate::trace::new_trace(span, reconcile_once(ctx, key)).await
}

async fn reconcile_once(ctx: &Arc<Context>, key: &PodSetKey) -> Result<(), Error> {
    let ns = key.namespace.as_str();
    // From the cache: the change that queued this key is in it, and writes compare revisions anyway.
    let obj = match ctx.registry.get(key, Some(0)).await {
        Ok(obj) => obj,
        Err(registry::Error::NotFound { .. }) => {
            ctx.expectations.forget(key);
            return Ok(());
        }
        Err(e) => return Err(Error::Read(e)),
    };
    let ps = obj.decode().map_err(Error::Read)?;
    if ps.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the Pods through their ownerReferences.
        return Ok(());
    }
    let uid = ps.uid().unwrap_or_default();
    let selector = ps.selector().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);

    let mut owned: Vec<Arc<Pod>> = Vec::new();
    for pod in ctx.pods.state().into_iter().filter(|p| p.namespace().as_deref() == Some(ns)) {
        let controller = pod.owner_references().iter().find(|r| r.controller == Some(true)).cloned();
        let matches = !selector.is_empty() && selector.matches(pod.labels());
        match controller {
            Some(r) if r.uid == uid => {
                if matches {
                    owned.push(pod);
                } else {
                    ctx.before_write().await?;
                    release(&pods_api, &pod, &uid).await?;
                }
            }
            None if matches && pod.metadata.deletion_timestamp.is_none() => {
                ctx.before_write().await?;
                adopt(&pods_api, &pod, &ps).await?;
                owned.push(pod);
            }
            _ => {}
        }
    }
    let active: Vec<&Pod> = owned.iter().map(|p| p.as_ref()).filter(|p| is_active(p)).collect();

    let mut failure: Option<String> = None;
    if ctx.expectations.satisfied(key) {
        if let Err(e) = manage(ctx, key, &ps, &pods_api, &active).await {
            failure = Some(e.to_string());
            write_status(ctx, key, obj.resource_version(), &ps, &active, failure.as_deref()).await?;
            return Err(e);
        }
    }
    write_status(ctx, key, obj.resource_version(), &ps, &active, failure.as_deref()).await
}

async fn adopt(api: &Api<Pod>, pod: &Pod, ps: &PodSet) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": [owner_reference(ps)], "uid": pod.uid()}});
    api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch)).await?;
    tracing::info!(pod = %pod.name_any(), podset = %ps.name_any(), "adopted orphan pod");
    Ok(())
}

async fn release(api: &Api<Pod>, pod: &Pod, owner_uid: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": owner_uid}], "uid": pod.uid()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn manage(
    ctx: &Arc<Context>,
    key: &PodSetKey,
    ps: &PodSet,
    api: &Api<Pod>,
    active: &[&Pod],
) -> Result<(), Error> {
    let want = ps.spec.replicas.unwrap_or(1).max(0) as usize;
    let reference = object_reference(ps);
    if active.len() < want {
        let missing = (want - active.len()).min(ctx.cfg.burst_replicas);
        ctx.expectations.expect_creations(key, missing);
        let template = pod_from_template(ps);
        let post = PostParams::default();
        // Slow start, as the ReplicaSet controller: batches of 1, 2, 4, ... so a failing template fails fast.
        let (mut done, mut batch) = (0, 1);
        while done < missing {
            let n = batch.min(missing - done);
            let results = join_all((0..n).map(|_| async {
                ctx.before_write().await?;
                api.create(&post, &template).await.map_err(Error::Create)
            }))
            .await;
            let mut errors: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
            let created = n - errors.len();
            done += n;
            if created > 0 {
                publish(ctx, &reference, EventType::Normal, "SuccessfulCreate", format!("Created {created} pod(s)"))
                    .await;
            }
            if !errors.is_empty() {
                // Give up the creates that failed and the ones never tried.
                for _ in 0..errors.len() + (missing - done) {
                    ctx.expectations.creation_observed(key);
                }
                let first = errors.swap_remove(0);
                if let Error::Create(e) = &first {
                    publish(ctx, &reference, EventType::Warning, "FailedCreate", format!("Error creating: {e}")).await;
                }
                return Err(first);
            }
            batch *= 2;
        }
    } else if active.len() > want {
        let mut victims: Vec<&Pod> = active.to_vec();
        victims.sort_by_key(|p| deletion_rank(p));
        victims.truncate((active.len() - want).min(ctx.cfg.burst_replicas));
        ctx.expectations.expect_deletions(key, victims.iter().map(|p| p.uid().unwrap_or_default()));
        let results = join_all(victims.iter().map(|p| async move {
            let r = async {
                ctx.before_write().await?;
                api.delete(&p.name_any(), &DeleteParams::default()).await.map_err(Error::Kube)
            };
            (p, r.await)
        }))
        .await;
        let mut deleted = 0;
        let mut failed = None;
        for (pod, r) in results {
            match r {
                Ok(_) => deleted += 1,
                Err(Error::Kube(kube::Error::Api(s))) if s.is_not_found() => {
                    ctx.expectations.deletion_observed(key, &pod.uid().unwrap_or_default())
                }
                Err(e) => {
                    ctx.expectations.deletion_observed(key, &pod.uid().unwrap_or_default());
                    failed = Some(e);
                }
            }
        }
        if deleted > 0 {
            publish(ctx, &reference, EventType::Normal, "SuccessfulDelete", format!("Deleted {deleted} pod(s)")).await;
        }
        if let Some(e) = failed {
            if let Error::Kube(k) = &e {
                publish(ctx, &reference, EventType::Warning, "FailedDelete", format!("Error deleting: {k}")).await;
            }
            return Err(e);
        }
    }
    Ok(())
}

async fn publish(ctx: &Context, reference: &ObjectReference, type_: EventType, reason: &str, note: String) {
    let ev = KubeEvent { type_, reason: reason.into(), note: Some(note), action: reason.into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&ev, reference).await {
        tracing::debug!(error = %e, "publishing an event failed");
    }
}

/// Why a PodSet has not settled, in the words kstatus (Flux, kpt, Argo CD's and cli-utils' status) uses for a
/// ReplicaSet, checked in its order; `None` once it has.
fn unsettled(desired: i32, replicas: i32, available: i32, ready: i32, failure: bool) -> Option<(&'static str, String)> {
    if failure {
        Some(("ReplicaFailure", "Replica Failure condition. Check Pods".to_owned()))
    } else if desired > available {
        Some(("LessAvailable", format!("Available: {available}/{desired}")))
    } else if desired > ready {
        Some(("LessReady", format!("Ready: {ready}/{desired}")))
    } else if replicas > desired {
        Some(("ExtraPods", format!("Pending termination: {}", replicas - desired)))
    } else {
        None
    }
}

/// `condition` with its last transition time kept from `old` while its status stays the same.
fn transition(old: &[Condition], mut condition: Condition) -> Condition {
    if let Some(prev) = old.iter().find(|c| c.type_ == condition.type_ && c.status == condition.status) {
        condition.last_transition_time = prev.last_transition_time.clone();
    }
    condition
}

fn status_of(ps: &PodSet, active: &[&Pod], failure: Option<&str>, at: jiff::Timestamp) -> PodSetStatus {
    let old = ps.status.clone().unwrap_or_default();
    let ready = active.iter().filter(|p| is_ready(p)).count() as i32;
    let available = active.iter().filter(|p| is_available(p, ps.spec.min_ready_seconds, at)).count() as i32;
    let mut pod_names: Vec<String> = active.iter().map(|p| p.name_any()).collect();
    pod_names.sort();
    let desired = ps.spec.replicas.unwrap_or(1);
    let mut conditions: Vec<Condition> = old
        .conditions
        .iter()
        .filter(|c| !matches!(c.type_.as_str(), "ReplicaFailure" | "Ready" | "Reconciling"))
        .cloned()
        .collect();
    // Ready and Reconciling, the conditions `kubectl wait` and kstatus read of a workload that is not built in:
    // Reconciling is true, and Ready false, until the Pods are there and ready, as kstatus judges a ReplicaSet.
    let condition = |type_: &str, status: bool, reason: &str, message: String| Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: now(),
        observed_generation: ps.metadata.generation,
    };
    let (ready_condition, reconciling) =
        match unsettled(desired, active.len() as i32, available, ready, failure.is_some()) {
            Some((reason, message)) => {
                (condition("Ready", false, reason, message.clone()), condition("Reconciling", true, reason, message))
            }
            None => {
                let message = format!("PodSet is available. Replicas: {}", active.len());
                (
                    condition("Ready", true, "Available", message.clone()),
                    condition("Reconciling", false, "Available", message),
                )
            }
        };
    conditions.push(transition(&old.conditions, ready_condition));
    conditions.push(transition(&old.conditions, reconciling));
    if let Some(message) = failure {
        let previous = ps.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "ReplicaFailure"));
        let since = previous.map(|c| c.last_transition_time.clone()).unwrap_or_else(now);
        conditions.push(Condition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: "FailedCreate".into(),
            message: message.to_owned(),
            last_transition_time: since,
            observed_generation: ps.metadata.generation,
        });
    }
    PodSetStatus {
        replicas: active.len() as i32,
        ready_replicas: ready,
        available_replicas: available,
        pod_names,
        observed_generation: ps.metadata.generation,
        conditions,
    }
}

fn now() -> Time {
    let t = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// The manager the controller's status writes are recorded under.
pub const FIELD_MANAGER: &str = "podset-controller";
/// Who the controller's in-process writes are made as (admission sees this user), after kube-apiserver's own
/// in-process client, `system:apiserver`.
pub const CONTROLLER_USER: &str = "system:podset-controller";

fn controller_user() -> UserInfo {
    UserInfo::named(CONTROLLER_USER, Vec::new()).authenticated()
}

/// Writes status through the registry, as a write to `/status` on the revision this pass read, only when it
/// changed.
async fn write_status(
    ctx: &Context,
    key: &PodSetKey,
    read_at: Revision,
    ps: &PodSet,
    active: &[&Pod],
    failure: Option<&str>,
) -> Result<(), Error> {
    let status = status_of(ps, active, failure, jiff::Timestamp::now());
    // Ready Pods not yet available become so with time alone: look again then, as kube's ReplicaSet controller.
    if ps.spec.min_ready_seconds > 0 && status.ready_replicas != status.available_replicas {
        ctx.queue.add_after(key, std::time::Duration::from_secs(ps.spec.min_ready_seconds as u64));
    }
    if ps.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let opts = WriteOptions::manager(FIELD_MANAGER, controller_user());
    match ctx.registry.update_status(key, status, read_at, &opts).await {
        Ok(_) => Ok(()),
        Err(registry::Error::Conflict { .. }) => Err(Error::Conflict),
        Err(registry::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(Error::Status(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::owner_key;
    use super::*;
    use serde_json::Value;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn deletes_unscheduled_then_pending_then_unready_then_newest() {
        let unscheduled = pod(json!({"metadata": {"name": "u", "creationTimestamp": "2026-01-01T00:00:00Z"}}));
        let ready_old = pod(
            json!({"metadata": {"name": "ro", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        let ready_new = pod(
            json!({"metadata": {"name": "rn", "creationTimestamp": "2026-01-02T00:00:00Z"}, "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        let not_ready = pod(
            json!({"metadata": {"name": "nr", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Running"}}),
        );
        let pending = pod(
            json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n", "containers": []}, "status": {"phase": "Pending"}}),
        );
        let mut all = [&ready_old, &ready_new, &not_ready, &pending, &unscheduled];
        all.sort_by_key(|p| deletion_rank(p));
        let names: Vec<String> = all.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, vec!["u", "p", "nr", "rn", "ro"]);
    }

    #[test]
    fn only_live_pods_count() {
        assert!(is_active(&pod(json!({"metadata": {"name": "a"}}))));
        assert!(is_active(&pod(json!({"metadata": {"name": "a"}, "status": {"phase": "Running"}}))));
        assert!(!is_active(&pod(json!({"metadata": {"name": "a"}, "status": {"phase": "Failed"}}))));
        assert!(!is_active(&pod(json!({"metadata": {"name": "a"}, "status": {"phase": "Succeeded"}}))));
        assert!(!is_active(&pod(json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}}))));
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
            owner_key(&Pod { metadata: ObjectMeta { namespace: Some("ns".into()), ..p.metadata.clone() }, ..p }),
            Some(PodSetKey::new("ns", "web"))
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
            serde_json::from_value(json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 2}}))
                .unwrap();
        let cond = |s: &PodSetStatus, t: &str| {
            let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let (a, b) = (ready_pod("a"), ready_pod("b"));
        let s = status_of(&ps, &[&a, &pending], None, jiff::Timestamp::now());
        assert_eq!(cond(&s, "Ready"), ("False".into(), "LessAvailable".into(), "Available: 1/2".into()));
        assert_eq!(cond(&s, "Reconciling"), ("True".into(), "LessAvailable".into(), "Available: 1/2".into()));
        assert_eq!(s.conditions[0].observed_generation, Some(2));

        ps.status = Some(s.clone());
        let settled = status_of(&ps, &[&a, &b], None, jiff::Timestamp::now());
        assert_eq!(
            cond(&settled, "Ready"),
            ("True".into(), "Available".into(), "PodSet is available. Replicas: 2".into())
        );
        assert_eq!(cond(&settled, "Reconciling").0, "False");
        ps.status = Some(settled.clone());
        assert_eq!(
            status_of(&ps, &[&a, &b], None, jiff::Timestamp::now()),
            settled,
            "nothing changed: the same status, no write"
        );

        let extra = ready_pod("c");
        let s = status_of(&ps, &[&a, &b, &extra], None, jiff::Timestamp::now());
        assert_eq!(cond(&s, "Reconciling"), ("True".into(), "ExtraPods".into(), "Pending termination: 1".into()));
        let s = status_of(&ps, &[&a, &b], Some("quota exceeded"), jiff::Timestamp::now());
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
        let mut ps: PodSet = serde_json::from_value(
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "minReadySeconds": 30}}),
        )
        .unwrap();
        ps.metadata.generation = Some(1);
        let s = status_of(&ps, &[&old, &new], None, now);
        assert_eq!((s.ready_replicas, s.available_replicas), (2, 1));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.message.as_str()), ("False", "Available: 1/2"));
    }
}
