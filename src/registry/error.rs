//! What went wrong in the registry, by what it means: the one vocabulary of failure every caller reads. Storage's
//! own errors end here, worded by what they mean; only the HTTP layer turns an [`Error`] into kube-apiserver's
//! `metav1.Status` (`apiserver::error`); in-process callers, such as the controller, match on it.

use crate::api::resource::ResourceInfo;
use crate::api::validation::FieldError;
use crate::registry::fieldmanager::FieldManagerError;
use crate::storage::StorageError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A registry failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: &'static ResourceInfo, name: String },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: &'static ResourceInfo, name: String },
    /// A precondition failed, or the object kept changing under a read-modify-write.
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {message}")]
    Conflict { resource: &'static ResourceInfo, name: String, message: String },
    /// Field management refused the write: an apply's conflicts with other managers, or a body it cannot take.
    #[error(transparent)]
    FieldManager(#[from] FieldManagerError),
    /// A resourceVersion or continue token older than the history kept; `continue_token` is where to go on from.
    #[error("{message}")]
    Expired { message: String, continue_token: Option<String> },
    /// A revision this server has not reached within the wait.
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    /// An object or options that fail validation: `kind` is the kind and group (`PodSet.demo.k8s.io`,
    /// `Scale.autoscaling`, `DeleteOptions.meta.k8s.io`; empty when there is none to name).
    #[error("{kind} \"{name}\" is invalid: {}", summary(.errors))]
    Invalid { kind: String, name: String, errors: Vec<FieldError> },
    /// A request that cannot be read as it stands (a body that does not decode, a name that does not match).
    #[error("{0}")]
    BadRequest(String),
    /// Storage cannot be reached (a write may still have landed, as with etcd's own clients).
    #[error("storage is unavailable: {0}")]
    Unavailable(String),
    /// Storage did not answer in time; a write may or may not have been applied.
    #[error("storage did not answer in time: {0}")]
    Timeout(String),
    /// The server is shutting down: storage takes no more requests.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Admission refused the write (a namespace that is missing or going, a webhook's denial or failure).
    #[error(transparent)]
    Admission(#[from] crate::admission::Error),
    /// A stored object that does not read back, or state the server should never reach.
    #[error("{0}")]
    Internal(String),
}

fn summary(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

impl Error {
    pub(crate) fn not_found(resource: &'static ResourceInfo, name: &str) -> Self {
        Error::NotFound { resource, name: name.to_owned() }
    }

    pub(crate) fn conflict(resource: &'static ResourceInfo, name: &str, message: impl Into<String>) -> Self {
        Error::Conflict { resource, name: name.to_owned(), message: message.into() }
    }

    /// The object changed since the caller read it.
    pub(crate) fn stale(resource: &'static ResourceInfo, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 on an object of `resource`.
    pub(crate) fn invalid(resource: &ResourceInfo, name: &str, errors: Vec<FieldError>) -> Self {
        Self::invalid_kind(&format!("{}.{}", resource.kind, resource.group), name, errors)
    }

    pub(crate) fn invalid_kind(kind: &str, name: &str, errors: Vec<FieldError>) -> Self {
        Error::Invalid { kind: kind.to_owned(), name: name.to_owned(), errors }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Error::BadRequest(message.into())
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }

    /// A storage failure on object `name` of `resource` (empty for collections), by what it means.
    pub(crate) fn storage(e: StorageError, resource: &'static ResourceInfo, name: &str) -> Self {
        match e {
            StorageError::NotFound { .. } => Self::not_found(resource, name),
            StorageError::AlreadyExists { .. } => Error::AlreadyExists { resource, name: name.to_owned() },
            StorageError::Conflict { .. } => Self::stale(resource, name),
            other => storage_failure(other),
        }
    }
}

/// What a storage failure that names no object means.
fn storage_failure(e: StorageError) -> Error {
    match e {
        StorageError::Expired { requested, oldest } => Error::Expired {
            message: format!("too old resource version: {requested} ({oldest})"),
            continue_token: None,
        },
        StorageError::TooLarge { requested, current } => Error::TooLargeResourceVersion { requested, current },
        StorageError::Unavailable(m) => Error::Unavailable(m),
        StorageError::Timeout(m) => Error::Timeout(m),
        StorageError::Closed => Error::ShuttingDown,
        other @ (StorageError::InvalidObject
        | StorageError::Stopped
        | StorageError::Backend(_)
        | StorageError::Corrupt(_)
        | StorageError::Unreadable { .. }
        | StorageError::Unwritable { .. }
        // Only ever an object's, which `Error::storage` names.
        | StorageError::NotFound { .. }
        | StorageError::AlreadyExists { .. }
        | StorageError::Conflict { .. }) => Error::Internal(other.to_string()),
    }
}

/// A storage failure on a collection (a list, a watch, a sync or compaction). Storage reports a missing, existing or
/// changed object only for an object's key, never for these.
impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        storage_failure(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resource::WIDGETS;

    /// An object's storage failure names its resource; a collection's never claims a missing or changed object.
    #[test]
    fn storage_failures_read_by_what_they_mean() {
        let missing = || StorageError::NotFound { key: "/widgets/blue".into() };
        let e = Error::storage(missing(), &WIDGETS, "blue");
        assert_eq!(e.to_string(), "widgets.test.podset.example \"blue\" not found");
        let e = Error::storage(
            StorageError::Conflict { key: "/widgets/blue".into(), expected: 1, actual: 2 },
            &WIDGETS,
            "blue",
        );
        assert!(matches!(&e, Error::Conflict { resource, .. } if resource.kind == "Widget"), "{e:?}");
        assert!(matches!(Error::from(missing()), Error::Internal(_)));
        assert!(matches!(Error::from(StorageError::Timeout("slow".into())), Error::Timeout(_)));
        assert!(matches!(Error::storage(StorageError::Closed, &WIDGETS, "blue"), Error::ShuttingDown));
    }
}
