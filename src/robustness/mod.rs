//! Robustness as etcd tests itself: a history of client calls and watches recorded under faults, checked for
//! linearizability, the watch guarantees, read freshness and the controller's Pod counts. The checker is plain
//! code over a [`History`]; the harness makes histories from a real cluster.

pub mod controller_check;
pub mod etcd_cluster;
pub mod harness;
pub mod history;
pub mod linearizability;
pub mod truth;
pub mod watch_check;

use std::fmt;

pub use history::History;

/// What the checker found in one history.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Client calls recorded.
    pub calls: usize,
    /// Calls placed by the linearizability search (a list counts once per key).
    pub calls_checked: usize,
    pub keys: usize,
    pub watch_events: usize,
    /// Watches told 410 at their start, and how many of them the cache floor judged (the rest came before anything
    /// told where the answering cache began).
    pub told_410: usize,
    pub told_410_judged: usize,
    /// Keys the search gave up on.
    pub undecided: Vec<String>,
    /// (what, the smallest piece of history that shows it).
    pub violations: Vec<(String, Vec<String>)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

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
    let kept: Vec<Option<u64>> = history.watches.iter().map(|w| watch_check::kept_from(history, &bounds, w)).collect();
    report.told_410 = history.watches.iter().filter(|w| watch_check::told_410(w)).count();
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
        report.violations.extend(watch_check::check(history, &kept));
    }
    report.violations.extend(controller_check::check(history));
    report
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} calls ({} placed on {} keys, a list once per key) and {} watch items checked ({} of {} 410s \
             against the answering cache's floor), {} violations",
            self.seed,
            self.calls,
            self.calls_checked,
            self.keys,
            self.watch_events,
            self.told_410_judged,
            self.told_410,
            self.violations.len()
        )?;
        if !self.undecided.is_empty() {
            writeln!(f, "undecided (search too large): {:?}", self.undecided)?;
        }
        for (what, lines) in &self.violations {
            writeln!(f, "VIOLATION (seed {}): {what}", self.seed)?;
            for l in lines {
                writeln!(f, "    {l}")?;
            }
        }
        Ok(())
    }
}
