//! The request metrics (`apiserver_request_total`, its latency; a watch as long-running while it streams). Inside
//! the timeout, as kube-apiserver's instrumented routes: a request is counted with what its handler answered.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;

use super::{Filter, Next};
use crate::apiserver::context::info_of;
use crate::apiserver::instrument::{hold_while_streaming, RequestMetrics};

#[derive(Debug, Clone, Copy, Default)]
pub struct Instrument;

impl Filter for Instrument {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let started = Instant::now();
        let info = info_of(&mut req);
        let metrics = RequestMetrics::new(&info, req.method(), req.uri(), req.headers());
        let mut resp = next.run(req).await;
        metrics.record(resp.status().as_u16(), started.elapsed());
        if metrics.is_watch() && resp.status().is_success() {
            let body = std::mem::take(resp.body_mut());
            *resp.body_mut() = hold_while_streaming(body, metrics.long_running());
        }
        resp
    }
}
