//! W3C trace context in and out of the server, as kube's `tracing.Propagators()` carries it (`traceparent`,
//! `tracestate`): read from a request, written into every request the server makes (admission webhooks, TokenReview
//! and SubjectAccessReview, the controller's calls), so one trace follows a request across servers. Spans are
//! `tracing` spans; with `--tracing-config-file` they are exported over OTLP, without it none is made.

use std::future::Future;
use std::task::{Context, Poll};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

tokio::task_local! {
    /// Set while a trace that is not sampled runs: its spans would be dropped, so they are not made.
    static UNSAMPLED: ();
}

/// Whether the running task's trace is known not to be sampled (the exporter's filter asks, per span).
pub fn unsampled() -> bool {
    UNSAMPLED.try_with(|_| ()).is_ok()
}

/// Runs `f` in `span`. When the span's trace is not sampled, the spans `f` would make under it are not made at
/// all: an unsampled request costs one span, not one per step.
pub async fn in_span<F: Future>(span: tracing::Span, f: F) -> F::Output {
    if span.is_disabled() {
        return f.await;
    }
    match span.context().span().span_context().is_sampled() {
        true => f.instrument(span).await,
        false => UNSAMPLED.scope((), f.instrument(span)).await,
    }
}

/// The span context a request's `traceparent` names, when it names a valid one.
pub fn remote(headers: &HeaderMap) -> Option<SpanContext> {
    if !headers.contains_key("traceparent") {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(&Headers(headers));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Writes the current span's context into `headers` (nothing when no span is exported).
pub fn inject_current(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (http::HeaderName::try_from(key), http::HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

/// A tower layer for the server's kube clients: each request is a client span (`HTTP GET`, with the URL and the
/// answer's code) and carries its context, as kube's `tracing.WrapperFor` does for its clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTracing;

impl<S> tower::Layer<S> for ClientTracing {
    type Service = TracedClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TracedClient(inner)
    }
}

#[derive(Debug, Clone)]
pub struct TracedClient<S>(S);

impl<S, B, R> tower::Service<http::Request<B>> for TracedClient<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let span = tracing::info_span!(
            "HTTP",
            otel.name = %format_args!("HTTP {}", req.method()),
            otel.kind = "client",
            http.request.method = %req.method(),
            url.full = %req.uri(),
            http.response.status_code = tracing::field::Empty,
        );
        span.in_scope(|| inject_current(req.headers_mut()));
        let answer = self.0.call(req);
        let recorded = span.clone();
        Box::pin(
            async move {
                let resp = answer.await?;
                recorded.record("http.response.status_code", resp.status().as_u16());
                Ok(resp)
            }
            .instrument(span),
        )
    }
}
