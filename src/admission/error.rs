//! Why admission refused a request, and the `metav1.Status` kube-apiserver 1.20 answers for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use kube::core::Status;

use super::webhook::CallError;
use crate::api::status::status_details;

/// What stopped a request in admission. Each variant keeps what caused it; [`Error::status`] says it as
/// kube-apiserver does.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write into a namespace the main API server does not have (NamespaceLifecycle, or a webhook's
    /// namespaceSelector that needed the namespace's labels).
    #[error("namespaces \"{namespace}\" not found")]
    NamespaceNotFound { namespace: String },

    /// A create into a namespace that is being deleted.
    #[error(
        "{} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
        target(resource, name)
    )]
    NamespaceTerminating { namespace: String, resource: GroupResource, name: String },

    /// The namespace could not be read from the main API server (other than not found).
    #[error("reading namespace {namespace} from the main API server: {source}")]
    NamespaceLookup {
        namespace: String,
        #[source]
        source: Box<kube::Error>,
    },

    /// A plugin's caches have not had their first list from the main API server within 10 s.
    #[error("{} is forbidden: not yet ready to handle request", target(resource, name))]
    NotReady { resource: GroupResource, name: String },

    /// A webhook answered `allowed: false`; `status` is what it sent (its `result`), if anything.
    #[error("admission webhook \"{webhook}\" denied the request")]
    Denied { webhook: String, status: Option<Box<Status>> },

    /// The webhook could not be called or answered something unusable, under `failurePolicy: Fail`.
    #[error("failed calling webhook \"{webhook}\": {source}")]
    Calling {
        webhook: String,
        #[source]
        source: CallError,
    },

    /// A dry run reached a webhook whose `sideEffects` is `Some` or `Unknown`.
    #[error("admission webhook \"{webhook}\" does not support dry run")]
    DryRunUnsupported { webhook: String },

    /// A mutating webhook's `patch` is not a JSON patch, or does not apply to the object.
    #[error("admission webhook \"{webhook}\" returned a patch that {what}: {source}")]
    Patch {
        webhook: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A mutating webhook patched a request that has no object (a delete).
    #[error(
        "admission webhook \"{webhook}\" attempted to modify the object, which is not supported for this operation"
    )]
    PatchWithoutObject { webhook: String },

    /// A webhook configuration this server cannot use (a selector that does not parse).
    #[error("webhook \"{webhook}\": {message}")]
    Configuration { webhook: String, message: String },
}

/// A resource in a group, as errors name it: `podsets.demo.k8s.io`, `configmaps`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// How `apierrors.NewForbidden` names what it refuses: `podsets.demo.k8s.io "web"`, or the resource alone.
fn target(resource: &GroupResource, name: &str) -> String {
    if name.is_empty() {
        resource.to_string()
    } else {
        format!("{resource} {name:?}")
    }
}

fn status(code: u16, reason: &str, message: String, details: Option<StatusDetails>) -> Status {
    Status {
        status: Some(StatusSummary::Failure),
        code,
        message,
        metadata: Some(ListMeta::default()),
        reason: reason.to_owned(),
        details,
    }
}

/// `apierrors.NewInternalError(err)`.
fn internal(message: String) -> Status {
    let cause = StatusCause { reason: String::new(), message: message.clone(), field: String::new() };
    status(
        500,
        "InternalError",
        format!("Internal error occurred: {message}"),
        Some(status_details("", "", "", vec![cause])),
    )
}

impl Error {
    /// The `metav1.Status` kube-apiserver 1.20 answers with (code, reason, message, details).
    pub fn status(&self) -> Status {
        match self {
            Error::NamespaceNotFound { namespace } => {
                status(404, "NotFound", self.to_string(), Some(status_details(namespace, "", "namespaces", Vec::new())))
            }
            Error::NamespaceTerminating { namespace, resource, name } => {
                let cause = StatusCause {
                    reason: "NamespaceTerminating".into(),
                    message: format!("namespace {namespace} is being terminated"),
                    field: "metadata.namespace".into(),
                };
                let d = status_details(name, &resource.group, &resource.resource, vec![cause]);
                status(403, "Forbidden", self.to_string(), Some(d))
            }
            Error::NotReady { resource, name } => status(
                403,
                "Forbidden",
                self.to_string(),
                Some(status_details(name, &resource.group, &resource.resource, vec![])),
            ),
            Error::NamespaceLookup { source, .. } => internal(source.to_string()),
            Error::Denied { webhook, status: result } => denied(webhook, result.as_deref()),
            Error::Calling { .. } | Error::PatchWithoutObject { .. } | Error::Patch { .. } => {
                internal(self.to_string())
            }
            Error::DryRunUnsupported { .. } => status(400, "BadRequest", self.to_string(), None),
            Error::Configuration { .. } => internal(self.to_string()),
        }
    }

