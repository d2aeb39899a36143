//! The events a pass records, one per Pod created or deleted, as upstream's `RealPodControl`.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{Resource, ResourceExt};

use super::super::events::Record;
use super::super::Context;
use super::{api_message, is_not_found};

/// Event reasons, upstream's (`FailedCreatePodReason` and the others); the failures' are also `ReplicaFailure`'s.
pub(super) const FAILED_CREATE: &str = "FailedCreate";
const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
pub(super) const FAILED_DELETE: &str = "FailedDelete";
const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";

/// A create refused because its namespace is terminating (`HasStatusCause(err, NamespaceTerminatingCause)`).
fn namespace_terminating(e: &kube::Error) -> bool {
    let kube::Error::Api(status) = e else { return false };
    status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

// One event per Pod, as upstream's `RealPodControl` records them; the Pod is the event's related object.
pub(super) fn created(pod: &Pod) -> Record {
    let note = format!("Created pod: {}", pod.name_any());
    Record { warning: false, reason: SUCCESSFUL_CREATE, note, related: Some(pod.object_ref(&())) }
}

/// None in a terminating namespace, where every create fails.
pub(super) fn create_failed(e: &kube::Error) -> Option<Record> {
    let note = format!("Error creating: {}", api_message(e));
    (!namespace_terminating(e)).then_some(Record { warning: true, reason: FAILED_CREATE, note, related: None })
}

pub(super) fn deleted(pod: &Pod) -> Record {
    let note = format!("Deleted pod: {}", pod.name_any());
    Record { warning: false, reason: SUCCESSFUL_DELETE, note, related: Some(pod.object_ref(&())) }
}

/// None for a Pod already gone.
pub(super) fn delete_failed(e: &kube::Error, pod: &Pod) -> Option<Record> {
    let note = format!("Error deleting: {}", api_message(e));
    let event = Record { warning: true, reason: FAILED_DELETE, note, related: Some(pod.object_ref(&())) };
    (!is_not_found(e)).then_some(event)
}

pub(super) async fn publish(ctx: &Context, reference: &ObjectReference, record: Record) {
    if let Err(e) = ctx.recorder.publish(record, reference).await {
        tracing::debug!(error = %e, "publishing an event failed");
    }
}
