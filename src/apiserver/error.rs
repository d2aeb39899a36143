//! Every failed request ends here: the shared `ApiError` (a `metav1.Status`) rendered as an HTTP response.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use kube::core::Status;
use serde::Serialize;

pub use crate::api::status::{ApiError, ApiResult};

/// `metav1.Status` with its type fields: client-go only recognises an error body that says `kind: Status`.
#[derive(Serialize)]
pub struct StatusBody<'a> {
    pub kind: &'static str,
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    #[serde(flatten)]
    pub status: &'a Status,
}

impl<'a> StatusBody<'a> {
    pub fn new(status: &'a Status) -> Self {
        Self { kind: "Status", api_version: "v1", status }
    }
}

fn status_json(e: &ApiError) -> Vec<u8> {
    serde_json::to_vec(&StatusBody::new(&e.status)).unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, status_json(&self)).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(d) = self.status.details.as_ref().filter(|d| d.retry_after_seconds > 0) {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(d.retry_after_seconds));
        }
        resp
    }
}
