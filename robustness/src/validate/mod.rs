//! The checks, each plain code over a [`History`]: linearizability per key, etcd's record against every answer
//! (truth), the watch guarantees, and the controller's Pod counts.

pub mod controller;
pub mod linearizability;
pub mod truth;
pub mod versions;
pub mod watch;

use crate::model::history::{History, Response, WatchEnd, WatchStart};
use crate::report::Report;
use truth::Finding;

/// Lines of a failing piece of history shown.
const SHOWN: usize = 30;

/// Runs every check.
pub fn check(history: &History) -> Report {
    let original = history;
    // Watches went on after etcd's record was read (informers must reach its end); what came later is not judged.
    let trimmed;
    let history = match history.record_until {
        Some(until) => {
            let mut h = history.clone();
            for w in &mut h.watches {
                w.items.retain(|i| i.event().is_none_or(|(_, rv)| rv <= until));
            }
            trimmed = h;
            &trimmed
        }
        None => history,
    };
    let mut report = Report {
        seed: history.seed,
        calls: history.operations.len(),
        calls_checked: linearizability::checked_calls(history),
        calls_lost: history.operations.iter().filter(|o| o.lost()).count(),
        calls_refused: history
            .operations
            .iter()
            .filter(|o| {
                matches!(
                    o.response,
                    Response::Refused(_) | Response::Conflict | Response::AlreadyExists | Response::NotFound
                )
            })
            .count(),
        keys: truth::keys(history).len(),
        watch_events: history.watches.iter().map(|w| w.items.len()).sum(),
        ..Default::default()
    };
    let bounds = truth::Bounds::new(&history.operations);
    let kept: Vec<Option<u64>> = history.watches.iter().map(|w| watch::kept_from(history, &bounds, w)).collect();
    report.told_410 = history.watches.iter().filter(|w| watch::any_410(w)).count();
    report.reads_told_410 =
        history.operations.iter().filter(|o| matches!(o.response, Response::Expired { .. })).count();
    report.compactions = history.compactions.len();
    report.defragmentations = history.defragmentations.len();
    report.replacements = history.rollout.len();
    report.version_objects = history.version_answers.iter().map(|a| a.objects.len()).sum();
    report.cache_reloads = history.replica_starts.iter().filter(|s| s.answers_from.is_some()).count();
    let watches = &history.watches;
    report.watches = watches.len();
    report.watches_with_state = watches.iter().filter(|w| w.start != WatchStart::From).count();
    report.resumes = watches.iter().filter(|w| w.informer.is_some() && !w.after_list).count();
    // Each informer's first list is not a relist.
    let informers: std::collections::HashSet<usize> = watches.iter().filter_map(|w| w.informer).collect();
    report.relists =
        watches.iter().filter(|w| w.informer.is_some() && w.after_list).count().saturating_sub(informers.len());
    report.watches_not_started = watches.iter().filter(|w| matches!(w.end, WatchEnd::NotStarted(_))).count();
    report.watches_broken = watches.iter().filter(|w| matches!(w.end, WatchEnd::Silent | WatchEnd::Failed(_))).count();
    report.told_410_judged = kept.iter().flatten().count();
    for (key, verdict) in linearizability::check(history) {
        match verdict {
            linearizability::Verdict::Linearizable => {}
            linearizability::Verdict::Unknown => report.undecided.push(key),
            linearizability::Verdict::Violation { culprit, piece } => {
                let mut lines = linearizability::describe(history, &piece, culprit);
                // The last calls show the failure; the ones before it are the past it needs.
                if lines.len() > SHOWN {
                    let earlier = lines.len() - SHOWN;
                    lines.drain(..earlier);
                    lines.insert(0, format!("({earlier} earlier calls and changes of this key before these)"));
                }
                report.violations.push((format!("not linearizable: {key} (its last answer cannot be placed)"), lines))
            }
        }
    }
    report.violations.extend(truth::check_resource_versions(history));
    report.violations.extend(progress(history));
    report.violations.extend(replicas_ran_on(history));
    report.violations.extend(versions::check(history));
    if !history.changes.is_empty() {
        report.violations.extend(versions::check_stored(history));
        let timeline = truth::Timeline::new(&history.changes);
        report.violations.extend(truth::check_acknowledged_writes(history, &timeline));
        report.violations.extend(truth::check_changes_explained(history));
        report.violations.extend(census_covers_the_record(history));
        report.violations.extend(truth::check_reads(history, &timeline, &bounds));
        report
            .violations
            .extend(truth::check_expired_reads(history, |op| watch::kept_at(history, &bounds, &op.route, op.call)));
        report.violations.extend(watch::check(history, &bounds, &kept));
        // Resumes are judged on what the informers were told, all of it.
        report.violations.extend(watch::check_informers(original));
    }
    report.violations.extend(controller::check(history));
    report
}

/// Checks that would pass for want of anything to check fail instead: a run that answered too few calls, and an
/// empty record of etcd's changes while writes were acknowledged.
fn progress(history: &History) -> Vec<Finding> {
    let mut out = Vec::new();
    let answered = history.operations.iter().filter(|o| !o.lost()).count();
    if answered < history.min_answered {
        out.push((
            "too little progress".into(),
            vec![format!("{answered} calls answered, at least {} expected", history.min_answered)],
        ));
    }
    if let Some(gap) = &history.record_gap {
        out.push(("etcd's record of the run has a hole".into(), vec![gap.clone()]));
    }
    let acknowledged = history.operations.iter().filter(|o| o.written_revision().is_some()).count();
    if history.changes.is_empty() && acknowledged > 0 {
        out.push((
            "etcd's record is empty".into(),
            vec![format!("{acknowledged} writes were acknowledged, and no change was read back from etcd")],
        ));
    }
    out
}

