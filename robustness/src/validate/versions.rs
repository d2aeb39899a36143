//! The checks of a rolling upgrade and rollback between the build that serves only v1alpha1 and this build:
//! every URL answers objects of its version; objects are stored as the old build reads them, and keep the
//! spec.minReadySeconds written through v1beta1 whatever writes them after; the rollback went as docs/install.md
//! gives it, and left no namespace deletion stalled and no APIService without a server.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::truth::Finding;
use super::SHOWN;
use crate::model::history::{secs, Build, History, Operation, StoredForm, AGGREGATOR};

/// What the build that serves only v1alpha1 reads, and so what objects are stored in while it may run.
const STORAGE_API_VERSION: &str = "demo.k8s.io/v1alpha1";
const V1BETA1_APISERVICE_GONE: &str = "v1alpha1.demo.k8s.io";

/// `lines`, the first [`SHOWN`] of them and how many more.
fn shown(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > SHOWN {
        let more = lines.len() - SHOWN;
        lines.truncate(SHOWN);
        lines.push(format!("({more} more)"));
    }
    lines
}

/// The checks on what clients were told, and on the rollout itself.
pub fn check(history: &History) -> Vec<Finding> {
    let mut out = served_versions(history);
    out.extend(checked_throughout(history));
    out.extend(rollback(history));
    out
}

/// The checks on etcd's record.
pub fn check_stored(history: &History) -> Vec<Finding> {
    let mut out = storage_version(history);
    out.extend(min_ready_seconds(history));
    out
}

/// Every object an answer carried is of the version its URL named: the list itself a `PodSetList`, every other
/// object a `PodSet`.
fn served_versions(history: &History) -> Vec<Finding> {
    let mut wrong = Vec::new();
    for a in &history.version_answers {
        let want = format!("demo.k8s.io/{}", a.asked);
        for o in &a.objects {
            let kind = if o.what == "the list" { "PodSetList" } else { "PodSet" };
            if o.api_version != want || o.kind != kind {
                let api_version = if o.api_version.is_empty() { "(no apiVersion)" } else { &o.api_version };
                wrong.push(format!(
                    "{} via {}: {} of /apis/{want}: {} is {api_version} {}",
                    secs(a.at),
                    a.route,
                    a.call,
                    o.what,
                    o.kind
                ));
            }
        }
    }
    if wrong.is_empty() {
        Vec::new()
    } else {
        vec![("a URL of one version answered an object of another".into(), shown(wrong))]
    }
}

/// In a rollout, every route (each replica, the aggregator) answered v1alpha1 objects between every two
/// replacements, so the version check ran on every mix of builds.
fn checked_throughout(history: &History) -> Vec<Finding> {
    if history.rollout.is_empty() {
        return Vec::new();
    }
    let end = history.version_answers.iter().map(|a| a.at + 1).max().unwrap_or(0);
    // From the start, or a replaced replica ready, to the next replacement, or the end.
    let mut phases = Vec::new();
    let mut from = Some(0);
    for s in &history.rollout {
        phases.extend(from.map(|f| (f, s.at)));
        from = s.ready;
    }
    phases.extend(from.map(|f| (f, end)));
    let mut routes: Vec<&str> = history.replica_starts.iter().map(|s| s.route.as_str()).collect();
    routes.push(AGGREGATOR);
    routes.sort_unstable();
    routes.dedup();
    let mut missing = Vec::new();
    for (from, to) in phases {
        for route in &routes {
            let answered = history.version_answers.iter().any(|a| {
                a.route == *route && a.asked == "v1alpha1" && (from..to).contains(&a.at) && !a.objects.is_empty()
            });
            if !answered {
                missing.push(format!("{route}: no v1alpha1 object answered between {} and {}", secs(from), secs(to)));
            }
        }
    }
    if missing.is_empty() {
        Vec::new()
    } else {
        vec![("too little checked: a route answered no v1alpha1 object between two replacements".into(), missing)]
    }
}

