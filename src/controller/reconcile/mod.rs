//! One PodSet, one pass: claim Pods (adopt orphans, release mismatches), create or delete toward `spec.replicas`,
//! then write status if it changed. The steps, events and `ReplicaFailure` are kube's ReplicaSet controller's
//! (`syncReplicaSet`, `manageReplicas`, `calculateStatus`).

use std::collections::HashSet;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::events::Record;
use super::pods::{is_active, is_available, is_ready, is_terminating, pods_to_delete};
use super::{controller_of, Context};
use crate::api::selector::Selector;
use crate::api::{PodSet, PodSetStatus, UserInfo, API_VERSION, KIND};
use crate::registry::{self, ListRequest, PodSetKey, Revision, WriteOptions};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the PodSet: {0}")]
    Read(#[source] registry::Error),
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("writing status: {0}")]
    Status(#[source] registry::Error),
    /// A create kube-apiserver refused, in its words: the message of `ReplicaFailure` as for a ReplicaSet.
    #[error("{}", api_message(.0))]
    Create(#[source] kube::Error),
    #[error("unable to delete pods: {}", api_message(.0))]
    Delete(#[source] kube::Error),
    #[error("can't adopt Pod {pod} ({uid}): {reason}")]
    Adopt { pod: String, uid: String, reason: String },
    #[error("PodSet status changed underneath; retrying")]
    Conflict,
    #[error("the controller's Lease may have lapsed: no more writes until it is renewed")]
    NotLeading,
}

/// What a Go client's error says: a `Status`'s message alone, anything else as it displays.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// A create refused because its namespace is terminating (`HasStatusCause(err, NamespaceTerminatingCause)`).
fn namespace_terminating(e: &kube::Error) -> bool {
    let kube::Error::Api(status) = e else { return false };
    status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
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

    let all: Vec<Arc<Pod>> = ctx.pods.state().into_iter().filter(|p| p.namespace().as_deref() == Some(ns)).collect();
    let mut owned: Vec<Arc<Pod>> = Vec::new();
    let mut can_adopt: Option<Result<(), String>> = None;
    let mut first_error: Option<Error> = None;
    for (pod, claim) in claims(&all, &uid, &selector) {
        let claimed = match claim {
            Claim::Owned => Ok(true),
            Claim::Release => {
                ctx.before_write().await?;
                release(&pods_api, &pod, &uid).await.map(|()| false)
            }
            Claim::Adopt => {
                let allowed = match &can_adopt {
                    Some(allowed) => allowed.clone(),
                    None => can_adopt.insert(recheck(ctx, key, &ps).await).clone(),
                };
                match allowed {
                    Err(reason) => Err(Error::Adopt {
                        pod: format!("{ns}/{}", pod.name_any()),
                        uid: pod.uid().unwrap_or_default(),
                        reason,
                    }),
                    Ok(()) => {
                        ctx.before_write().await?;
                        adopt(&pods_api, &pod, &ps).await
                    }
                }
            }
        };
        match claimed {
            Ok(true) => owned.push(pod),
            Ok(false) => {}
            // As `ClaimPods`: claim the rest, then fail the pass with the first error.
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let active: Vec<&Pod> = owned.iter().map(|p| p.as_ref()).collect();
    let pods = Counted { active: &active, terminating: terminating(&all, &uid, &selector) };

    if ctx.expectations.satisfied(key) {
        if let Err(e) = manage(ctx, key, &ps, &pods_api, &active, &all).await {
            if let Some(failure) = replica_failure(&e) {
                write_status(ctx, key, obj.resource_version(), &ps, &pods, Some(&failure)).await?;
            }
            return Err(e);
        }
    }
    write_status(ctx, key, obj.resource_version(), &ps, &pods, None).await
}

/// The Pods a status counts: the claimed active ones, and how many of the PodSet's are terminating.
struct Counted<'a> {
    active: &'a [&'a Pod],
    terminating: usize,
}

/// `syncReplicaSet`'s terminating Pods: `FilterTerminatingPods`, then `FilterClaimedPods` (ours by UID, selected).
fn terminating(pods: &[Arc<Pod>], uid: &str, selector: &Selector) -> usize {
    let claimed = |p: &Pod| {
        controller_of(&p.metadata).is_some_and(|r| r.uid == uid) && !selector.is_empty() && selector.matches(p.labels())
    };
    pods.iter().filter(|p| is_terminating(p) && claimed(p)).count()
}

/// What `ReplicaFailure` says of a failed pass: the API server's refusal. None when this replica stopped itself
/// because its Lease may have lapsed: that is no failure of the PodSet's, and a replica that may no longer lead
/// writes nothing, status included.
fn replica_failure(e: &Error) -> Option<String> {
    match e {
        Error::NotLeading => None,
        e => Some(e.to_string()),
    }
}

/// What to do with a Pod in a claim (upstream's `ClaimObject`, for a PodSet not being deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Ours, and the selector matches.
    Owned,
    /// An orphan the selector matches.
    Adopt,
    /// Ours, but the selector no longer matches.
    Release,
}

/// The claims of one pass over the namespace's Pods: only active ones, as `syncReplicaSet` filters them before
/// `claimPods`, so a Succeeded or Failed orphan is never adopted and a terminated Pod of ours never released.
fn claims(pods: &[Arc<Pod>], uid: &str, selector: &Selector) -> Vec<(Arc<Pod>, Claim)> {
    let matches = |pod: &Pod| !selector.is_empty() && selector.matches(pod.labels());
    let claim = |pod: &Pod| match controller_of(&pod.metadata) {
        Some(r) if r.uid != uid => None,
        Some(_) if matches(pod) => Some(Claim::Owned),
        Some(_) => Some(Claim::Release),
        None if matches(pod) => Some(Claim::Adopt),
        None => None,
    };
    pods.iter().filter(|p| is_active(p)).filter_map(|p| claim(p).map(|c| (p.clone(), c))).collect()
}

/// Upstream's `canAdopt` (`RecheckDeletionTimestamp`): before the first adoption of a pass, a consistent read that
/// the PodSet is still the one listed and not being deleted.
async fn recheck(ctx: &Context, key: &PodSetKey, ps: &PodSet) -> Result<(), String> {
    #[cfg(feature = "planted-bugs")]
    if crate::planted::planted(crate::planted::Bug::NoAdoptionRecheck) {
        return Ok(());
    }
    let fresh = match ctx.registry.get(key, None).await.and_then(|o| o.decode()) {
        Ok(fresh) => fresh,
        Err(e) => return Err(format!("can't recheck DeletionTimestamp: {e}")),
    };
    let (got, wanted) = (fresh.uid().unwrap_or_default(), ps.uid().unwrap_or_default());
    if got != wanted {
        return Err(format!(
            "can't recheck DeletionTimestamp: original {KIND} {key} is gone: got uid {got}, wanted {wanted}"
        ));
    }
    match &fresh.metadata.deletion_timestamp {
        Some(t) => Err(format!("{key} has just been deleted at {}", t.0)),
        None => Ok(()),
    }
}

/// Upstream's `AdoptPod`; a Pod gone meanwhile is not claimed.
async fn adopt(api: &Api<Pod>, pod: &Pod, ps: &PodSet) -> Result<bool, Error> {
    let patch = json!({"metadata": {"ownerReferences": [owner_reference(ps)], "uid": pod.uid()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(_) => {
            tracing::info!(pod = %pod.name_any(), podset = %ps.name_any(), "adopted orphan pod");
            Ok(true)
        }
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `ReleasePod`: a Pod gone, or no longer ours (the patch is then invalid), needs nothing more.
async fn release(api: &Api<Pod>, pod: &Pod, owner_uid: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": owner_uid}], "uid": pod.uid()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_invalid() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `getIndirectlyRelatedPods`: the Pods selected by every PodSet with the same controller as `ps`
/// (itself included), each once; none when `ps` has no controller.
async fn indirectly_related_pods<'a>(ctx: &Context, ps: &PodSet, pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
    let Some(owner) = controller_of(&ps.metadata) else { return Vec::new() };
    let list = ListRequest { namespace: ps.namespace(), resource_version: Some(0), ..ListRequest::readable() };
    let podsets: Vec<PodSet> = match ctx.registry.list(list).await {
        Ok(page) => page.items.iter().filter_map(|o| o.decode().ok()).collect(),
        Err(e) => {
            tracing::warn!(podset = %ps.name_any(), error = %e, "listing related PodSets failed");
            return Vec::new();
        }
    };
    related_pods(&siblings(&owner.uid, podsets), pods)
}

/// The PodSets with the controller `uid`.
fn siblings(uid: &str, podsets: Vec<PodSet>) -> Vec<PodSet> {
    podsets.into_iter().filter(|s| controller_of(&s.metadata).is_some_and(|r| r.uid == uid)).collect()
}

fn related_pods<'a>(podsets: &[PodSet], pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
    let mut seen = HashSet::new();
    let mut related = Vec::new();
    for selector in podsets.iter().filter_map(PodSet::selector).filter(|s| !s.is_empty()) {
        for pod in pods.iter().filter(|p| selector.matches(p.labels())) {
            if seen.insert(pod.uid().unwrap_or_default()) {
                related.push(pod.as_ref());
            }
        }
    }
    related
}

/// Event reasons, upstream's (`FailedCreatePodReason` and the others); the failures' are also `ReplicaFailure`'s.
const FAILED_CREATE: &str = "FailedCreate";
const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
const FAILED_DELETE: &str = "FailedDelete";
const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";

// One event per Pod, as upstream's `RealPodControl` records them; the Pod is the event's related object.
fn created(pod: &Pod) -> Record {
    let note = format!("Created pod: {}", pod.name_any());
    Record { warning: false, reason: SUCCESSFUL_CREATE, note, related: Some(pod.object_ref(&())) }
}

/// None in a terminating namespace, where every create fails.
fn create_failed(e: &kube::Error) -> Option<Record> {
    let note = format!("Error creating: {}", api_message(e));
    (!namespace_terminating(e)).then_some(Record { warning: true, reason: FAILED_CREATE, note, related: None })
}

fn deleted(pod: &Pod) -> Record {
    let note = format!("Deleted pod: {}", pod.name_any());
    Record { warning: false, reason: SUCCESSFUL_DELETE, note, related: Some(pod.object_ref(&())) }
}

/// None for a Pod already gone.
fn delete_failed(e: &kube::Error, pod: &Pod) -> Option<Record> {
    let note = format!("Error deleting: {}", api_message(e));
    let event = Record { warning: true, reason: FAILED_DELETE, note, related: Some(pod.object_ref(&())) };
    (!is_not_found(e)).then_some(event)
}

async fn manage(
    ctx: &Arc<Context>,
    key: &PodSetKey,
    ps: &PodSet,
    api: &Api<Pod>,
    active: &[&Pod],
    namespace_pods: &[Arc<Pod>],
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
            done += n;
            let mut errors = Vec::new();
            for result in results {
                match result {
                    Ok(pod) => publish(ctx, &reference, created(&pod)).await,
                    Err(e) => {
                        if let Error::Create(k) = &e {
                            // None in a terminating namespace: nothing to report, as upstream counts it done.
                            let Some(ev) = create_failed(k) else { continue };
                            publish(ctx, &reference, ev).await;
                        }
                        errors.push(e);
                    }
                }
            }
            let failures = errors.len();
            if let Some(first) = errors.into_iter().next() {
                // Give up the creates that failed and the ones never tried.
                for _ in 0..failures + (missing - done) {
                    ctx.expectations.creation_observed(key);
                }
                return Err(first);
            }
            batch *= 2;
        }
    } else if active.len() > want {
        let diff = (active.len() - want).min(ctx.cfg.burst_replicas);
        // Ranks matter only when some Pods stay.
        let related = match diff < active.len() {
            true => indirectly_related_pods(ctx, ps, namespace_pods).await,
            false => Vec::new(),
        };
        let victims = pods_to_delete(active, &related, diff, jiff::Timestamp::now());
        ctx.expectations.expect_deletions(key, victims.iter().map(|p| p.uid().unwrap_or_default()));
        let results = join_all(victims.iter().map(|p| async move {
            let r = async {
                ctx.before_write().await?;
                api.delete(&p.name_any(), &DeleteParams::default()).await.map_err(Error::Delete)
            };
            (p, r.await)
        }))
        .await;
        let mut failed = None;
        for (pod, r) in results {
            match r {
                Ok(_) => publish(ctx, &reference, deleted(pod)).await,
                Err(e) => {
                    // The watch will not show this delete: stop waiting for it.
                    ctx.expectations.deletion_observed(key, &pod.uid().unwrap_or_default());
                    if let Error::Delete(k) = &e {
                        // None for a Pod already gone: no failure.
                        let Some(ev) = delete_failed(k, pod) else { continue };
                        publish(ctx, &reference, ev).await;
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(())
}

async fn publish(ctx: &Context, reference: &ObjectReference, record: Record) {
    if let Err(e) = ctx.recorder.publish(record, reference).await {
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

/// `ReplicaFailure`'s reason, by which way `manageReplicas` was going: too few Pods, too many.
fn failure_reason(active: usize, desired: i32) -> &'static str {
    match (active as i64).cmp(&i64::from(desired)) {
        std::cmp::Ordering::Less => FAILED_CREATE,
        std::cmp::Ordering::Greater => FAILED_DELETE,
        std::cmp::Ordering::Equal => "",
    }
}

/// `condition` with its last transition time kept from `old` while its status stays the same.
fn transition(old: &[Condition], mut condition: Condition) -> Condition {
    if let Some(prev) = old.iter().find(|c| c.type_ == condition.type_ && c.status == condition.status) {
        condition.last_transition_time = prev.last_transition_time.clone();
    }
    condition
}

fn status_of(ps: &PodSet, pods: &Counted, failure: Option<&str>, at: jiff::Timestamp) -> PodSetStatus {
    let active = pods.active;
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
    // As `calculateStatus`: set once when manageReplicas fails, kept as it is while it keeps failing, gone after.
    let previous = old.conditions.iter().find(|c| c.type_ == "ReplicaFailure");
    match (failure, previous) {
        (Some(_), Some(previous)) => conditions.push(previous.clone()),
        (Some(message), None) => conditions.push(Condition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: failure_reason(active.len(), desired).into(),
            message: message.to_owned(),
            last_transition_time: now(),
            observed_generation: ps.metadata.generation,
        }),
        (None, _) => {}
    }
    // `calculateStatus`: the Pods whose labels hold the template's, which may say more than the selector.
    let template_labels = ps.spec.template.as_ref().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.as_ref());
    let fully_labeled = active
        .iter()
        .filter(|p| template_labels.into_iter().flatten().all(|(k, v)| p.labels().get(k) == Some(v)))
        .count() as i32;
    PodSetStatus {
        replicas: active.len() as i32,
        fully_labeled_replicas: fully_labeled,
        ready_replicas: ready,
        available_replicas: available,
        terminating_replicas: Some(pods.terminating as i32),
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
    pods: &Counted<'_>,
    failure: Option<&str>,
) -> Result<(), Error> {
    let status = status_of(ps, pods, failure, jiff::Timestamp::now());
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
    use super::super::{controller, Controller};
    use super::*;
    use serde_json::Value;

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
            serde_json::from_value(json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 2}}))
                .unwrap();
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
        assert_eq!(
            cond(&settled, "Ready"),
            ("True".into(), "Available".into(), "PodSet is available. Replicas: 2".into())
        );
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
        let mut ps: PodSet = serde_json::from_value(
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "minReadySeconds": 30}}),
        )
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
            Some(Record {
                warning: true,
                reason: "FailedCreate",
                note: format!("Error creating: {quota}"),
                related: None
            })
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
            serde_json::from_value(json!({"metadata": {"name": "web", "generation": 1}, "spec": {"replicas": 2}}))
                .unwrap();
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
}
