//! Bugs planted on purpose, only in a build with the `planted-bugs` feature (the workspace's builds turn it on
//! through robustness/; hack/build-static.sh, the image and releases build the server alone, without it): `--planted-bug` turns one on, and the fault harness must then report
//! the violation it causes. The proof that its "0 violations" means something. Some are faults rather than bugs:
//! they put the server, deterministically, in a state a real cluster reaches only by chance, for a test to plant a
//! bug beside (`--planted-bug` may be repeated).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// Every 4th create is answered 201 without reaching the store.
    AckBeforeCommit,
    /// Every 4th update is committed, then answered 409 Conflict.
    ConflictAfterCommit,
    /// Every 25th event of each watch is not sent.
    DropWatchEvent,
    /// Lists without a resourceVersion are served from the cache one revision behind, without catching up.
    StaleList,
    /// The controller's leader never stops: not when its Lease may have lapsed (a pause), not when another replica
    /// holds it. A paused leader wakes and writes beside its successor.
    StaleLeader,
    /// A fault, not a bug: this replica's cache takes PodSet deletions late, as one lagging behind etcd. For
    /// [`LATE_DELETES`] after a GET at resourceVersion=0 (the controller's reads) first finds a PodSet being deleted
    /// or gone, such GETs still return the version they returned before. Consistent reads, lists and watches are
    /// as ever.
    LateDeletes,
    /// The controller adopts orphans without first reading the PodSet afresh (upstream's
    /// `RecheckDeletionTimestamp`): behind a stale cache, it re-owns the Pods of a PodSet deleted with
    /// propagationPolicy=Orphan.
    NoAdoptionRecheck,
}

static PLANTED: OnceLock<Vec<Bug>> = OnceLock::new();
static COUNT: AtomicU64 = AtomicU64::new(0);

pub fn plant(bugs: &[Bug]) {
    let _ = PLANTED.set(bugs.to_vec());
    for bug in bugs {
        tracing::warn!(?bug, "a bug is planted on purpose (--planted-bug): never run this build for real");
    }
}

pub fn planted(bug: Bug) -> bool {
    PLANTED.get().is_some_and(|bugs| bugs.contains(&bug))
}

/// Whether the planted `bug` strikes this time: on every `n`th call.
pub fn strikes(bug: Bug, n: u64) -> bool {
    planted(bug) && COUNT.fetch_add(1, Ordering::Relaxed) % n == n - 1
}

/// How long [`Bug::LateDeletes`] hides a deletion from cached reads: time for the garbage collector to orphan a
/// PodSet's Pods meanwhile (half a second on the test control plane).
pub const LATE_DELETES: Duration = Duration::from_secs(5);
