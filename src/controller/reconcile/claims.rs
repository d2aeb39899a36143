//! Which Pods a PodSet claims, as kube's `PodControllerRefManager`: adopting orphans, releasing mismatches, and
//! the Pods of its sibling PodSets that rank the ones to delete.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::super::pods::{is_active, is_terminating};
use super::super::{controller_of, Context};
use super::{is_not_found, owner_reference, Error};
use crate::api::selector::Selector;
use crate::api::{PodSet, KIND};
use crate::registry::ListRequest;
use crate::resources::podset::PodSetKey;
use crate::resources::podset::PodSetStrategy;

/// `syncReplicaSet`'s terminating Pods: `FilterTerminatingPods`, then `FilterClaimedPods` (ours by UID, selected).
pub(super) fn terminating(pods: &[Arc<Pod>], uid: &str, selector: &Selector) -> usize {
    let claimed = |p: &Pod| {
        controller_of(&p.metadata).is_some_and(|r| r.uid == uid) && !selector.is_empty() && selector.matches(p.labels())
    };
    pods.iter().filter(|p| is_terminating(p) && claimed(p)).count()
}

/// What to do with a Pod in a claim (upstream's `ClaimObject`, for a PodSet not being deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// Ours, and the selector matches.
    Owned,
    /// An orphan the selector matches.
    Adopt,
    /// Ours, but the selector no longer matches.
    Release,
}

/// The claims of one pass over the namespace's Pods: only active ones, as `syncReplicaSet` filters them before
/// `claimPods`, so a Succeeded or Failed orphan is never adopted and a terminated Pod of ours never released.
pub(super) fn claims(pods: &[Arc<Pod>], uid: &str, selector: &Selector) -> Vec<(Arc<Pod>, Claim)> {
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
pub(super) async fn recheck(ctx: &Context, key: &PodSetKey, ps: &PodSet) -> Result<(), String> {
    #[cfg(feature = "planted-bugs")]
    if crate::planted::planted(crate::planted::Bug::NoAdoptionRecheck) {
        return Ok(());
    }
    let fresh = match ctx.registry.get(key, None).await.and_then(|o| o.decode::<PodSetStrategy>()) {
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
pub(super) async fn adopt(api: &Api<Pod>, pod: &Pod, ps: &PodSet) -> Result<bool, Error> {
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
pub(super) async fn release(api: &Api<Pod>, pod: &Pod, owner_uid: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": owner_uid}], "uid": pod.uid()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_invalid() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `getIndirectlyRelatedPods`: the Pods selected by every PodSet with the same controller as `ps`
/// (itself included), each once; none when `ps` has no controller.
pub(super) async fn indirectly_related_pods<'a>(ctx: &Context, ps: &PodSet, pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
    let Some(owner) = controller_of(&ps.metadata) else { return Vec::new() };
    let list = ListRequest { namespace: ps.namespace(), resource_version: Some(0), ..ListRequest::readable() };
    let podsets: Vec<PodSet> = match ctx.registry.list(list).await {
        Ok(page) => page.items.iter().filter_map(|o| o.decode::<PodSetStrategy>().ok()).collect(),
        Err(e) => {
            tracing::warn!(podset = %ps.name_any(), error = %e, "listing related PodSets failed");
            return Vec::new();
        }
    };
    related_pods(&siblings(&owner.uid, podsets), pods)
}

/// The PodSets with the controller `uid`.
pub(super) fn siblings(uid: &str, podsets: Vec<PodSet>) -> Vec<PodSet> {
    podsets.into_iter().filter(|s| controller_of(&s.metadata).is_some_and(|r| r.uid == uid)).collect()
}

pub(super) fn related_pods<'a>(podsets: &[PodSet], pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
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
