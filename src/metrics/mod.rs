//! `/metrics`: Prometheus metrics named and labelled as k8s.io/apiserver, client-go and kube-controller-manager
//! name theirs, so existing dashboards and alerts (apiserver SLOs, workqueue depth, leader status) work unchanged.
//!
//! One process-wide registry, as Kubernetes' `legacyregistry`: each part of the server owns its families (its
//! `metrics.rs`) and registers them here on first use ([`registered`]), and `/metrics` encodes them all with
//! prometheus-client (OpenMetrics text). prometheus-client writes every counter with a `_total` suffix, as
//! OpenMetrics requires; the names registered are the family names.

pub mod process;

use std::sync::LazyLock;

use prometheus_client::collector::Collector;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of what [`encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Families one part of the server owns, registered into the process registry once.
pub(crate) trait Families: Send + Sync + 'static {
    fn register(&self, r: &mut Registry);
}

/// Registers `families` into the process registry and hands them back: an owner's `LazyLock` initializer.
pub(crate) fn registered<F: Families>(families: F) -> F {
    families.register(&mut REGISTRY.lock());
    families
}

pub(crate) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Gauges read at each scrape from a function (the store's revisions and sizes, say): (name, help, value).
pub struct ScrapeGauges<F>(pub F);

impl<F> std::fmt::Debug for ScrapeGauges<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeGauges")
    }
}

impl<F> Collector for ScrapeGauges<F>
where
    F: Fn() -> Vec<(&'static str, &'static str, i64)> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        for (name, help, value) in (self.0)() {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

static REGISTRY: LazyLock<parking_lot::Mutex<Registry>> = LazyLock::new(|| {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(process::ProcessCollector));
    parking_lot::Mutex::new(registry)
});

/// Adds a collector read at each scrape (storage revisions, say).
pub fn register_collector(collector: Box<dyn Collector>) {
    REGISTRY.lock().register_collector(collector);
}

/// Everything registered so far, in the OpenMetrics text format.
pub fn encode() -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &REGISTRY.lock()) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::apiserver::metrics::RequestLabels;
    use crate::controller::metrics::NameLabel;

    #[test]
    fn names_and_labels_are_kubernetes_own() {
        crate::apiserver::metrics::metrics()
            .requests
            .get_or_create(&RequestLabels {
                verb: "LIST".into(),
                group: "demo.k8s.io".into(),
                version: "v1alpha1".into(),
                resource: "podsets".into(),
                scope: "namespace".into(),
                component: "apiserver".into(),
                code: "200".into(),
                ..Default::default()
            })
            .inc();
        crate::apiserver::auth::metrics::metrics().authn.observe("201", Duration::from_millis(3));
        crate::controller::metrics::metrics()
            .workqueue
            .depth
            .get_or_create(&NameLabel { name: "podset".into() })
            .set(2);
        let text = encode();
        for line in [
            "# TYPE apiserver_request counter",
            r#"apiserver_request_total{verb="LIST",dry_run="",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="namespace",component="apiserver",code="200"} "#,
            r#"apiserver_delegated_authn_request_duration_seconds_bucket{le="0.25",code="201"} "#,
            r#"workqueue_depth{name="podset"} 2"#,
            "# TYPE process_cpu_seconds counter",
            "process_open_fds ",
            "# EOF",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
