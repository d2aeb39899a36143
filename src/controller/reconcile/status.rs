//! The status a pass computes: counts, and the Ready, Reconciling and ReplicaFailure conditions.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::super::pods::{is_available, is_ready};
use super::records::{FAILED_CREATE, FAILED_DELETE};
use crate::api::{PodSet, PodSetStatus};

/// The Pods a status counts: the claimed active ones, and how many of the PodSet's are terminating.
pub(super) struct Counted<'a> {
    pub(super) active: &'a [&'a Pod],
    pub(super) terminating: usize,
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

pub(super) fn status_of(ps: &PodSet, pods: &Counted, failure: Option<&str>, at: jiff::Timestamp) -> PodSetStatus {
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