/// Every replacement became ready; v1beta1 was unregistered only once no object was stored in it; and after the
/// rollback a namespace with PodSets could be deleted and no APIService but v1alpha1's was left.
fn rollback(history: &History) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in history.rollout.iter().filter(|s| s.ready.is_none()) {
        out.push((
            "a replaced replica never became ready".into(),
            vec![format!("replica {} on the {:?} build, replaced at {}", s.replica, s.build, secs(s.at))],
        ));
    }
    let Some(back) = history.rollout.iter().skip_while(|s| s.build != Build::New).find(|s| s.build == Build::Old)
    else {
        return out;
    };
    let counts = back.v1beta1_objects.as_deref().unwrap_or_default();
    if counts.is_empty() || counts.iter().any(|n| *n != Some(0)) {
        let mut lines =
            vec![format!("before replica {} went back to the old build at {}:", back.replica, secs(back.at))];
        lines.extend(counts.iter().enumerate().map(|(i, n)| match n {
            Some(n) => format!("replica {i}: podset_storage_version_objects{{version=\"v1beta1\"}} {n}"),
            None => format!("replica {i}: podset_storage_version_objects{{version=\"v1beta1\"}} not reported"),
        }));
        out.push(("v1beta1 unregistered while objects may be stored in it".into(), lines));
    }
    if history.rollout.last().is_some_and(|s| s.build == Build::Old) {
        match &history.after_rollback {
            None => out.push(("nothing checked after the rollback".into(), Vec::new())),
            Some(a) => {
                if a.gone.is_none() {
                    let mut lines = vec![format!(
                        "namespace {} deleted at {}, still there; its conditions:",
                        a.namespace,
                        secs(a.deleted)
                    )];
                    lines.extend(a.conditions.iter().cloned());
                    out.push(("a namespace deletion stalled after the rollback".into(), lines));
                }
                let left: Vec<String> =
                    a.apiservices.iter().filter(|n| *n != V1BETA1_APISERVICE_GONE).cloned().collect();
                if !left.is_empty() {
                    out.push(("an APIService of demo.k8s.io left after the rollback".into(), left));
                }
            }
        }
    }
    out
}

/// In a rollout, every object was stored in v1alpha1: the old build reads stored objects as they are.
fn storage_version(history: &History) -> Vec<Finding> {
    if history.rollout.is_empty() {
        return Vec::new();
    }
    let wrong: Vec<String> = history
        .stored
        .iter()
        .filter(|s| s.api_version != STORAGE_API_VERSION)
        .map(|s| format!("etcd: {} at revision {} stored as {:?}", s.key, s.resource_version, s.api_version))
        .collect();
    if wrong.is_empty() {
        Vec::new()
    } else {
        vec![("an object stored in another version than the old build reads".into(), shown(wrong))]
    }
}

/// The seconds a write set spec.minReadySeconds to, as its marker says (`...-s<seconds>...`).
fn sets_min_ready_seconds(marker: &str) -> Option<i64> {
    marker.split('-').find_map(|part| part.strip_prefix('s')?.parse().ok())
}