    /// True when the webhook itself said no (for metrics and logs: a refusal, not a failure).
    pub fn is_denial(&self) -> bool {
        matches!(self, Error::Denied { .. })
    }
}

/// The webhook's own Status, as `webhookerrors.ToStatusErr` turns it into the answer: its code (400 when it gave
/// none or one below 400), reason and details, and the message prefixed with which webhook denied the request.
fn denied(webhook: &str, result: Option<&Status>) -> Status {
    let mut s = result.cloned().unwrap_or_else(|| Status {
        status: Some(StatusSummary::Failure),
        code: 0,
        message: String::new(),
        metadata: None,
        reason: String::new(),
        details: None,
    });
    if s.code < 400 {
        s.code = 400;
    }
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
        s.metadata = Some(ListMeta::default());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &Status) -> serde_json::Value {
        serde_json::to_value(s).unwrap()
    }

    #[test]
    fn namespace_errors_read_as_kube_apiservers() {
        let e = Error::NamespaceNotFound { namespace: "gone".into() };
        assert_eq!(
            json(&e.status()),
            serde_json::json!({"status": "Failure", "code": 404, "reason": "NotFound", "metadata": {},
                "message": "namespaces \"gone\" not found", "details": {"name": "gone", "kind": "namespaces"}})
        );
        let podsets = GroupResource { group: "demo.k8s.io".into(), resource: "podsets".into() };
        let e = Error::NamespaceTerminating { namespace: "old".into(), resource: podsets.clone(), name: "web".into() };
        assert_eq!(
            json(&e.status()),
            serde_json::json!({"status": "Failure", "code": 403, "reason": "Forbidden", "metadata": {},
                "message": "podsets.demo.k8s.io \"web\" is forbidden: unable to create new content in namespace old because it is being terminated",
                "details": {"name": "web", "group": "demo.k8s.io", "kind": "podsets", "causes": [{
                    "reason": "NamespaceTerminating", "message": "namespace old is being terminated",
                    "field": "metadata.namespace"}]}})
        );
        let e = Error::NotReady { resource: podsets, name: String::new() };
        assert_eq!(e.status().message, "podsets.demo.k8s.io is forbidden: not yet ready to handle request");
        let configmaps = GroupResource { group: String::new(), resource: "configmaps".into() };
        let e = Error::NamespaceTerminating { namespace: "old".into(), resource: configmaps, name: "c".into() };
        assert!(e.status().message.starts_with("configmaps \"c\" is forbidden: unable"), "{e}");
    }

    #[test]
    fn a_denial_keeps_the_webhooks_status_with_kube_apiservers_defaults() {
        let theirs = |v: serde_json::Value| Some(Box::new(serde_json::from_value::<Status>(v).unwrap()));
        let deny = |s| Error::Denied { webhook: "deny.example.com".into(), status: s }.status();

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
        let s = e.status();
        assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
        assert_eq!(
            s.message,
            "Internal error occurred: failed calling webhook \"w.example.com\": Webhook SideEffects is nil"
        );
        assert_eq!(
            s.details.unwrap().causes[0].message,
            "failed calling webhook \"w.example.com\": Webhook SideEffects is nil"
        );

        let s = Error::DryRunUnsupported { webhook: "w.example.com".into() }.status();
        assert_eq!((s.code, s.reason.as_str(), s.details.is_none()), (400, "BadRequest", true));
        assert_eq!(s.message, "admission webhook \"w.example.com\" does not support dry run");
    }
}
