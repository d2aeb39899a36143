//! What the controller asks of a Pod, in kube-controller-manager's words (`pkg/controller/controller_utils.go`,
//! `pkg/api/v1/pod`): is it active, ready, available, and which to delete first when there are too many.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::ResourceExt;

/// The annotation that orders a scale-down: lower cost goes first (upstream's `PodDeletionCost`, on by default).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn node_name(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

/// Upstream's `IsPodActive`: not Succeeded, not Failed, not being deleted. `Unknown` (a node out of touch) is active,
/// so it is neither replaced nor counted out.
pub fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

/// Upstream's `IsPodTerminating`: being deleted, and not yet Succeeded or Failed.
pub fn is_terminating(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_some()
}

/// The Pod's first Ready condition, whatever its status (`GetPodReadyCondition`).
fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    conditions.iter().find(|c| c.type_ == "Ready")
}

/// Upstream's `IsPodReady`.
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// kube's `IsPodAvailable`: ready, and for at least `min_ready_seconds` by its Ready condition's last transition.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    ready_condition(pod)
        .and_then(|c| c.last_transition_time.as_ref())
        .is_some_and(|t| t.0.as_second() + i64::from(min_ready_seconds) <= now.as_second())
}

/// Since when the Pod has been ready, if it is (upstream's `podReadyTime`; `None` is Go's zero time).
fn ready_since(pod: &Pod) -> Option<jiff::Timestamp> {
    ready_condition(pod).filter(|c| c.status == "True")?.last_transition_time.as_ref().map(|t| t.0)
}

/// Upstream's `GetDeletionCostFromPodAnnotations`: 0 when unset or invalid (a `+` sign, leading zeros, not an
/// int32).
pub fn deletion_cost(pod: &Pod) -> i32 {
    let Some(value) = pod.annotations().get(POD_DELETION_COST) else { return 0 };
    let valid_first_digit = match value.as_bytes().first() {
        Some(b'-' | b'1'..=b'9') => true,
        Some(b'0') => value == "0",
        _ => false,
    };
    if !valid_first_digit {
        return 0;
    }
    value.parse().unwrap_or(0)
}

