//! The audit metrics, as k8s.io/apiserver's `audit` package counts them.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PluginLabel {
    pub plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LevelLabel {
    pub level: String,
}

#[derive(Debug, Default)]
pub(crate) struct AuditMetrics {
    pub events: Counter,
    pub errors: Family<PluginLabel, Counter>,
    pub levels: Family<LevelLabel, Counter>,
    pub requests_rejected: Counter,
}

static METRICS: LazyLock<AuditMetrics> = LazyLock::new(|| registered(AuditMetrics::default()));

pub(crate) fn metrics() -> &'static AuditMetrics {
    &METRICS
}

impl Families for AuditMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "apiserver_audit_event",
            "Counter of audit events generated and sent to the audit backend.",
            self.events.clone(),
        );
        r.register(
            "apiserver_audit_error",
            "Counter of audit events that failed to be audited properly. Plugin identifies the plugin affected by \
             the error.",
            self.errors.clone(),
        );
        r.register(
            "apiserver_audit_level",
            "Counter of policy levels for audit events (1 per request).",
            self.levels.clone(),
        );
        r.register(
            "apiserver_audit_requests_rejected",
            "Counter of apiserver requests rejected due to an error in audit logging backend.",
            self.requests_rejected.clone(),
        );
    }
}
