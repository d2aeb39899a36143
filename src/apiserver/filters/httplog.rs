//! `WithHTTPLogging` and the request metrics: every request's answer is counted (`apiserver_request_total`, its
//! latency; a watch as long-running while it streams) and logged as one line with who asked and how it went.

use std::time::Instant;

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use super::authentication::Authenticated;
use super::{info_of, Filter, Next};
use crate::apiserver::auth::ConnInfo;
use crate::apiserver::instrument::{hold_while_streaming, RequestMetrics};

#[derive(Debug, Clone, Copy, Default)]
pub struct HttpLog;

impl Filter for HttpLog {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let started = Instant::now();
        let info = info_of(&mut req);
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let remote = req.extensions().get::<ConnInfo>().map(|c| c.remote);
        let metrics = RequestMetrics::new(&info, &method, &uri, req.headers());
        let mut resp = next.run(req).await;
        let code = resp.status().as_u16();
        metrics.record(code, started.elapsed());
        if metrics.is_watch() && resp.status().is_success() {
            let body = std::mem::take(resp.body_mut());
            *resp.body_mut() = hold_while_streaming(body, metrics.long_running());
        }
        let user = resp.extensions().get::<Authenticated>();
        tracing::info!(
            target: "podset_apiserver::http",
            method = %method,
            uri = %uri,
            user = user.map(|u| u.0.name.as_str()).unwrap_or(""),
            remote = remote.map(|r| r.to_string()).unwrap_or_default(),
            status = code,
            latency_us = started.elapsed().as_micros() as u64,
            "request"
        );
        resp
    }
}
