//! `--request-timeout`, as k8s.io/apiserver's `WithTimeoutForNonLongRunningRequests` and `WithRequestDeadline`: a
//! request that has not answered within the timeout (or the shorter `?timeout=` it asked for) gets a `504` Status.
//! As in kube-apiserver, the handler is not cut off mid-way: it runs on in its own task and its answer is dropped, so
//! a write that was about to commit still commits whole (a 504 does not say whether it did; a client must read
//! before it retries). Watches are exempt: they end on their own after `--min-request-timeout`.
//!
//! This layer sits outside the handler, so a request's metrics and audit event record what the handler finally
//! answered, not the 504 (kube-apiserver counts these in `apiserver_request_terminations_total`; not here yet).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::Request;
use tower::{Layer, Service};

use crate::apiserver::audit::Auditor;
use crate::apiserver::context::info_of;
use crate::apiserver::error::ApiError;

#[derive(Debug, Clone)]
pub struct RequestTimeoutLayer {
    timeout: Duration,
    /// Audits a request refused for its `?timeout=`, as kube's `WithRequestDeadline` does.
    audit: Option<Auditor>,
}

impl RequestTimeoutLayer {
    pub fn new(timeout: Duration, audit: Option<Auditor>) -> Self {
        Self { timeout, audit }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout { inner, timeout: self.timeout, audit: self.audit.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
    audit: Option<Auditor>,
}

/// The `timeout` query parameter (a Go duration, or seconds), as `WithRequestDeadline` reads it.
fn requested_timeout(query: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(raw) = form_urlencoded::parse(query.unwrap_or("").as_bytes()).find(|(k, _)| k == "timeout") else {
        return Ok(None);
    };
    let raw = raw.1;
    if raw.is_empty() {
        return Ok(None);
    }
    match crate::api::duration::parse(&raw) {
        Ok(d) => Ok(Some(d)),
        Err(_) => Err(ApiError::bad_request(format!("invalid timeout specified in the request URL: {raw:?}"))),
    }
}

impl<S, B> Service<Request<B>> for RequestTimeout<S>
where
    S: Service<Request<B>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if info_of(&mut req).is_long_running() {
            return Box::pin(self.inner.call(req));
        }
        let timeout = match requested_timeout(req.uri().query()) {
            Ok(asked) => asked.map_or(self.timeout, |t| t.min(self.timeout)),
            Err(e) => {
                let resp = match &self.audit {
                    Some(audit) => audit.failed_request(&mut req, e.into_response()),
                    None => e.into_response(),
                };
                return Box::pin(std::future::ready(Ok(resp)));
            }
        };
        let running = tokio::spawn(self.inner.call(req));
        Box::pin(async move {
            match tokio::time::timeout(timeout, running).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => Ok(ApiError::internal(format!("the request handler failed: {e}")).into_response()),
                Err(_) => Ok(ApiError::timeout("request did not complete within the allotted timeout").into_response()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    /// A handler that takes `delay` and then records that it finished.
    fn slow(
        delay: Duration,
        finished: Arc<AtomicBool>,
    ) -> impl Service<Request<()>, Response = Response, Error = Infallible, Future = impl Send> + Clone {
        tower::service_fn(move |_req: Request<()>| {
            let finished = finished.clone();
            async move {
                tokio::time::sleep(delay).await;
                finished.store(true, Ordering::SeqCst);
                Ok::<_, Infallible>("done".into_response())
            }
        })
    }

    async fn status_of(resp: Response) -> (u16, serde_json::Value) {
        use http_body_util::BodyExt;
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&body).unwrap_or_default())
    }

    const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets";

    #[tokio::test(start_paused = true)]
    async fn an_overrunning_request_gets_504_and_its_handler_still_finishes() {
        let finished = Arc::new(AtomicBool::new(false));
        let svc = RequestTimeoutLayer::new(Duration::from_secs(60), None)
            .layer(slow(Duration::from_secs(61), finished.clone()));
        let req = Request::post(PODSETS).body(()).unwrap();
        let (code, body) = status_of(svc.oneshot(req).await.unwrap()).await;
        assert_eq!((code, body["kind"].as_str(), body["reason"].as_str()), (504, Some("Status"), Some("Timeout")));
        assert_eq!(body["message"], "Timeout: request did not complete within the allotted timeout");
        assert!(!finished.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(finished.load(Ordering::SeqCst), "the handler ran to its end: a write is never cut in half");
    }

    #[tokio::test(start_paused = true)]
    async fn in_time_passes_through_and_query_timeout_shortens_it() {
        let finished = Arc::new(AtomicBool::new(false));
        let svc = RequestTimeoutLayer::new(Duration::from_secs(60), None)
            .layer(slow(Duration::from_secs(59), finished.clone()));
        let resp = svc.clone().oneshot(Request::get(PODSETS).body(()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 200);
        let shorter = Request::get(format!("{PODSETS}?timeout=30s")).body(()).unwrap();
        assert_eq!(svc.clone().oneshot(shorter).await.unwrap().status(), 504);
        let longer = Request::get(format!("{PODSETS}?timeout=5m")).body(()).unwrap();
        assert_eq!(svc.clone().oneshot(longer).await.unwrap().status(), 200, "never longer than --request-timeout");
        let bad = Request::get(format!("{PODSETS}?timeout=soon")).body(()).unwrap();
        assert_eq!(status_of(svc.oneshot(bad).await.unwrap()).await.0, 400);
    }

    #[tokio::test(start_paused = true)]
    async fn watches_are_not_timed_out() {
        let finished = Arc::new(AtomicBool::new(false));
        let svc =
            RequestTimeoutLayer::new(Duration::from_secs(1), None).layer(slow(Duration::from_secs(3600), finished));
        let watch = Request::get(format!("{PODSETS}?watch=true")).body(()).unwrap();
        assert_eq!(svc.oneshot(watch).await.unwrap().status(), 200);
    }
}
