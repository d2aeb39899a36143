//! The registry's view of a stored PodSet. Everything outside the registry reads stored objects through these
//! accessors, and only `tree` here touches storage's parsed JSON, so storage can change how it keeps objects.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::key::PodSetKey;
use super::Revision;
use crate::api::selector::{FieldSelector, Selector};
use crate::api::status::{ApiError, ApiResult};
use crate::api::PodSet;
use crate::storage::Object;

/// A PodSet as stored at one revision (or as it would be stored, for a dry run).
#[derive(Debug, Clone)]
pub struct Stored(Arc<Object>);

/// The parsed JSON of a stored object: the one read of storage's tree.
fn tree(obj: &Object) -> &Value {
    &obj.value
}

fn str_at<'a>(obj: &'a Object, pointer: &str) -> Option<&'a str> {
    tree(obj).pointer(pointer).and_then(Value::as_str)
}

/// Whether a stored object passes a list's or watch's selectors.
pub(crate) fn object_matches(obj: &Object, labels: &Selector, fields: &FieldSelector) -> bool {
    labels.matches_json(tree(obj)) && fields.matches_json(tree(obj))
}

impl Stored {
    pub(crate) fn new(obj: Arc<Object>) -> Self {
        Self(obj)
    }

    /// An object that was not stored (dry run): its JSON, without a new resourceVersion.
    pub(crate) fn unstored(value: Value) -> Self {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Self(Arc::new(Object { key: String::new(), value: Arc::new(value), bytes, mod_revision: 0 }))
    }

    pub fn namespace(&self) -> &str {
        str_at(&self.0, "/metadata/namespace").unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        str_at(&self.0, "/metadata/name").unwrap_or_default()
    }

    pub fn key(&self) -> PodSetKey {
        PodSetKey::new(self.namespace(), self.name())
    }

    pub fn uid(&self) -> Option<&str> {
        str_at(&self.0, "/metadata/uid")
    }

    /// The revision of the object's last write (0 for an object a dry run did not store).
    pub fn resource_version(&self) -> Revision {
        self.0.mod_revision
    }

    /// The object's JSON, serialized once when it was written, `metadata.resourceVersion` included.
    pub fn bytes(&self) -> &Bytes {
        &self.0.bytes
    }

    /// The object as a JSON tree, for representations other than its stored bytes (YAML, Table, metadata).
    pub fn to_value(&self) -> Cow<'_, Value> {
        Cow::Borrowed(tree(&self.0))
    }

    pub fn decode(&self) -> ApiResult<PodSet> {
        PodSet::deserialize(tree(&self.0))
            .map_err(|e| ApiError::internal(format!("stored object {} is unreadable: {e}", self.0.key)))
    }

    pub(crate) fn matches(&self, labels: &Selector, fields: &FieldSelector) -> bool {
        object_matches(&self.0, labels, fields)
    }

    /// The same object reported at a later revision (a watch's DELETED for an object that left its selector).
    pub(crate) fn restamped(&self, revision: Revision) -> Self {
        let mut value = tree(&self.0).clone();
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), Value::String(revision.to_string()));
        }
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Self(Arc::new(Object { key: self.0.key.clone(), value: Arc::new(value), bytes, mod_revision: revision }))
    }

    /// True when this differs from `prev` only in `status` (and so its resourceVersion and managedFields, which
    /// every status write touches): a status write, which changes nothing a controller acts on.
    pub fn only_status_differs(&self, prev: &Stored) -> bool {
        let meta = |v: &Value| {
            let mut m = v.get("metadata").cloned().unwrap_or_default();
            if let Some(o) = m.as_object_mut() {
                o.remove("resourceVersion");
                o.remove("managedFields");
            }
            m
        };
        let (now, before) = (tree(&self.0), tree(&prev.0));
        now.get("spec") == before.get("spec") && meta(now) == meta(before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(v: Value, revision: Revision) -> Stored {
        let bytes = Bytes::from(serde_json::to_vec(&v).unwrap());
        Stored::new(Arc::new(Object { key: "/podsets/ns/a".into(), value: Arc::new(v), bytes, mod_revision: revision }))
    }

    #[test]
    fn a_status_write_changes_only_status_even_with_managed_fields() {
        let managed = |m: &str, t: &str| json!([{"manager": m, "operation": "Update", "time": t}]);
        let before = stored(
            json!({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1", "managedFields": managed("kubectl", "t1")},
                   "spec": {"replicas": 1}}),
            1,
        );
        let status = stored(
            json!({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "2", "managedFields": managed("podset-controller", "t2")},
                   "spec": {"replicas": 1}, "status": {"replicas": 1}}),
            2,
        );
        assert!(status.only_status_differs(&before));
        let spec = stored(
            json!({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "3"}, "spec": {"replicas": 2}}),
            3,
        );
        assert!(!spec.only_status_differs(&before));
        let labels = stored(
            json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"x": "y"}}, "spec": {"replicas": 1}}),
            4,
        );
        assert!(!labels.only_status_differs(&before));
        assert_eq!((status.key().to_string(), status.resource_version()), ("ns/a".to_owned(), 2));
    }
}
