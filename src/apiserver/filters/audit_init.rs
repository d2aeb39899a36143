//! `WithAuditInit`: every request gets an audit ID, the one kube-apiserver's proxy sent in `Audit-ID` (so its audit
//! events and ours join), or a new UUID; the answer carries it back in `Audit-Id`, whatever the audit policy. The
//! time the request was received is taken here too (`WithRequestReceivedTimestamp`).

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use chrono::Utc;
use http::HeaderValue;

use super::{Filter, Next};
use crate::apiserver::context::{AuditId, ReceivedAt, AUDIT_ID_HEADER};

fn new_id() -> HeaderValue {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let id = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
    HeaderValue::from_str(id).expect("a UUID is a header value")
}

#[derive(Debug, Clone, Copy, Default)]
pub struct AuditInit;

impl Filter for AuditInit {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let id = match req.headers().get(AUDIT_ID_HEADER) {
            Some(v) if !v.is_empty() && v.to_str().is_ok() => v.clone(),
            _ => new_id(),
        };
        req.extensions_mut().insert(AuditId(id.clone()));
        req.extensions_mut().insert(ReceivedAt(Utc::now()));
        let mut resp = next.run(req).await;
        resp.headers_mut().entry(AUDIT_ID_HEADER).or_insert(id);
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::filters::FilterLayer;
    use axum::response::IntoResponse;
    use tower::{Layer, ServiceExt};

    fn echo() -> impl Next {
        tower::service_fn(|req: Request| async move {
            let id = req.extensions().get::<AuditId>().expect("set by the filter").as_str().to_owned();
            assert!(req.extensions().get::<ReceivedAt>().is_some());
            Ok(id.into_response())
        })
    }

    async fn call(header: Option<&str>) -> (String, String) {
        let mut req = Request::get("/apis").body(axum::body::Body::empty()).unwrap();
        if let Some(h) = header {
            req.headers_mut().insert("Audit-ID", h.parse().unwrap());
        }
        let resp = FilterLayer::new(AuditInit).layer(echo()).oneshot(req).await.unwrap();
        let header = resp.headers()["audit-id"].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        (header, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_proxys_id_is_kept_and_echoed() {
        let (header, seen) = call(Some("8a2c7a5e-0c1e-4a8e-9d0f-4b1e2f3a4b5c")).await;
        assert_eq!((header.as_str(), seen.as_str()), ("8a2c7a5e-0c1e-4a8e-9d0f-4b1e2f3a4b5c", header.as_str()));
    }

    #[tokio::test]
    async fn without_one_each_request_gets_a_new_uuid() {
        let (a, seen) = call(None).await;
        let (b, _) = call(Some("")).await;
        assert_eq!(a, seen);
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 4, "{id}");
        }
    }
}
