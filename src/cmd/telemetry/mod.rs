//! Logs and traces. Logs go to stderr (text or JSON, `RUST_LOG` filtering); with `--tracing-config-file` the
//! server's spans (requests, admission, storage, the controller's reconciles and calls) are exported over OTLP/gRPC
//! as kube-apiserver exports its own: batched in a bounded queue on a thread of their own, so a slow or missing
//! collector costs dropped spans, never a waiting request. Without the file no span is made at all.

pub mod config;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing_subscriber::filter::{dynamic_filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use config::TracingConfiguration;

use super::LogFormat;

/// The service our spans come from (kube-apiserver's are `apiserver`).
pub const SERVICE_NAME: &str = "podset-apiserver";

/// How long one export may take before the batch is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Spans waiting for export; more are dropped (the SDK's log, at warn, says so, as it says an export failed).
const MAX_QUEUE: usize = 2048;

/// The exporter, flushed when dropped.
#[must_use = "dropping it stops the export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            // Spans still queued go out, within the export timeout.
            let _ = p.shutdown_with_timeout(EXPORT_TIMEOUT);
        }
    }
}

/// Sets up logging, and tracing when `tracing` is given; `RUST_LOG`, or else `default_filter`, says what is logged.
/// Must run inside the Tokio runtime (the exporter's gRPC channel lives there).
pub fn init(
    format: LogFormat,
    tracing: Option<&TracingConfiguration>,
    default_filter: &str,
) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Spans are for the exporter: the log lines stay as they are, without span context.
    let events = filter.and(dynamic_filter_fn(|m, _| !m.is_span()).with_callsite_filter(|m| match m.is_span() {
        true => Interest::never(),
        false => Interest::always(),
    }));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs = match format {
        LogFormat::Text => fmt.with_filter(events).boxed(),
        LogFormat::Json => fmt.json().with_filter(events).boxed(),
    };
    let (provider, spans) = match tracing {
        None => {
            // Without the exporter no layer wants a span: their callsites are off for good.
            tracing_subscriber::registry().with(logs).init();
            return Ok(Telemetry { provider: None });
        }
        Some(config) => {
            let provider = provider(config)?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(SERVICE_NAME))
                .with_location(false)
                .with_threads(false)
                .with_level(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                // Only this server's spans (its log events stay logs): a trace's first span, which is made only
                // for a sampled trace, and the spans of a sampled trace's work.
                // Asked per span (the answer depends on the thread's work), for this server's span callsites only.
                .with_filter(
                    dynamic_filter_fn(|m, _| {
                        m.is_span()
                            && m.target().starts_with("podset_apiserver")
                            && (m.target() == crate::trace::ROOT || crate::trace::sampled())
                    })
                    .with_max_level_hint(LevelFilter::INFO)
                    .with_callsite_filter(|m| {
                        match m.is_span() && m.target().starts_with("podset_apiserver") {
                            true => Interest::sometimes(),
                            false => Interest::never(),
                        }
                    }),
                );
            crate::trace::configure(config.sampling_ratio());
            (provider, layer)
        }
    };
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(Telemetry { provider: Some(provider) })
}

/// kube's `NewProvider`: OTLP/gRPC without TLS, batched; sampled as the caller's trusted context says, else
/// `samplingRatePerMillion` of new traces.
fn provider(config: &TracingConfiguration) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().with_timeout(EXPORT_TIMEOUT);
    let exporter = match config.endpoint() {
        config::Endpoint::Tcp(address) => exporter.with_endpoint(format!("http://{address}")),
        config::Endpoint::Unix(path) => {
            let channel = tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector_lazy(
                tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(&path).await?,
                        ))
                    }
                }),
            );
            exporter.with_channel(channel)
        }
    }
    .build()?;
    // New traces are sampled before their first span is made (trace::sample_new_trace), so every span that
    // reaches the SDK is one to keep.
    let sampler = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUE).build())
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(SERVICE_NAME)
        .with_attribute(KeyValue::new("service.instance.id", instance()))
        .build();
    Ok(SdkTracerProvider::builder().with_sampler(sampler).with_span_processor(batch).with_resource(resource).build())
}

/// This replica's name: the Pod's, as its host name.
fn instance() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}
