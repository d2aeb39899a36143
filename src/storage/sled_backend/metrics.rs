//! The embedded store's group commits.

use std::sync::LazyLock;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families};

#[derive(Debug)]
pub(crate) struct CommitMetrics {
    /// One durable write group (batch + fsync).
    pub duration: Histogram,
    /// Writes that shared one fsync.
    pub group_size: Histogram,
}

static METRICS: LazyLock<CommitMetrics> = LazyLock::new(|| {
    registered(CommitMetrics {
        duration: Histogram::new(exponential_buckets(0.0001, 2., 16)),
        group_size: Histogram::new(exponential_buckets(1., 2., 10)),
    })
});

pub(crate) fn metrics() -> &'static CommitMetrics {
    &METRICS
}

impl Families for CommitMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "podset_storage_commit_duration_seconds",
            "Time one group of writes took to become durable in the embedded store (batch and fsync).",
            self.duration.clone(),
        );
        r.register(
            "podset_storage_commit_group_size",
            "Writes made durable together by one fsync (group commit).",
            self.group_size.clone(),
        );
    }
}
