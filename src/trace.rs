//! W3C trace context in and out of the server, as kube's `tracing.Propagators()` carries it (`traceparent`,
//! `tracestate`): read from a request, written into every request the server makes (admission webhooks, TokenReview
//! and SubjectAccessReview, the controller's calls), so one trace follows a request across servers. Spans are
//! `tracing` spans; with `--tracing-config-file` they are exported over OTLP, without it none is made.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of the spans that start a trace (a request, a reconcile, a call made outside both): the only spans
/// the exporter lets be made outside a sampled trace.
pub const ROOT: &str = "podset_apiserver::trace";

/// Whether spans are exported (`--tracing-config-file`), and the share of new traces sampled, as f64 bits.
static ON: AtomicBool = AtomicBool::new(false);
static RATIO: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set while a sampled trace's work runs on this thread: spans may be made.
    static SAMPLED: Cell<bool> = const { Cell::new(false) };
}

/// Turns tracing on, sampling `ratio` (0 to 1) of new traces (the exporter's setup calls it).
pub fn configure(ratio: f64) {
    RATIO.store(ratio.to_bits(), Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether the work running on this thread belongs to a sampled trace (the exporter's filter asks, per span).
pub fn sampled() -> bool {
    SAMPLED.with(Cell::get)
}

/// Whether a new trace is sampled: kube's `TraceIDRatioBased(samplingRatePerMillion / 1e6)`, decided before any
/// span is made, so a trace not sampled costs nothing.
pub fn sample_new_trace() -> bool {
    let ratio = f64::from_bits(RATIO.load(Ordering::Relaxed));
    enabled() && ratio > 0.0 && rand::random::<f64>() < ratio
}

/// Runs `f` as part of a sampled trace: spans made while it runs are exported.
pub async fn in_sampled<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| in_sampled_sync(|| f.as_mut().poll(cx))).await
}

/// [`in_sampled`] for synchronous work (a thread of the server's own).
pub fn in_sampled_sync<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the flag back however `f` ends, a panic included: the thread goes on serving other traces.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SAMPLED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SAMPLED.with(|s| s.replace(true)));
    f()
}

/// Runs `f` in the root span `make` makes (with target [`ROOT`]) when a new trace is sampled, else untraced.
pub async fn new_trace<F: Future>(make: impl FnOnce() -> tracing::Span, f: F) -> F::Output {
    if !sample_new_trace() {
        return f.await;
    }
    in_sampled(f).instrument(make()).await
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

/// A tower layer for the server's kube clients: each request made within a trace (a SubjectAccessReview in a
/// request's, a controller's call in its reconcile's, a TokenReview in its own) is a client span (`HTTP GET`, with
/// the URL and the answer's code) and carries its context, as kube's `tracing.WrapperFor` does for its clients.
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
        // kube's client runs this in its buffer's worker task, which enters the caller's span but not its sampled
        // flag: a call is part of a trace when the caller is in a span (spans exist only in sampled traces).
        if tracing::Span::current().id().is_none() {
            return Box::pin(self.0.call(req));
        }
        let method = req.method().clone();
        let span = tracing::info_span!(
            target: ROOT,
            "HTTP",
            otel.name = %format_args!("HTTP {method}"),
            otel.kind = "client",
            http.request.method = %method,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampled_flag_is_put_back_however_the_work_ends() {
        assert!(!sampled());
        assert!(in_sampled_sync(sampled));
        let panicked = std::panic::catch_unwind(|| in_sampled_sync(|| panic!("a handler's panic")));
        assert!(panicked.is_err());
        assert!(!sampled(), "a panic left the thread marked as in a sampled trace");
        in_sampled_sync(|| {
            in_sampled_sync(|| ());
            assert!(sampled(), "nested work keeps the outer flag");
        });
    }
}
