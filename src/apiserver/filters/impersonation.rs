//! Impersonation: kube-apiserver impersonates before it proxies, so a request that reaches us asking to act as
//! someone else came around it, and is refused (403).

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::{Filter, Next};
use crate::apiserver::error::ApiError;

#[derive(Debug, Clone, Copy, Default)]
pub struct Impersonation;

/// Whether a request asks to impersonate (`Impersonate-User`, `-Group`, `-Uid`, `-Extra-*`).
pub fn asks_to_impersonate(headers: &http::HeaderMap) -> bool {
    headers.keys().any(|k| k.as_str().starts_with("impersonate-"))
}

impl Filter for Impersonation {
    async fn filter<N: Next>(self: Arc<Self>, req: Request, next: N) -> Response {
        if asks_to_impersonate(req.headers()) {
            return ApiError::impersonation_unsupported().into_response();
        }
        next.run(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_impersonation_header_counts() {
        for h in ["Impersonate-User", "impersonate-group", "Impersonate-Uid", "Impersonate-Extra-scopes"] {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::HeaderName::try_from(h).unwrap(), "x".parse().unwrap());
            assert!(asks_to_impersonate(&headers), "{h}");
        }
        assert!(!asks_to_impersonate(&http::HeaderMap::new()));
    }
}