/// Along etcd's record of each key, spec.minReadySeconds (or v1alpha1's annotation) is what the write that made the
/// state set, or, for a write that did not set it (a status or scale write, an apply or update through v1alpha1 on
/// either build), what the state before held.
fn min_ready_seconds(history: &History) -> Vec<Finding> {
    let stored: HashMap<u64, &StoredForm> = history.stored.iter().map(|s| (s.resource_version, s)).collect();
    let writes: HashMap<&str, &Operation> =
        history.operations.iter().filter_map(|o| Some((o.request.marker()?, o))).collect();
    let mut changes: Vec<_> = history.changes.iter().collect();
    changes.sort_by_key(|c| c.resource_version);
    // Per key: the marker and value of its state.
    let mut state: BTreeMap<&str, (&str, Option<i64>)> = BTreeMap::new();
    let mut unknown: HashSet<&str> = HashSet::new();
    let mut cases: Vec<Vec<String>> = Vec::new();
    let mut out = Vec::new();
    for c in changes {
        let Some(marker) = c.marker.as_deref() else {
            state.remove(c.key.as_str());
            unknown.remove(c.key.as_str());
            continue;
        };
        let Some(form) = stored.get(&c.resource_version) else {
            unknown.insert(&c.key);
            continue;
        };
        let before = state.insert(&c.key, (marker, form.min_ready_seconds));
        if unknown.remove(c.key.as_str()) {
            continue;
        }
        let expected = match before {
            // The controller's status, or a subresource's write: the content it found.
            Some((m, value)) if m == marker => value,
            _ if sets_min_ready_seconds(marker).is_some() => sets_min_ready_seconds(marker),
            Some((_, value)) => value,
            None => None,
        };
        if form.min_ready_seconds != expected {
            let mut case = vec![format!(
                "etcd: {} at revision {} (marker {marker:?}) holds {:?}, expected {expected:?} (before: {before:?})",
                c.key, c.resource_version, form.min_ready_seconds
            )];
            let write = writes.get(marker);
            case.extend(write.map(|o| match before {
                Some((m, _)) if m == marker => format!("  by a write that keeps the content (status, scale) of: {o}"),
                _ => format!("  by: {o}"),
            }));
            cases.push(case);
        }
    }
    if !cases.is_empty() {
        let more = cases.len().saturating_sub(SHOWN / 2);
        let mut lines: Vec<String> = cases.into_iter().take(SHOWN / 2).flatten().collect();
        if more > 0 {
            lines.push(format!("({more} more)"));
        }
        out.push(("spec.minReadySeconds not as written".into(), lines));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::{
        AfterRollback, Change, ReplicaStart, Request, Response, RolloutStep, Seen, ServedObject, VersionAnswer,
    };

    const S: u64 = 1_000_000_000;

    fn found(h: &History) -> Vec<String> {
        crate::check(h).violations.into_iter().map(|v| v.0).collect()
    }

    fn object(what: &str, api_version: &str, kind: &str) -> ServedObject {
        ServedObject { what: what.into(), api_version: api_version.into(), kind: kind.into() }
    }

    fn answer(route: &str, at: u64, asked: &str, call: &str, objects: Vec<ServedObject>) -> VersionAnswer {
        VersionAnswer { route: route.into(), at, asked: asked.into(), call: call.into(), objects }
    }

    #[test]
    fn a_v1alpha1_url_answering_a_v1beta1_object_is_named() {
        let alpha = "demo.k8s.io/v1alpha1";
        let good = answer(
            "replica 0",
            S,
            "v1alpha1",
            "list",
            vec![object("the list", alpha, "PodSetList"), object("item ns/a", alpha, "PodSet")],
        );
        assert!(crate::check(&History { version_answers: vec![good.clone()], ..Default::default() }).ok());
        // An old replica splicing what a new one stored in v1beta1, in a list, a get, a watch event.
        for (call, what) in [("list", "item ns/a"), ("get ns/a", "ns/a"), ("watch", "ADDED ns/a")] {
            let bad = answer("replica 1", 2 * S, "v1alpha1", call, vec![object(what, "demo.k8s.io/v1beta1", "PodSet")]);
            let history = History { version_answers: vec![good.clone(), bad], ..Default::default() };
            let report = crate::check(&history);
            assert_eq!(found(&history), ["a URL of one version answered an object of another"]);
            let line = &report.violations[0].1[0];
            assert!(
                line.contains("replica 1") && line.contains(what) && line.contains("demo.k8s.io/v1beta1"),
                "{line}"
            );
        }
        // A list that is not a PodSetList, an object without an apiVersion.
        let bad = answer("aggregator", S, "v1alpha1", "list", vec![object("the list", alpha, "PodSet")]);
        assert_eq!(found(&History { version_answers: vec![bad], ..Default::default() }).len(), 1);
        let bad = answer("aggregator", S, "v1alpha1", "get ns/a", vec![object("ns/a", "", "PodSet")]);
        assert_eq!(found(&History { version_answers: vec![bad], ..Default::default() }).len(), 1);
    }

    fn step(replica: usize, build: Build, at: u64) -> RolloutStep {
        RolloutStep { replica, build, at: at * S, ready: Some((at + 5) * S), v1beta1_objects: None }
    }

    /// One replica upgraded and rolled back, its checks passing, answers on every route throughout.
    fn rollout() -> History {
        let alpha = "demo.k8s.io/v1alpha1";
        let version_answers = ["replica 0", AGGREGATOR]
            .iter()
            .flat_map(|r| {
                [1, 17, 28].map(|t| answer(r, t * S, "v1alpha1", "get ns/a", vec![object("ns/a", alpha, "PodSet")]))
            })
            .collect();
        let mut back = step(0, Build::Old, 20);
        back.v1beta1_objects = Some(vec![Some(0)]);
        History {
            rollout: vec![step(0, Build::New, 10), back],
            replica_starts: vec![ReplicaStart { route: "replica 0".into(), at: 0, answers_from: None }],
            version_answers,
            after_rollback: Some(AfterRollback {
                namespace: "after-rollback".into(),
                deleted: 40 * S,
                gone: Some(45 * S),
                conditions: Vec::new(),
                apiservices: vec!["v1alpha1.demo.k8s.io".into()],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_rollback_that_leaves_v1beta1_behind_is_named() {
        let ok = rollout();
        assert!(crate::check(&ok).ok(), "{}", crate::check(&ok));

        let mut h = rollout();
        let a = h.after_rollback.as_mut().unwrap();
        a.gone = None;
        a.conditions = vec!["NamespaceDeletionDiscoveryFailure=True: unable to retrieve ... v1beta1".into()];
        a.apiservices.push("v1beta1.demo.k8s.io".into());
        assert_eq!(
            found(&h),
            ["a namespace deletion stalled after the rollback", "an APIService of demo.k8s.io left after the rollback"]
        );

        let mut h = rollout();
        h.after_rollback = None;
        assert_eq!(found(&h), ["nothing checked after the rollback"]);

        // Unregistered while a replica counted objects stored in v1beta1, or did not say.
        for counts in [vec![Some(2)], vec![None], Vec::new()] {
            let mut h = rollout();
            h.rollout[1].v1beta1_objects = Some(counts);
            assert_eq!(found(&h), ["v1beta1 unregistered while objects may be stored in it"]);
        }

        let mut h = rollout();
        h.rollout[0].ready = None;
        let f = found(&h);
        assert!(f.contains(&"a replaced replica never became ready".to_owned()), "{f:?}");
    }

    #[test]
    fn a_route_unchecked_between_two_replacements_is_named() {
        let mut h = rollout();
        // The aggregator's answers between the upgrade and the rollback.
        h.version_answers.retain(|a| !(a.route == AGGREGATOR && a.at == 17 * S));
        let report = crate::check(&h);
        assert_eq!(found(&h), ["too little checked: a route answered no v1alpha1 object between two replacements"]);
        assert_eq!(report.violations[0].1, ["aggregator: no v1alpha1 object answered between 15.000 and 20.000"]);
    }

    fn change(rv: u64, key: &str, marker: Option<&str>) -> Change {
        Change { resource_version: rv, key: key.into(), marker: marker.map(String::from) }
    }

    fn stored(rv: u64, key: &str, api_version: &str, min_ready_seconds: Option<i64>) -> StoredForm {
        StoredForm { resource_version: rv, key: key.into(), api_version: api_version.into(), min_ready_seconds }
    }

    fn write(request: Request, rv: u64, marker: &str) -> Operation {
        let response = Response::Object(Seen { resource_version: rv, marker: marker.into() });
        Operation { client: 0, route: "replica 1".into(), call: rv * S, ret: rv * S + 1, request, response }
    }

    #[test]
    fn spec_min_ready_seconds_dropped_by_a_write_that_did_not_set_it_is_named() {
        let alpha = "demo.k8s.io/v1alpha1";
        let key = "versions/mrs-0";
        let ops = vec![
            write(Request::Create { key: key.into(), marker: "b0-1-s30-r1".into() }, 2, "b0-1-s30-r1"),
            write(Request::Patch { key: key.into(), marker: "b0-2-r2".into() }, 3, "b0-2-r2"),
        ];
        let changes = vec![
            change(2, key, Some("b0-1-s30-r1")),
            // A status write (the marker kept), then a patch of spec.replicas through v1alpha1.
            change(3, key, Some("b0-1-s30-r1")),
            change(4, key, Some("b0-2-r2")),
        ];
        let judged = |values: [Option<i64>; 3]| {
            let stored = (0..3).map(|i| stored(i as u64 + 2, key, alpha, values[i])).collect();
            let h = History { operations: ops.clone(), changes: changes.clone(), stored, ..Default::default() };
            let mut found = super::check_stored(&h);
            found.retain(|f| f.0 == "spec.minReadySeconds not as written");
            found
        };
        assert!(judged([Some(30), Some(30), Some(30)]).is_empty());
        // The status write dropped it.
        let f = judged([Some(30), None, None]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].1[0].contains("revision 3") && f[0].1[0].contains("expected Some(30)"), "{f:?}");
        assert!(f[0].1[1].contains("keeps the content"), "{f:?}");
        // The patch through v1alpha1 dropped it: the write is named.
        let f = judged([Some(30), Some(30), None]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].1[1].starts_with("  by: ") && f[0].1[1].contains("b0-2-r2"), "{f:?}");
        // The create did not store what it set: one finding, the state after it judged from what was stored.
        let f = judged([None, None, None]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].1[0].contains("revision 2"), "{f:?}");
    }

    #[test]
    fn an_object_stored_in_v1beta1_during_a_rollout_is_named() {
        let key = "ns/a";
        let h = History {
            changes: vec![change(2, key, Some("m"))],
            stored: vec![stored(2, key, "demo.k8s.io/v1beta1", None)],
            ..Default::default()
        };
        assert!(super::check_stored(&h).is_empty(), "a run of one build stores in what it is told");
        let h = History { rollout: rollout().rollout, ..h };
        let f: Vec<String> = super::check_stored(&h).into_iter().map(|f| f.0).collect();
        assert_eq!(f, ["an object stored in another version than the old build reads"]);
    }
}