/// `podPhaseToOrdinal`: Pending < Unknown < Running; any other phase (none yet) counts as Pending.
fn phase_ordinal(pod: &Pod) -> u8 {
    match phase(pod) {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

/// The most restarts of a regular container, then of a sidecar (an init container with `restartPolicy: Always`).
fn max_container_restarts(pod: &Pod) -> (i32, i32) {
    let status = pod.status.as_ref();
    let regular = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .fold(0, i32::max);
    let sidecars: HashSet<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| sidecars.contains(c.name.as_str()))
        .map(|c| c.restart_count)
        .fold(0, i32::max);
    (regular, sidecar)
}

/// Go's `afterOrZero`: a zero (missing) time counts as after any other.
fn after_or_zero(t1: Option<jiff::Timestamp>, t2: Option<jiff::Timestamp>) -> bool {
    match (t1, t2) {
        (Some(t1), Some(t2)) => t1 > t2,
        (t1, _) => t1.is_none(),
    }
}

/// `logarithmicRankDiff`: the difference of the base-2 logarithms of both ages in nanoseconds, truncated.
fn logarithmic_rank_diff(t1: jiff::Timestamp, t2: jiff::Timestamp, now: jiff::Timestamp) -> i64 {
    let rank = |t: jiff::Timestamp| {
        let age = now.as_nanosecond() - t.as_nanosecond();
        if age > 0 {
            (age as f64).log2() as i64
        } else {
            -1
        }
    };
    rank(t1) - rank(t2)
}

/// Newer first on the logarithmic scale of `LogarithmicScaleDown`, Pods of one bucket by UID; a missing time first.
fn newer_on_log_scale(
    a: &Pod,
    ta: Option<jiff::Timestamp>,
    b: &Pod,
    tb: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> bool {
    let (Some(ta), Some(tb)) = (ta, tb) else { return after_or_zero(ta, tb) };
    match logarithmic_rank_diff(ta, tb, now) {
        0 => a.metadata.uid < b.metadata.uid,
        diff => diff < 0,
    }
}

/// A Pod with what its rank compares, read from it once rather than on every comparison.
#[derive(Clone, Copy)]
struct Ranked<'a> {
    pod: &'a Pod,
    assigned: bool,
    phase: u8,
    ready: bool,
    cost: i32,
    /// The active related Pods on its node.
    rank: usize,
    ready_since: Option<jiff::Timestamp>,
    restarts: (i32, i32),
    created: Option<jiff::Timestamp>,
}

impl<'a> Ranked<'a> {
    fn new(pod: &'a Pod, rank: usize) -> Self {
        Self {
            pod,
            assigned: !node_name(pod).is_empty(),
            phase: phase_ordinal(pod),
            ready: is_ready(pod),
            cost: deletion_cost(pod),
            rank,
            ready_since: ready_since(pod),
            restarts: max_container_restarts(pod),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// Upstream's `ActivePodsWithRanks.Less`: whether `a` goes before `b` in a scale-down. Each rule in turn until one
/// tells them apart: unassigned, earlier phase, not ready, lower deletion cost, more related Pods on its node,
/// ready for less time, more restarts, created later.
fn delete_before(a: &Ranked<'_>, b: &Ranked<'_>, now: jiff::Timestamp) -> bool {
    if a.assigned != b.assigned {
        return !a.assigned;
    }
    if a.phase != b.phase {
        return a.phase < b.phase;
    }
    if a.ready != b.ready {
        return !a.ready;
    }
    if a.cost != b.cost {
        return a.cost < b.cost;
    }
    if a.rank != b.rank {
        return a.rank > b.rank;
    }
    // Both ready or both not (then neither has a ready time).
    if a.ready_since != b.ready_since {
        return newer_on_log_scale(a.pod, a.ready_since, b.pod, b.ready_since, now);
    }
    if a.restarts.0 != b.restarts.0 {
        return a.restarts.0 > b.restarts.0;
    }
    if a.restarts.1 != b.restarts.1 {
        return a.restarts.1 > b.restarts.1;
    }
    if a.created != b.created {
        return newer_on_log_scale(a.pod, a.created, b.pod, b.created, now);
    }
    false
}

/// Upstream's `getPodsToDelete` over `getPodsRankedByRelatedPodsOnSameNode`: the first `diff` of `active` in
/// [`delete_before`] order, each ranked by the active Pods of `related` on its node (unsorted when all go).
pub fn pods_to_delete<'a>(active: &[&'a Pod], related: &[&Pod], diff: usize, now: jiff::Timestamp) -> Vec<&'a Pod> {
    if diff >= active.len() {
        return active.to_vec();
    }
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for pod in related.iter().filter(|p| is_active(p)) {
        *on_node.entry(node_name(pod)).or_default() += 1;
    }
    let mut ranked: Vec<Ranked<'a>> =
        active.iter().map(|pod| Ranked::new(pod, on_node.get(node_name(pod)).copied().unwrap_or(0))).collect();
    sort_by_less(&mut ranked, &|a, b| delete_before(a, b, now));
    ranked.into_iter().take(diff).map(|r| r.pod).collect()
}

/// A merge sort over Go's `Less`. Upstream's order is not transitive across its logarithmic buckets (UID within a
/// bucket, the next rule on equal times), which `slice::sort_by` may panic on.
fn sort_by_less<T>(items: &mut Vec<T>, less: &impl Fn(&T, &T) -> bool) {
    if items.len() < 2 {
        return;
    }
    let mut right = items.split_off(items.len() / 2);
    sort_by_less(items, less);
    sort_by_less(&mut right, less);
    let left = std::mem::take(items);
    let mut right = right.into_iter().peekable();
    for a in left {
        while let Some(b) = right.next_if(|b| less(b, &a)) {
            items.push(b);
        }
        items.push(a);
    }
    items.extend(right);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    const NOW: &str = "2026-01-01T12:00:00Z";

    /// A Pod on `node` (empty: unscheduled), in `phase`, ready since `ready` (None: not ready), created at `created`.
    fn pod_at(name: &str, node: &str, phase: &str, ready: Option<&str>, created: &str) -> Pod {
        let mut p = pod(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
            "spec": {"containers": []},
            "status": {"phase": phase},
        }));
        if !node.is_empty() {
            p.spec.as_mut().unwrap().node_name = Some(node.into());
        }
        if let Some(t) = ready {
            p.status.as_mut().unwrap().conditions =
                Some(vec![serde_json::from_value(json!({"type": "Ready", "status": "True", "lastTransitionTime": t}))
                    .unwrap()]);
        }
        p
    }

    fn names(pods: &[&Pod]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    // Mirrors upstream's ActivePodsWithRanks.Less as getPodsToDelete sorts with it (TestSortingActivePodsWithRanks).
    #[test]
    fn scale_down_order_follows_active_pods_with_ranks() {
        let now: jiff::Timestamp = NOW.parse().unwrap();
        let old = "2026-01-01T00:00:00Z";
        let unscheduled = pod_at("unscheduled", "", "Pending", None, old);
        let pending = pod_at("pending", "n1", "Pending", None, old);
        let unknown = pod_at("unknown", "n1", "Unknown", None, old);
        let not_ready = pod_at("not-ready", "n1", "Running", None, old);
        let mut cheap = pod_at("cheap", "n1", "Running", Some(old), old);
        cheap.metadata.annotations = Some([(POD_DELETION_COST.into(), "-5".into())].into());
        // Ready on n2, where three related Pods run: doubled up, so before the Pods on n1 (one related Pod).
        let doubled = pod_at("doubled", "n2", "Running", Some(old), old);
        // Ready 10 s and 20 s ago: one logarithmic bucket apart (2^33 < 10 s < 2^34, 2^34 < 20 s < 2^35 ns).
        let ready_10s = pod_at("ready-10s", "n1", "Running", Some("2026-01-01T11:59:50Z"), old);
        let ready_20s = pod_at("ready-20s", "n1", "Running", Some("2026-01-01T11:59:40Z"), old);
        let mut restarted = pod_at("restarted", "n1", "Running", Some(old), old);
        restarted.status.as_mut().unwrap().container_statuses = Some(vec![serde_json::from_value(
            json!({"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 3}),
        )
        .unwrap()]);
        let newer = pod_at("newer", "n1", "Running", Some(old), "2026-01-01T06:00:00Z");
        let oldest = pod_at("oldest", "n1", "Running", Some(old), "2025-01-01T00:00:00Z");
        let active = [
            &oldest,
            &newer,
            &restarted,
            &ready_20s,
            &ready_10s,
            &doubled,
            &cheap,
            &not_ready,
            &unknown,
            &pending,
            &unscheduled,
        ];
        let on_n2: Vec<Pod> = (0..2).map(|i| pod_at(&format!("sibling-{i}"), "n2", "Running", None, old)).collect();
        let failed_on_n1 = pod_at("failed", "n1", "Failed", None, old);
        // Related: n2 has three active Pods, n1 one (the failed Pod does not count), unscheduled one.
        let related = [&doubled, &on_n2[0], &on_n2[1], &oldest, &failed_on_n1, &unscheduled];
        let order = pods_to_delete(&active, &related, active.len() - 1, now);
        assert_eq!(
            names(&order),
            [
                "unscheduled",
                "pending",
                "unknown",
                "not-ready",
                "cheap",
                "doubled",
                "ready-10s",
                "ready-20s",
                "restarted",
                "newer",
            ]
        );
        assert_eq!(names(&pods_to_delete(&active, &related, 1, now)), ["unscheduled"]);
        assert_eq!(names(&pods_to_delete(&active[..2], &related, 2, now)), ["oldest", "newer"], "all go: unsorted");
    }

    // Mirrors ActivePodsWithRanks.Less rules 6 and 8 under LogarithmicScaleDown: one bucket is ordered by UID.
    #[test]
    fn times_in_one_logarithmic_bucket_are_ordered_by_uid() {
        let now: jiff::Timestamp = NOW.parse().unwrap();
        let old = "2026-01-01T00:00:00Z";
        // Ready 40 s and 50 s ago: both in [2^35, 2^36) ns, so the UID decides, not the newer ready time.
        let mut a = pod_at("a", "n", "Running", Some("2026-01-01T11:59:10Z"), old);
        let mut b = pod_at("b", "n", "Running", Some("2026-01-01T11:59:20Z"), old);
        a.metadata.uid = Some("1".into());
        b.metadata.uid = Some("2".into());
        assert_eq!(names(&pods_to_delete(&[&b, &a], &[], 1, now)), ["a"]);
        // Created 40 s and 50 s ago, not ready: the same.
        let mut c = pod_at("c", "n", "Running", None, "2026-01-01T11:59:10Z");
        let mut d = pod_at("d", "n", "Running", None, "2026-01-01T11:59:20Z");
        c.metadata.uid = Some("1".into());
        d.metadata.uid = Some("2".into());
        assert_eq!(names(&pods_to_delete(&[&d, &c], &[], 1, now)), ["c"]);
        // A Pod without a creation time goes first (Go's afterOrZero).
        let mut undated = pod_at("undated", "n", "Running", None, old);
        undated.metadata.creation_timestamp = None;
        assert_eq!(names(&pods_to_delete(&[&c, &undated], &[], 1, now)), ["undated"]);
    }

    // Mirrors compareMaxContainerRestarts: regular containers first, then sidecars (restartPolicy Always).
    #[test]
    fn more_sidecar_restarts_go_first_when_regular_restarts_tie() {
        let now: jiff::Timestamp = NOW.parse().unwrap();
        let old = "2026-01-01T00:00:00Z";
        let with_init = |name: &str, policy: Option<&str>, restarts: i32| {
            let mut p = pod_at(name, "n", "Running", None, old);
            let mut init = json!({"name": "init"});
            if let Some(policy) = policy {
                init["restartPolicy"] = json!(policy);
            }
            p.spec.as_mut().unwrap().init_containers = Some(vec![serde_json::from_value(init).unwrap()]);
            p.status.as_mut().unwrap().init_container_statuses = Some(vec![serde_json::from_value(
                json!({"name": "init", "image": "i", "imageID": "", "ready": true, "restartCount": restarts}),
            )
            .unwrap()]);
            p
        };
        let sidecar = with_init("sidecar", Some("Always"), 4);
        let plain_init = with_init("plain-init", None, 9);
        assert_eq!(max_container_restarts(&sidecar), (0, 4));
        assert_eq!(max_container_restarts(&plain_init), (0, 0), "an init container that ran to completion");
        assert_eq!(names(&pods_to_delete(&[&plain_init, &sidecar], &[], 1, now)), ["sidecar"]);
    }

    // Mirrors GetDeletionCostFromPodAnnotations: an invalid value is 0, not an error that stops the scale-down.
    #[test]
    fn deletion_cost_reads_the_annotation_and_takes_invalid_values_as_zero() {
        let cost =
            |v: &str| deletion_cost(&pod(json!({"metadata": {"name": "p", "annotations": {POD_DELETION_COST: v}}})));
        assert_eq!(deletion_cost(&pod(json!({"metadata": {"name": "p"}}))), 0);
        assert_eq!([cost("100"), cost("-7"), cost("0"), cost("-007"), cost("2147483647")], [100, -7, 0, -7, i32::MAX]);
        for invalid in ["+10", "008", "00", "", "-", "1.5", " 1", "2147483648", "abc"] {
            assert_eq!(cost(invalid), 0, "{invalid:?}");
        }
    }

    // Mirrors IsPodActive (FilterActivePods): Unknown is active; Succeeded, Failed and deleting Pods are not.
    #[test]
    fn active_means_not_terminated_and_not_deleting() {
        let with_phase = |phase: &str| pod(json!({"metadata": {"name": "a"}, "status": {"phase": phase}}));
        assert!(is_active(&pod(json!({"metadata": {"name": "a"}}))), "no phase yet");
        for phase in ["Pending", "Running", "Unknown"] {
            assert!(is_active(&with_phase(phase)), "{phase}");
        }
        for phase in ["Succeeded", "Failed"] {
            assert!(!is_active(&with_phase(phase)), "{phase}");
        }
        let deleting = pod(json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running"}}));
        assert!(!is_active(&deleting));
    }

    // Mirrors IsPodReady: the first Ready condition decides.
    #[test]
    fn ready_is_the_first_ready_condition() {
        let p = pod(json!({"metadata": {"name": "a"}, "status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "Ready", "status": "True"}]}}));
        assert!(!is_ready(&p));
    }

    #[test]
    fn the_merge_sort_survives_an_intransitive_less() {
        // a < b < c < a: any order, but no panic, and every item kept.
        let mut items: Vec<u8> = (0..64).map(|i| i % 3).collect();
        sort_by_less(&mut items, &|x, y| (x + 1) % 3 == *y);
        assert_eq!(items.len(), 64);
        let mut sorted: Vec<u32> = (0..100).rev().collect();
        sort_by_less(&mut sorted, &|x, y| x < y);
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }
}
