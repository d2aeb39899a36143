//! Every failed request ends here: the registry's and admission's typed errors worded as kube-apiserver words them
//! (an [`ApiError`], a `metav1.Status`), and rendered as an HTTP response.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use kube::core::Status;
use serde::Serialize;

use kube::core::response::{StatusCause, StatusSummary};

use super::status::status_details;
pub use super::status::{ApiError, ApiResult};
use crate::admission;
use crate::registry::{self, fieldmanager::FieldManagerError};

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

/// The Status a response carries, for the filters that look at the answer (audit).
#[derive(Debug, Clone)]
pub struct Answered(pub Box<Status>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, status_json(&self)).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(d) = self.status.details.as_ref().filter(|d| d.retry_after_seconds > 0) {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(d.retry_after_seconds));
        }
        resp.extensions_mut().insert(Answered(self.status));
        resp
    }
}

/// The registry's failures as kube-apiserver words them.
impl From<registry::Error> for ApiError {
    fn from(e: registry::Error) -> Self {
        use registry::Error as E;
        match e {
            E::NotFound { resource, name } => ApiError::not_found(resource, &name),
            E::AlreadyExists { resource, name } => ApiError::already_exists(resource, &name),
            E::Conflict { resource, name, message } => ApiError::conflict(resource, &name, &message),
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
            E::ShuttingDown => ApiError::service_unavailable("the server is shutting down"),
            E::Unavailable(m) => ApiError::service_unavailable(format!("storage is unavailable: {m}")),
            E::Timeout(m) => ApiError::timeout(&format!("storage did not answer in time: {m}")),
            E::Admission(e) => e.into(),
            E::Internal(m) => ApiError::internal(m),
        }
    }
}

impl From<admission::Error> for ApiError {
    fn from(e: admission::Error) -> Self {
        Self::from(&e)
    }
}

/// Admission's refusals as kube-apiserver 1.20 answers them (code, reason, message, details).
impl From<&admission::Error> for ApiError {
    fn from(e: &admission::Error) -> Self {
        use admission::Error as E;
        let message = e.to_string();
        match e {
            E::NamespaceNotFound { namespace } => ApiError::new(404, "NotFound", message).with_details(status_details(
                namespace,
                "",
                "namespaces",
                Vec::new(),
            )),
            E::NamespaceTerminating { namespace, resource, name } => {
                let cause = StatusCause {
                    reason: "NamespaceTerminating".into(),
                    message: format!("namespace {namespace} is being terminated"),
                    field: "metadata.namespace".into(),
                };
                ApiError::new(403, "Forbidden", message).with_details(status_details(
                    name,
                    &resource.group,
                    &resource.resource,
                    vec![cause],
                ))
            }
            E::NotReady { resource, name } => ApiError::new(403, "Forbidden", message).with_details(status_details(
                name,
                &resource.group,
                &resource.resource,
                Vec::new(),
            )),
            E::MatchConditions { resource, name, .. } => ApiError::new(403, "Forbidden", message)
                .with_details(status_details(name, &resource.group, &resource.resource, Vec::new())),
            // `validating/dispatcher.go`: NewForbidden's Status with the validation's reason, its code, and the
            // policy's message as the one cause.
            E::PolicyDenied { resource, name, message: cause, reason } => {
                let cause = StatusCause { reason: String::new(), message: cause.clone(), field: String::new() };
                ApiError::new(admission::policy_reason_code(reason), reason, message).with_details(status_details(
                    name,
                    &resource.group,
                    &resource.resource,
                    vec![cause],
                ))
            }
            E::NamespaceLookup { source, .. } => internal_with_cause(source.to_string()),
            E::Denied { webhook, status } => denied(webhook, status.as_deref().cloned()),
            E::DryRunUnsupported { .. } => ApiError::bad_request(message),
            E::QuotaRefused { resource, name, .. } => ApiError::new(403, "Forbidden", message)
                .with_details(status_details(name, &resource.group, &resource.resource, Vec::new())),
            // The main API server's answer as it is; anything else as `ErrorToAPIStatus` words an error that is
            // not a Status: 500, no reason.
            E::QuotaAccess { source } => match &**source {
                kube::Error::Api(status) => ApiError { status: status.clone() },
                _ => ApiError::new(500, "", message),
            },
            // As `ErrorToAPIStatus` answers an error that is a Status: as it is, a failure with no code a 500.
            E::Plugin { status, .. } => {
                let mut status = status.clone();
                status.status.get_or_insert(StatusSummary::Failure);
                if status.code == 0 {
                    status.code = 500;
                }
                status.metadata.get_or_insert_with(Default::default);
                ApiError { status }
            }
            E::Calling { .. }
            | E::PatchWithoutObject { .. }
            | E::Conversion { .. }
            | E::Patch { .. }
            | E::Configuration { .. }
            | E::QuotaTimeout
            | E::QuotaUnreadable { .. } => internal_with_cause(message),
        }
    }
}

