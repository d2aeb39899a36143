//! The delegated authentication and authorization metrics, as k8s.io/apiserver's `authenticatorfactory` and
//! `authorizerfactory` count them.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families, HistogramFamily};

/// The delegated authn/authz webhooks' buckets.
const REVIEW_BUCKETS: [f64; 8] = [0.25, 0.5, 0.7, 1., 1.5, 3., 5., 10.];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabel {
    pub status: String,
}

/// Delegated authentication (TokenReview) or authorization (SubjectAccessReview).
#[derive(Debug)]
pub(crate) struct DelegatedReviews {
    pub requests: Family<CodeLabel, Counter>,
    pub duration: HistogramFamily<CodeLabel>,
    /// Answers from our cache (`hit`) or asked of the main API server (`miss`).
    pub cache: Family<StatusLabel, Counter>,
}

impl DelegatedReviews {
    fn new() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(REVIEW_BUCKETS)),
            cache: Family::default(),
        }
    }

    /// One review: `code` is the main API server's HTTP status, or `<error>` when it did not answer.
    pub fn observe(&self, code: &str, took: Duration) {
        let label = CodeLabel { code: code.to_owned() };
        self.requests.get_or_create(&label).inc();
        self.duration.get_or_create(&label).observe(took.as_secs_f64());
    }

    pub fn cache_lookup(&self, hit: bool) {
        self.cache.get_or_create(&StatusLabel { status: if hit { "hit" } else { "miss" }.into() }).inc();
    }
}

/// TokenReviews (`authn`) and SubjectAccessReviews (`authz`).
#[derive(Debug)]
pub(crate) struct DelegationMetrics {
    pub authn: DelegatedReviews,
    pub authz: DelegatedReviews,
}

static METRICS: LazyLock<DelegationMetrics> =
    LazyLock::new(|| registered(DelegationMetrics { authn: DelegatedReviews::new(), authz: DelegatedReviews::new() }));

pub(crate) fn metrics() -> &'static DelegationMetrics {
    &METRICS
}

impl Families for DelegationMetrics {
    fn register(&self, r: &mut Registry) {
        for (prefix, reviews) in
            [("apiserver_delegated_authn", &self.authn), ("apiserver_delegated_authz", &self.authz)]
        {
            r.register(
                format!("{prefix}_request"),
                "Number of HTTP requests partitioned by status code.",
                reviews.requests.clone(),
            );
            r.register(
                format!("{prefix}_request_duration_seconds"),
                "Request latency in seconds. Broken down by status code.",
                reviews.duration.clone(),
            );
        }
        r.register(
            "authentication_token_cache_request",
            "TokenReview answers served from the cache (hit) or asked for (miss).",
            self.authn.cache.clone(),
        );
        r.register(
            "podset_authorization_cache_request",
            "SubjectAccessReview answers served from the cache (hit) or asked for (miss).",
            self.authz.cache.clone(),
        );
    }
}