/// No replica ended unless a fault stopped it: a server that exits on a passing fault (an etcd election, say) is
/// down until something restarts it.
fn replicas_ran_on(history: &History) -> Vec<Finding> {
    history
        .replica_exits
        .iter()
        .map(|exit| {
            let mut lines = vec![format!("{} ended ({}); its last lines:", exit.route, exit.status)];
            lines.extend(exit.log_tail.iter().cloned());
            ("a replica exited on its own".into(), lines)
        })
        .collect()
}

/// The final census saw every PodSet etcd holds at the end, so the convergence check judged them all.
fn census_covers_the_record(history: &History) -> Vec<Finding> {
    let mut last: std::collections::BTreeMap<&str, bool> = Default::default();
    let mut changes: Vec<_> = history.changes.iter().collect();
    changes.sort_by_key(|c| c.resource_version);
    for c in changes {
        last.insert(&c.key, c.marker.is_some());
    }
    let missed: Vec<String> = last
        .into_iter()
        .filter(|(key, alive)| *alive && !history.settled.iter().any(|s| s.key == *key))
        .map(|(key, _)| key.to_owned())
        .collect();
    if missed.is_empty() {
        Vec::new()
    } else {
        vec![("the final census missed PodSets etcd holds".into(), missed)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::{Change, Operation, Request, Seen, Settled};

    fn acknowledged(key: &str, rv: u64) -> Operation {
        let seen = Seen { resource_version: rv, marker: "m".into() };
        Operation {
            client: 0,
            route: "r".into(),
            call: 0,
            ret: 1,
            request: Request::Create { key: key.into(), marker: "m".into() },
            response: Response::Object(seen),
        }
    }

    #[test]
    fn nothing_to_check_is_a_failure() {
        let history = History { operations: vec![acknowledged("ns/a", 2)], min_answered: 2, ..Default::default() };
        let found: Vec<String> = check(&history).violations.into_iter().map(|v| v.0).collect();
        assert_eq!(found, ["too little progress", "etcd's record is empty"]);

        let change = Change { resource_version: 2, key: "ns/a".into(), marker: Some("m".into()) };
        let history =
            History { operations: vec![acknowledged("ns/a", 2)], changes: vec![change], ..Default::default() };
        let report = check(&history);
        let found: Vec<&str> = report.violations.iter().map(|v| v.0.as_str()).collect();
        assert_eq!(found, ["the final census missed PodSets etcd holds"], "{report}");
        let settled = Settled {
            key: "ns/a".into(),
            generation: 1,
            replicas: 0,
            active: 0,
            status_replicas: Some(0),
            observed_generation: Some(1),
        };
        let history = History { settled: vec![settled], ..history };
        assert!(check(&history).ok(), "{}", check(&history));
        // A record with a hole (etcd compacted what it had not read) proves nothing.
        let history = History { record_gap: Some("compacted to 9 before 5 was read".into()), ..history };
        let found: Vec<String> = check(&history).violations.into_iter().map(|v| v.0).collect();
        assert_eq!(found, ["etcd's record of the run has a hole"]);
    }

    #[test]
    fn a_replica_that_exited_on_its_own_is_a_violation() {
        use crate::model::history::ReplicaExit;
        let exit = ReplicaExit {
            route: "replica 1".into(),
            status: "exit status: 1".into(),
            log_tail: vec!["Error: loading etcd".into()],
        };
        let history = History { replica_exits: vec![exit], ..Default::default() };
        let report = check(&history);
        assert_eq!(report.violations.len(), 1, "{report}");
        let (what, lines) = &report.violations[0];
        assert_eq!(what, "a replica exited on its own");
        assert_eq!(lines, &["replica 1 ended (exit status: 1); its last lines:", "Error: loading etcd"]);
        assert!(check(&History::default()).ok());
    }

    #[test]
    fn what_watches_saw_after_the_record_ends_is_not_judged() {
        use crate::model::history::{Watch, WatchItem};
        let change = Change { resource_version: 2, key: "ns/a".into(), marker: Some("m".into()) };
        let later = WatchItem::Modified { key: "ns/a".into(), seen: Seen { resource_version: 3, marker: "n".into() } };
        let watch = Watch { namespace: "ns".into(), from: 2, items: vec![later], ..Default::default() };
        let history = History { changes: vec![change], watches: vec![watch], ..Default::default() };
        let found = |h: &History| check(h).violations.into_iter().map(|v| v.0).collect::<Vec<_>>();
        assert!(found(&history).contains(&"event of a change etcd never had".to_owned()));
        let history = History { record_until: Some(2), ..history };
        assert!(!found(&history).contains(&"event of a change etcd never had".to_owned()));
    }

    #[test]
    fn an_undecided_key_fails_the_run() {
        let report = Report { undecided: vec!["ns/a".into()], ..Default::default() };
        assert!(!report.ok());
        assert!(report.to_string().contains("UNDECIDED"), "{report}");
    }
}
