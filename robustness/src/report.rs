//! What the checker found in one history, as the run prints it.

use std::fmt;

/// What the checker found in one history.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Client calls recorded.
    pub calls: usize,
    /// Calls placed by the linearizability search (a list counts once per key).
    pub calls_checked: usize,
    /// Calls that got no answer (each may or may not have taken effect), and calls refused with a 4xx.
    pub calls_lost: usize,
    pub calls_refused: usize,
    pub keys: usize,
    pub watch_events: usize,
    /// Watches told 410 (at their start or in the middle of their stream), and how many of them the cache floor
    /// judged; the rest: a cache began again during the stream, nothing told where the answering cache began, or a
    /// watch opened with the state was told 410 before any revision.
    pub told_410: usize,
    pub told_410_judged: usize,
    /// Watches held, and of them: opened with the state (`resourceVersion` unset or 0, `sendInitialEvents`),
    /// informers' resumes after a break and their lists again after 410, watches that never started, and
    /// streams that broke (an error, or 15 s of silence).
    pub watches: usize,
    pub watches_with_state: usize,
    pub resumes: usize,
    pub relists: usize,
    pub watches_not_started: usize,
    pub watches_broken: usize,
    /// Lists told 410 (an exact revision, or a continue token, older than the cache).
    pub reads_told_410: usize,
    /// etcd compactions and member defragmentations during traffic, and replica caches that began again after
    /// etcd compacted past them.
    pub compactions: usize,
    pub defragmentations: usize,
    pub cache_reloads: usize,
    /// A rolling upgrade's and rollback's replacements, and the objects whose apiVersion and kind were checked
    /// against the version their URL named.
    pub replacements: usize,
    pub version_objects: usize,
    /// Keys the search gave up on: a failure, since a bug could hide there.
    pub undecided: Vec<String>,
    /// (what, the smallest piece of history that shows it).
    pub violations: Vec<(String, Vec<String>)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.undecided.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} calls ({} lost, {} refused; {} placed on {} keys, a list once per key) and {} watch items \
             checked ({} of {} 410s against the answering cache's floor), {} undecided keys, {} violations",
            self.seed,
            self.calls,
            self.calls_lost,
            self.calls_refused,
            self.calls_checked,
            self.keys,
            self.watch_events,
            self.told_410_judged,
            self.told_410,
            self.undecided.len(),
            self.violations.len()
        )?;
        writeln!(
            f,
            "  {} watches ({} opened with the state; informers resumed {} times, listed again {} times), {} never \
             started, {} broke",
            self.watches,
            self.watches_with_state,
            self.resumes,
            self.relists,
            self.watches_not_started,
            self.watches_broken
        )?;
        writeln!(
            f,
            "  {} lists told 410; etcd compacted {} times, {} members defragmented, {} caches reloaded",
            self.reads_told_410, self.compactions, self.defragmentations, self.cache_reloads
        )?;
        if self.replacements > 0 || self.version_objects > 0 {
            writeln!(
                f,
                "  rolling upgrade and rollback: {} replacements; {} objects' apiVersion checked against their URL's",
                self.replacements, self.version_objects
            )?;
        }
        if !self.undecided.is_empty() {
            writeln!(
                f,
                "UNDECIDED (seed {}; the search gave up, a bug could hide there): {:?}",
                self.seed, self.undecided
            )?;
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
