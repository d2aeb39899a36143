//! A failed request as kube-apiserver words it: a `metav1.Status` with its code, reason, message and details.
//! [`super::error`] turns the registry's and admission's typed errors into one and renders it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use kube::core::Status;

use crate::api::validation::FieldError;
use crate::registry::ResourceInfo;

/// A failed request, as a `metav1.Status`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Boxed: errors travel in every `Result` on the request path.
    pub status: Box<Status>,
}

pub type ApiResult<T> = Result<T, ApiError>;

/// `metav1.StatusDetails` naming an object (or nothing, all empty) and the causes.
pub(super) fn status_details(name: &str, group: &str, kind: &str, causes: Vec<StatusCause>) -> StatusDetails {
    StatusDetails {
        name: name.to_owned(),
        group: group.to_owned(),
        kind: kind.to_owned(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    }
}

fn details(resource: &ResourceInfo, name: &str) -> StatusDetails {
    status_details(name, resource.group, resource.plural, Vec::new())
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status: Box::new(Status {
                status: Some(StatusSummary::Failure),
                code,
                message: message.into(),
                metadata: Some(ListMeta::default()),
                reason: reason.to_owned(),
                details: None,
            }),
        }
    }

    pub(super) fn with_details(mut self, d: StatusDetails) -> Self {
        self.status.details = Some(d);
        self
    }

    pub fn code(&self) -> u16 {
        self.status.code
    }

    pub fn reason(&self) -> &str {
        &self.status.reason
    }

    pub fn not_found(resource: &ResourceInfo, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} \"{name}\" not found")).with_details(details(resource, name))
    }

    pub fn already_exists(resource: &ResourceInfo, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"))
            .with_details(details(resource, name))
    }

    pub fn conflict(resource: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"))
            .with_details(details(resource, name))
    }

    /// 422 Invalid for any kind, e.g. `Scale.autoscaling` or `ListOptions.meta.k8s.io`.
    pub fn invalid_kind(kind_group: &str, name: &str, errors: &[FieldError]) -> Self {
        let summary = match errors {
            [one] => one.to_string(),
            many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
        };
        let causes = errors
            .iter()
            .map(|e| StatusCause { reason: e.reason().to_owned(), message: e.body(), field: e.field.clone() })
            .collect();
        let (kind, group) = kind_group.split_once('.').unwrap_or((kind_group, ""));
        Self::new(422, "Invalid", format!("{kind_group} \"{name}\" is invalid: {summary}"))
            .with_details(status_details(name, group, kind, causes))
    }

    /// 409 for a server-side apply that would change fields other managers own: one cause per field.
    pub fn apply_conflict(message: &str, causes: Vec<(String, String)>) -> Self {
        let causes = causes
            .into_iter()
            .map(|(message, field)| StatusCause { reason: "FieldManagerConflict".into(), message, field })
            .collect();
        Self::new(409, "Conflict", message).with_details(status_details("", "", "", causes))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 with kube-apiserver's details: the group, the resource as `kind`, the name.
    pub fn forbidden(message: String, group: &str, resource: &str, name: &str) -> Self {
        Self::new(403, "Forbidden", message).with_details(status_details(name, group, resource, Vec::new()))
    }

    pub fn impersonation_unsupported() -> Self {
        Self::new(
            403,
            "Forbidden",
            "impersonation is not supported by podset-apiserver directly: send impersonated requests through kube-apiserver",
        )
    }

    pub fn method_not_allowed(method: impl std::fmt::Display, path: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method} {path})"),
        )
    }

    /// kube-apiserver's words: the types it serves, not what the client asked for.
    pub fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml",
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"))
    }

    pub fn unsupported_patch(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"))
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit}"))
    }

    pub fn path_not_found(path: &str) -> Self {
        Self::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {}", message.into()))
    }

    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e =
            Self::new(504, "Timeout", format!("Timeout: Too large resource version: {requested}, current: {current}"));
        let cause = StatusCause {
            reason: "ResourceVersionTooLarge".into(),
            message: "Too large resource version".into(),
            field: String::new(),
        };
        e.status.details = Some(StatusDetails { retry_after_seconds: 1, ..status_details("", "", "", vec![cause]) });
        e
    }

    /// `apierrors.NewTooManyRequests`, as the max-in-flight filter answers: retry after a second.
    pub fn too_many_requests() -> Self {
        let mut e = Self::new(429, "TooManyRequests", "Too many requests, please try again later.");
        e.status.details = Some(StatusDetails { retry_after_seconds: 1, ..status_details("", "", "", Vec::new()) });
        e
    }

    /// `apierrors.NewTimeoutError(message, 0)`: the server gave up waiting for the answer.
    pub fn timeout(message: &str) -> Self {
        Self::new(504, "Timeout", format!("Timeout: {message}"))
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.status.message)
    }
}

impl std::error::Error for ApiError {}
