//! `WithAudit`: an authenticated request's audit events, as the policy asks: `RequestReceived` before it is
//! served, `ResponseComplete` with its answer, for a watch `ResponseStarted` when its answer starts and
//! `ResponseComplete` when it ends, `Panic` if serving it panicked. With `blocking-strict`, a request whose
//! `RequestReceived` event cannot be written is refused (500), as kube-apiserver refuses it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use http::StatusCode;

use super::panics::panic_message;
use super::{Filter, Next};
use crate::apiserver::audit::{AuditContext, Auditor, Stage};
use crate::apiserver::context::info_of;
use crate::apiserver::instrument::hold_while_streaming;

pub struct Audit(pub Option<Auditor>);

/// Writes a watch's `ResponseComplete` event when its body is done.
struct WatchEnd {
    auditor: Auditor,
    ctx: Arc<AuditContext>,
}

impl Drop for WatchEnd {
    fn drop(&mut self) {
        self.auditor.process(&self.ctx, Stage::ResponseComplete);
    }
}

impl Filter for Audit {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let Some(auditor) = &self.0 else { return next.run(req).await };
        let Some(ctx) = auditor.begin(&mut req) else { return next.run(req).await };
        if !auditor.process(&ctx, Stage::RequestReceived) {
            crate::apiserver::audit::metrics::metrics().requests_rejected.inc();
            let uri = req.uri().to_string();
            let body = format!("Internal Server Error: {uri:?}: failed to store audit event\n");
            return (StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
        }
        let info = info_of(&mut req);
        let (long_running, resource) = (info.is_long_running(), info.attributes.resource.is_some());
        req.extensions_mut().insert(ctx.clone());
        let resp = match AssertUnwindSafe(next.run(req)).catch_unwind().await {
            Ok(resp) => resp,
            Err(payload) => {
                auditor.panicked(&ctx, &panic_message(&*payload));
                std::panic::resume_unwind(payload);
            }
        };
        // Only a resource's answer is an object (kube's `LogResponseObject`); a watch's is a stream.
        let mut resp = auditor.log_response(&ctx, resp, resource && !long_running).await;
        if long_running && resp.status().is_success() {
            auditor.process(&ctx, Stage::ResponseStarted);
            let done = WatchEnd { auditor: auditor.clone(), ctx };
            let body = std::mem::take(resp.body_mut());
            *resp.body_mut() = hold_while_streaming(body, done);
        } else {
            if long_running {
                auditor.process(&ctx, Stage::ResponseStarted);
            }
            auditor.process(&ctx, Stage::ResponseComplete);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::audit::backend::Backend;
    use crate::apiserver::audit::{Event, Policy};
    use crate::apiserver::context::Authenticated;
    use crate::apiserver::filters::FilterLayer;
    use tower::{Layer, ServiceExt};

    /// Keeps the events; refuses them all if `refuse`.
    struct Recorder {
        events: parking_lot::Mutex<Vec<Event>>,
        refuse: bool,
    }

    impl Backend for Arc<Recorder> {
        fn name(&self) -> &'static str {
            "recorder"
        }

        fn process(&self, events: &[Event]) -> bool {
            self.events.lock().extend_from_slice(events);
            !self.refuse
        }
    }

    fn auditor(refuse: bool) -> (Auditor, Arc<Recorder>) {
        let rec = Arc::new(Recorder { events: Default::default(), refuse });
        let policy = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n").unwrap();
        (Auditor::new(policy, Arc::new(rec.clone())), rec)
    }

    fn request() -> Request {
        let mut req =
            Request::get("/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets").body(axum::body::Body::empty()).unwrap();
        req.extensions_mut().insert(Authenticated(Arc::new(crate::api::UserInfo::named("bob", vec![]))));
        req
    }

    #[tokio::test]
    async fn blocking_strict_refuses_a_request_whose_first_event_is_not_written() {
        let (auditor, rec) = auditor(true);
        let served = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = served.clone();
        let svc = FilterLayer::new(Audit(Some(auditor))).layer(tower::service_fn(move |_req: Request| {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>("served".into_response()) }
        }));
        let rejected = crate::apiserver::audit::metrics::metrics().requests_rejected.get();
        let resp = svc.oneshot(request()).await.unwrap();
        assert_eq!(resp.status(), 500);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert!(String::from_utf8_lossy(&body).ends_with("failed to store audit event\n"));
        assert!(!served.load(std::sync::atomic::Ordering::SeqCst), "never served");
        assert_eq!(rec.events.lock().len(), 1);
        assert!(crate::apiserver::audit::metrics::metrics().requests_rejected.get() > rejected);
    }

    #[tokio::test]
    async fn a_panic_is_audited_at_the_panic_stage_and_passed_on() {
        let (auditor, rec) = auditor(false);
        let svc = FilterLayer::new(Audit(Some(auditor)))
            .layer(tower::service_fn(|_req: Request| async { panic!("the handler broke") }));
        let outcome = std::panic::AssertUnwindSafe(svc.oneshot(request())).catch_unwind().await;
        assert!(outcome.is_err(), "the panic goes on to the panic recovery filter");
        let events = rec.events.lock().clone();
        let stages: Vec<Stage> = events.iter().map(|e| e.stage).collect();
        assert_eq!(stages, [Stage::RequestReceived, Stage::Panic]);
        let status = serde_json::to_value(&events[1].response_status).unwrap();
        assert_eq!(
            status,
            serde_json::json!({"metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
                "message": "APIServer panic'd: the handler broke"})
        );
    }
}
