//! Bugs planted on purpose, only in a build with the `planted-bugs` feature (the workspace's builds turn it on
//! through robustness/; hack/build-static.sh, the image and releases build the server alone, without it): `--planted-bug` turns one on, and the fault harness must then report
//! the violation it causes. The proof that its "0 violations" means something.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

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
}

static PLANTED: OnceLock<Bug> = OnceLock::new();
static COUNT: AtomicU64 = AtomicU64::new(0);

pub fn plant(bug: Bug) {
    let _ = PLANTED.set(bug);
    tracing::warn!(?bug, "a bug is planted on purpose (--planted-bug): never run this build for real");
}

pub fn planted(bug: Bug) -> bool {
    PLANTED.get() == Some(&bug)
}

/// Whether the planted `bug` strikes this time: on every `n`th call.
pub fn strikes(bug: Bug, n: u64) -> bool {
    planted(bug) && COUNT.fetch_add(1, Ordering::Relaxed) % n == n - 1
}
