//! How storage and field-management failures read to clients: as kube-apiserver's `metav1.Status` errors.

use crate::api::status::ApiError;
use crate::registry::fieldmanager::FieldManagerError;
use crate::storage::StorageError;

/// A storage failure on object `name` (empty for collections).
pub(crate) fn storage_error(e: StorageError, name: &str) -> ApiError {
    match e {
        StorageError::NotFound { .. } => ApiError::not_found(name),
        StorageError::AlreadyExists { .. } => ApiError::already_exists(name),
        StorageError::Conflict { .. } => ApiError::stale(name),
        StorageError::Expired { requested, oldest } => {
            ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
        }
        StorageError::TooLarge { requested, current } => ApiError::too_large_resource_version(requested, current),
        StorageError::Closed => ApiError::service_unavailable("the server is shutting down"),
        StorageError::Unavailable(m) => ApiError::service_unavailable(format!("storage is unavailable: {m}")),
        StorageError::Timeout(m) => ApiError::timeout(&format!("storage did not answer in time: {m}")),
        other => ApiError::internal(other.to_string()),
    }
}

/// A storage failure on a collection (a list or watch).
impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        storage_error(e, "")
    }
}

impl From<FieldManagerError> for ApiError {
    fn from(e: FieldManagerError) -> Self {
        match e {
            FieldManagerError::Conflicts(conflicts) => {
                let message = FieldManagerError::Conflicts(conflicts.clone()).to_string();
                let causes = conflicts.into_iter().map(|c| (format!("conflict with {}", c.manager), c.field)).collect();
                ApiError::apply_conflict(&message, causes)
            }
            FieldManagerError::BadRequest(m) => ApiError::bad_request(m),
            e @ FieldManagerError::Schema(_) => ApiError::bad_request(e.to_string()),
        }
    }
}
