//! Why admission refused a request, typed; `apiserver::error` words each as kube-apiserver 1.20 answers it.

use kube::core::Status;

use super::webhook::CallError;

/// What stopped a request in admission. Each variant keeps what caused it, and its message is kube-apiserver's.
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

    /// The object could not be converted to the version a webhook's rules name (`matchPolicy: Equivalent`).
    #[error("converting the object to {version} for an admission webhook: {source}")]
    Conversion {
        version: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A mutating webhook patched a request that has no object (a delete).
    #[error(
        "admission webhook \"{webhook}\" attempted to modify the object, which is not supported for this operation"
    )]
    PatchWithoutObject { webhook: String },

    /// ResourceQuota refused a create: over a quota's limit, a quota whose status has no usage yet, or a limited
    /// resource no quota covers.
    #[error("{} is forbidden: {reason}", target(resource, name))]
    QuotaRefused { resource: GroupResource, name: String, reason: String },

    /// ResourceQuota did not decide within its evaluation timeout.
    #[error("resource quota evaluation timed out")]
    QuotaTimeout,

    /// A quota whose status holds a quantity this server cannot count.
    #[error("{message}")]
    QuotaUnreadable { message: String },

    /// The namespace's quotas could not be read, or their status not written (after the retries): the main API
    /// server's own answer, or why there was none with every cause ("client error (Connect)" alone does not say
    /// the connection was refused).
    #[error("{}", chain(&**source))]
    QuotaAccess { source: std::sync::Arc<kube::Error> },

    /// A webhook's matchConditions failed to evaluate under `failurePolicy: Fail` (403, as `apierrors.NewForbidden`).
    #[error("{} is forbidden: {message}", target(resource, name))]
    MatchConditions { resource: GroupResource, name: String, message: String },

    /// A ValidatingAdmissionPolicy denied the request: `message` names the policy and binding and says why,
    /// `reason` is the validation's (`Invalid` when it gave none).
    #[error("{} is forbidden: {message}", target(resource, name))]
    PolicyDenied { resource: GroupResource, name: String, message: String, reason: String },

    /// A webhook configuration this server cannot use (a selector that does not parse).
    #[error("webhook \"{webhook}\": {message}")]
    Configuration { webhook: String, message: String },

    /// A plugin's refusal as the Status it answers with (`apierrors.New…`), so that a plugin needs no variant of
    /// its own.
    #[error("{}", status.message)]
    Plugin { plugin: &'static str, status: Box<Status> },
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
/// An error and its sources, as one line; a source its error already quotes is not repeated.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

fn target(resource: &GroupResource, name: &str) -> String {
    if name.is_empty() {
        resource.to_string()
    } else {
        format!("{resource} {name:?}")
    }
}

impl Error {
    /// True when the webhook itself said no (for metrics and logs: a refusal, not a failure).
    pub fn is_denial(&self) -> bool {
        matches!(self, Error::Denied { .. })
    }
}

/// The code a webhook's denial is answered with, as `webhookerrors.ToStatusErr` sets it: the webhook's own, or
/// 400 when it gave none or one below 400.
pub fn denial_code(result: Option<&Status>) -> u16 {
    result.map_or(0, |s| s.code).max(400)
}

/// The code of a policy's denial by its reason, as `validating/policy_decision.go`'s `reasonToCode`.
pub fn policy_reason_code(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_access_failure_names_every_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] std::io::Error);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = Error::QuotaAccess { source: std::sync::Arc::new(kube::Error::Service(Box::new(Connect(refused)))) };
        // kube's own Display already quotes its source: it is not repeated.
        assert_eq!(e.to_string(), "ServiceError: client error (Connect): Connection refused");
    }
}
