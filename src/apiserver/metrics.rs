//! The request metrics, named and labelled as k8s.io/apiserver's `endpoints/metrics`, so its SLO dashboards work.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families, HistogramFamily};

/// `apiserver_request_duration_seconds`' buckets, as k8s.io/apiserver's (tuned for its latency SLOs).
const REQUEST_BUCKETS: [f64; 23] =
    [0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2., 3., 4., 5., 6., 8., 10., 15., 20., 30., 45., 60.];

/// `apiserver_request_total`'s labels (the duration histogram has all but `code`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub verb: String,
    pub dry_run: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
    pub code: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DurationLabels {
    pub verb: String,
    pub dry_run: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LongRunningLabels {
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GroupVersionResource {
    pub group: String,
    pub version: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestKindLabel {
    pub request_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabel {
    pub resource: String,
}

/// Requests served, in flight and streaming, watch events sent and objects stored.
#[derive(Debug)]
pub(crate) struct RequestMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: HistogramFamily<DurationLabels>,
    pub current_inflight: Family<RequestKindLabel, Gauge>,
    pub longrunning: Family<LongRunningLabels, Gauge>,
    pub watch_events: Family<GroupVersionResource, Counter>,
    pub storage_objects: Family<ResourceLabel, Gauge>,
}

static METRICS: LazyLock<RequestMetrics> = LazyLock::new(|| {
    registered(RequestMetrics {
        requests: Family::default(),
        request_duration: Family::new_with_constructor(|| Histogram::new(REQUEST_BUCKETS)),
        current_inflight: Family::default(),
        longrunning: Family::default(),
        watch_events: Family::default(),
        storage_objects: Family::default(),
    })
});

pub(crate) fn metrics() -> &'static RequestMetrics {
    &METRICS
}

impl Families for RequestMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, \
             component, and HTTP response code.",
            self.requests.clone(),
        );
        r.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, resource, \
             subresource, scope and component.",
            self.request_duration.clone(),
        );
        r.register(
            "apiserver_current_inflight_requests",
            "Number of requests holding an in-flight slot now, per request kind.",
            self.current_inflight.clone(),
        );
        r.register(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope \
             and component.",
            self.longrunning.clone(),
        );
        r.register("apiserver_watch_events", "Number of events sent in watch clients", self.watch_events.clone());
        r.register(
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind.",
            self.storage_objects.clone(),
        );
    }
}