/// `apierrors.NewInternalError(err)`: the message also as the one cause.
fn internal_with_cause(message: String) -> ApiError {
    let cause = StatusCause { reason: String::new(), message: message.clone(), field: String::new() };
    ApiError::internal(message).with_details(status_details("", "", "", vec![cause]))
}

/// A webhook's denial, as `webhookerrors.ToStatusErr` turns it into the answer: the webhook's own Status (its
/// reason and details) with the code [`admission::denial_code`] gives, and the message prefixed with which webhook
/// denied the request.
fn denied(webhook: &str, result: Option<Status>) -> ApiError {
    let code = admission::denial_code(result.as_ref());
    let mut s = result.unwrap_or_else(|| Status {
        status: None,
        code: 0,
        message: String::new(),
        metadata: None,
        reason: String::new(),
        details: None,
    });
    s.code = code;
    s.status = Some(StatusSummary::Failure);
    let denied_by = format!("admission webhook {webhook:?} denied the request");
    s.message = if !s.message.is_empty() {
        format!("{denied_by}: {}", s.message)
    } else if !s.reason.is_empty() {
        format!("{denied_by}: {}", s.reason)
    } else {
        format!("{denied_by} without explanation")
    };
    if s.metadata.is_none() {
        s.metadata = Some(Default::default());
    }
    ApiError { status: Box::new(s) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::webhook::CallError;
    use crate::admission::{Error, GroupResource};

    fn json(e: Error) -> serde_json::Value {
        serde_json::to_value(&*ApiError::from(e).status).unwrap()
    }

    fn status(e: Error) -> Status {
        *ApiError::from(e).status
    }

    #[test]
    fn namespace_errors_read_as_kube_apiservers() {
        let e = Error::NamespaceNotFound { namespace: "gone".into() };
        assert_eq!(
            json(e),
            serde_json::json!({"status": "Failure", "code": 404, "reason": "NotFound", "metadata": {},
                "message": "namespaces \"gone\" not found", "details": {"name": "gone", "kind": "namespaces"}})
        );
        let podsets = GroupResource { group: "demo.k8s.io".into(), resource: "podsets".into() };
        let e = Error::NamespaceTerminating { namespace: "old".into(), resource: podsets.clone(), name: "web".into() };
        assert_eq!(
            json(e),
            serde_json::json!({"status": "Failure", "code": 403, "reason": "Forbidden", "metadata": {},
                "message": "podsets.demo.k8s.io \"web\" is forbidden: unable to create new content in namespace old because it is being terminated",
                "details": {"name": "web", "group": "demo.k8s.io", "kind": "podsets", "causes": [{
                    "reason": "NamespaceTerminating", "message": "namespace old is being terminated",
                    "field": "metadata.namespace"}]}})
        );
        let e = Error::NotReady { resource: podsets, name: String::new() };
        assert_eq!(status(e).message, "podsets.demo.k8s.io is forbidden: not yet ready to handle request");
        let configmaps = GroupResource { group: String::new(), resource: "configmaps".into() };
        let e = Error::NamespaceTerminating { namespace: "old".into(), resource: configmaps, name: "c".into() };
        let m = status(e).message;
        assert!(m.starts_with("configmaps \"c\" is forbidden: unable"), "{m}");
    }

    #[test]
    fn a_denial_keeps_the_webhooks_status_with_kube_apiservers_defaults() {
        let theirs = |v: serde_json::Value| Some(Box::new(serde_json::from_value::<Status>(v).unwrap()));
        let deny = |s| status(Error::Denied { webhook: "deny.example.com".into(), status: s });

        let s =
            deny(theirs(serde_json::json!({"code": 403, "message": "no PodSets on Fridays", "reason": "Forbidden"})));
        assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
        assert_eq!(s.message, "admission webhook \"deny.example.com\" denied the request: no PodSets on Fridays");

        let s = deny(theirs(serde_json::json!({"code": 200, "reason": "NotToday"})));
        assert_eq!((s.code, s.status), (400, Some(StatusSummary::Failure)), "a code below 400 becomes 400");
        assert_eq!(s.message, "admission webhook \"deny.example.com\" denied the request: NotToday");

        let s = deny(None);
        assert_eq!((s.code, s.reason.as_str()), (400, ""));
        assert_eq!(s.message, "admission webhook \"deny.example.com\" denied the request without explanation");
    }

    #[test]
    fn failures_are_internal_errors_and_a_dry_run_refusal_is_a_bad_request() {
        let e = Error::Calling { webhook: "w.example.com".into(), source: CallError::SideEffectsUnset };
        let s = status(e);
        assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
        assert_eq!(
            s.message,
            "Internal error occurred: failed calling webhook \"w.example.com\": Webhook SideEffects is nil"
        );
        assert_eq!(
            s.details.unwrap().causes[0].message,
            "failed calling webhook \"w.example.com\": Webhook SideEffects is nil"
        );

        let s = status(Error::DryRunUnsupported { webhook: "w.example.com".into() });
        assert_eq!((s.code, s.reason.as_str(), s.details.is_none()), (400, "BadRequest", true));
        assert_eq!(s.message, "admission webhook \"w.example.com\" does not support dry run");
    }

    #[test]
    fn a_plugins_own_status_is_answered_as_it_is() {
        let theirs = |v: serde_json::Value| Box::new(serde_json::from_value::<Status>(v).unwrap());
        let refused = theirs(
            serde_json::json!({"code": 403, "reason": "Forbidden", "message": "podsets \"web\" is forbidden: no"}),
        );
        let e = Error::Plugin { plugin: "Example", status: refused };
        assert_eq!(e.to_string(), "podsets \"web\" is forbidden: no");
        assert_eq!(
            json(e),
            serde_json::json!({"status": "Failure", "code": 403, "reason": "Forbidden", "metadata": {},
                "message": "podsets \"web\" is forbidden: no"})
        );
        let s = status(Error::Plugin { plugin: "Example", status: theirs(serde_json::json!({"message": "broken"})) });
        assert_eq!((s.code, s.status, s.message.as_str()), (500, Some(StatusSummary::Failure), "broken"));
    }

    /// The registry's failures as served, byte for byte.
    #[test]
    fn registry_statuses_equal_their_snapshots() {
        use crate::api::validation::FieldError;
        let podsets = &crate::resources::podset::INFO;
        let cases = [
            ("not-found", registry::Error::not_found(podsets, "web")),
            ("already-exists", registry::Error::AlreadyExists { resource: podsets, name: "web".into() }),
            ("conflict", registry::Error::stale(podsets, "web")),
            (
                "invalid",
                registry::Error::invalid(
                    podsets,
                    "web",
                    vec![
                        FieldError::required("spec.selector", "selector is required"),
                        FieldError::invalid("spec.replicas", -1, "must be greater than or equal to 0"),
                    ],
                ),
            ),
        ];
        for (name, e) in cases {
            crate::apiserver::golden::check(&format!("status/{name}.json"), &status_json(&ApiError::from(e)));
        }
    }
}
