//! Every failed request ends here: the shared `ApiError` (a `metav1.Status`) rendered as an HTTP response.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use kube::core::Status;
use serde::Serialize;

pub use crate::api::status::{ApiError, ApiResult};
use crate::registry::{self, fieldmanager::FieldManagerError};
use crate::storage::StorageError;

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

/// The registry's failures as kube-apiserver words them.
impl From<registry::Error> for ApiError {
    fn from(e: registry::Error) -> Self {
        use registry::Error as E;
        match e {
            E::NotFound { name } => ApiError::not_found(&name),
            E::AlreadyExists { name } => ApiError::already_exists(&name),
            E::Conflict { name, message } => ApiError::conflict(&name, &message),
            E::FieldManager(FieldManagerError::Conflicts(conflicts)) => {
                let message = FieldManagerError::Conflicts(conflicts.clone()).to_string();
                let causes = conflicts.into_iter().map(|c| (format!("conflict with {}", c.manager), c.field)).collect();
                ApiError::apply_conflict(&message, causes)
            }
            E::FieldManager(FieldManagerError::BadRequest(m)) => ApiError::bad_request(m),
            E::FieldManager(e @ FieldManagerError::Schema(_)) => ApiError::bad_request(e.to_string()),
            E::Expired { message, continue_token } => {
                let mut e = ApiError::expired(message);
                if let (Some(token), Some(meta)) = (continue_token, e.status.metadata.as_mut()) {
                    meta.continue_ = Some(token);
                }
                e
            }
            E::TooLargeResourceVersion { requested, current } => {
                ApiError::too_large_resource_version(requested, current)
            }
            E::Invalid { kind, name, errors } => ApiError::invalid_kind(&kind, &name, &errors),
            E::BadRequest(m) => ApiError::bad_request(m),
            E::Storage { source, .. } => match source {
                StorageError::Closed => ApiError::service_unavailable("the server is shutting down"),
                StorageError::Unavailable(m) => ApiError::service_unavailable(format!("storage is unavailable: {m}")),
                StorageError::Timeout(m) => ApiError::timeout(&format!("storage did not answer in time: {m}")),
                other => ApiError::internal(other.to_string()),
            },
            E::Admission(e) => ApiError { status: Box::new(e.status()) },
            E::Internal(m) => ApiError::internal(m),
        }
    }
}
