//! One PodSet, one pass: claim Pods (adopt orphans, release mismatches), create or delete toward `spec.replicas`,
//! then write status if it changed. The steps, events and `ReplicaFailure` are kube's ReplicaSet controller's
//! (`syncReplicaSet`, `manageReplicas`, `calculateStatus`).

mod claims;
mod records;
mod status;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};

use self::claims::{adopt, claims, indirectly_related_pods, recheck, release, terminating, Claim};
use self::records::{create_failed, created, delete_failed, deleted, publish};
use self::status::{status_of, Counted};
use super::pods::pods_to_delete;
use super::Context;
use crate::api::{PodSet, Subresource, UserInfo, API_VERSION, KIND};
use crate::registry::{self, Revision, WriteOptions};
use crate::resources::podset::PodSetKey;
use crate::resources::podset::PodSetStrategy;

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
    let ps = obj.decode::<PodSetStrategy>().map_err(Error::Read)?;
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

/// What `ReplicaFailure` says of a failed pass: the API server's refusal. None when this replica stopped itself
/// because its Lease may have lapsed: that is no failure of the PodSet's, and a replica that may no longer lead
/// writes nothing, status included.
fn replica_failure(e: &Error) -> Option<String> {
    match e {
        Error::NotLeading => None,
        e => Some(e.to_string()),
    }
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
    let set = |ps: &mut PodSet| ps.status = Some(status.clone());
    match ctx.registry.update_with(key, Subresource::Status, read_at, &opts, set).await {
        Ok(_) => Ok(()),
        Err(registry::Error::Conflict { .. }) => Err(Error::Conflict),
        Err(registry::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(Error::Status(e)),
    }
}
