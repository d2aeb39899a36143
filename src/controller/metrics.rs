//! The controller's metrics, under kube-controller-manager's names: client-go's workqueue and leader election.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families, HistogramFamily};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NameLabel {
    pub name: String,
}

/// client-go's workqueue metrics (`workqueue_*{name}`), as kube-controller-manager exports them per controller.
#[derive(Debug)]
pub(crate) struct Workqueue {
    pub depth: Family<NameLabel, Gauge>,
    pub adds: Family<NameLabel, Counter>,
    pub retries: Family<NameLabel, Counter>,
    pub queue_duration: HistogramFamily<NameLabel>,
    pub work_duration: HistogramFamily<NameLabel>,
}

#[derive(Debug)]
pub(crate) struct ControllerMetrics {
    pub workqueue: Workqueue,
    /// Per Lease: 1 while this replica leads it.
    pub leader: Family<NameLabel, Gauge>,
}

/// client-go's workqueue buckets: 10 ns to 10 s, by tens.
fn workqueue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10., 10))
}

static METRICS: LazyLock<ControllerMetrics> = LazyLock::new(|| {
    registered(ControllerMetrics {
        workqueue: Workqueue {
            depth: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_histogram),
            work_duration: Family::new_with_constructor(workqueue_histogram),
        },
        leader: Family::default(),
    })
});

pub(crate) fn metrics() -> &'static ControllerMetrics {
    &METRICS
}

impl Families for ControllerMetrics {
    fn register(&self, r: &mut Registry) {
        let q = &self.workqueue;
        r.register("workqueue_depth", "Current depth of workqueue", q.depth.clone());
        r.register("workqueue_adds", "Total number of adds handled by workqueue", q.adds.clone());
        r.register("workqueue_retries", "Total number of retries handled by workqueue", q.retries.clone());
        r.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            q.queue_duration.clone(),
        );
        r.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            q.work_duration.clone(),
        );
        r.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master.",
            self.leader.clone(),
        );
    }
}
