//! The checks, each plain code over a [`History`]: linearizability per key, etcd's record against every answer
//! (truth), the watch guarantees, and the controller's Pod counts.

pub mod controller;
pub mod linearizability;
pub mod truth;
pub mod watch;

use crate::model::history::History;
use crate::report::Report;

/// Lines of a failing piece of history shown.
const SHOWN: usize = 30;

/// Runs every check.
pub fn check(history: &History) -> Report {
    let mut report = Report {
        seed: history.seed,
        calls: history.operations.len(),
        calls_checked: linearizability::checked_calls(history),
        keys: truth::keys(history).len(),
        watch_events: history.watches.iter().map(|w| w.items.len()).sum(),
        ..Default::default()
    };
    let bounds = truth::Bounds::new(&history.operations);
    let kept: Vec<Option<u64>> = history.watches.iter().map(|w| watch::kept_from(history, &bounds, w)).collect();
    report.told_410 = history.watches.iter().filter(|w| watch::told_410(w)).count();
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
    if !history.changes.is_empty() {
        let timeline = truth::Timeline::new(&history.changes);
        report.violations.extend(truth::check_acknowledged_writes(history, &timeline));
        report.violations.extend(truth::check_reads(history, &timeline, &bounds));
        report.violations.extend(watch::check(history, &kept));
    }
    report.violations.extend(controller::check(history));
    report
}
