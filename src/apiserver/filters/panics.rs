//! `WithPanicRecovery`: a request whose handling panics is answered `500` and logged with its method and path;
//! the connection and the server go on. (A panic after a watch's answer has started cannot be answered: the body
//! ends instead.)

use std::panic::AssertUnwindSafe;

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use http::StatusCode;

use super::{Filter, Next};

/// What the client reads, kube-apiserver's words.
pub const PANIC_BODY: &str = "This request caused apiserver to panic. Look in the logs for details.\n";

#[derive(Debug, Clone, Copy, Default)]
pub struct PanicRecovery;

/// The panic's message, when it has one.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl Filter for PanicRecovery {
    async fn filter<N: Next>(self: Arc<Self>, req: Request, next: N) -> Response {
        let (method, uri) = (req.method().clone(), req.uri().clone());
        match AssertUnwindSafe(next.run(req)).catch_unwind().await {
            Ok(resp) => resp,
            Err(payload) => {
                tracing::error!(%method, %uri, panic = panic_message(&*payload), "a request panicked");
                let mut resp = (StatusCode::INTERNAL_SERVER_ERROR, PANIC_BODY).into_response();
                resp.headers_mut().insert(http::header::CONTENT_TYPE, "text/plain; charset=utf-8".parse().unwrap());
                resp
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::filters::FilterLayer;
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn a_panic_is_answered_500_and_the_service_goes_on() {
        let svc = FilterLayer::new(PanicRecovery).layer(tower::service_fn(|req: Request| async move {
            if req.uri().path() == "/boom" {
                panic!("boom");
            }
            Ok("fine".into_response())
        }));
        let get = |p: &str| Request::get(p).body(axum::body::Body::empty()).unwrap();
        let resp = svc.clone().oneshot(get("/boom")).await.unwrap();
        assert_eq!(resp.status(), 500);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(body, PANIC_BODY.as_bytes());
        assert_eq!(svc.oneshot(get("/ok")).await.unwrap().status(), 200);
    }
}
