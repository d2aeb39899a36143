//! The registry's view of a stored object. Everything outside the registry reads stored objects through these
//! accessors, and only `tree` here touches storage's parsed JSON, so storage can change how it keeps objects.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::error::{Error, Result};
use super::key::ObjectKey;
use super::strategy::{typed, Strategy};
use super::Revision;
use crate::api::resource::{ResourceInfo, VersionIndex};
use crate::api::selector::{FieldSelector, Selector};
use crate::storage::Object;

/// An object as stored at one revision (or as it would be stored, for a dry run), and its resource.
#[derive(Debug, Clone)]
pub struct Stored(Arc<Object>, &'static ResourceInfo);

/// Whether a stored object passes a list's or watch's selectors, read from the metadata storage indexes.
pub(crate) fn object_matches(obj: &Object, labels: &Selector, fields: &FieldSelector) -> bool {
    labels.matches_with(&|k| obj.meta.label(k)) && fields.matches_meta(&obj.meta.name, &obj.meta.namespace)
}

fn unreadable(obj: &Object, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("stored object {} is unreadable: {e}", obj.key))
}

impl Stored {
    pub(crate) fn new(obj: Arc<Object>, resource: &'static ResourceInfo) -> Self {
        Self(obj, resource)
    }

    pub fn resource(&self) -> &'static ResourceInfo {
        self.1
    }

    /// The object as storage holds it.
    pub(crate) fn object(&self) -> &Object {
        &self.0
    }

    /// An object that was not stored (dry run): its JSON, without a new resourceVersion.
    pub(crate) fn unstored(value: Value, resource: &'static ResourceInfo) -> Self {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Self(Arc::new(Object::with_bytes("", &value, bytes, 0)), resource)
    }

    pub fn namespace(&self) -> &str {
        &self.0.meta.namespace
    }

    pub fn name(&self) -> &str {
        &self.0.meta.name
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(self.namespace(), self.name())
    }

    pub fn uid(&self) -> Option<&str> {
        Some(&*self.0.meta.uid).filter(|u| !u.is_empty())
    }

    /// The revision of the object's last write (0 for an object a dry run did not store).
    pub fn resource_version(&self) -> Revision {
        self.0.mod_revision
    }

    /// The object's JSON, serialized once when it was written, `metadata.resourceVersion` included.
    pub fn bytes(&self) -> &Bytes {
        &self.0.bytes
    }

    /// The object as a JSON tree, parsed for this caller (storage keeps only the bytes).
    pub fn to_value(&self) -> Result<Value> {
        self.0.parse().map_err(|e| unreadable(&self.0, e))
    }

    /// The object as `S`'s hub holds it, whichever version it was stored in.
    pub fn decode<S: Strategy>(&self) -> Result<S::Object> {
        debug_assert!(std::ptr::eq(S::INFO, self.1), "{} decoded as {}", self.1, S::INFO);
        let mut o: S::Object = serde_json::from_slice(&self.0.bytes).map_err(|e| unreadable(&self.0, e))?;
        S::to_hub(&mut o, typed::<S>(self.version()));
        Ok(o)
    }

    /// The version the object was stored in (the resource's unnamed one for objects that name none).
    pub fn version(&self) -> VersionIndex {
        // Stored objects are written by this server, apiVersion first; anything else is parsed to find it.
        let bytes = &self.0.bytes[..];
        if let Some(i) = self.1.versions.iter().position(|v| bytes.starts_with(v.json_head.as_bytes())) {
            return VersionIndex(i as u8);
        }
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(rename = "apiVersion", default)]
            api_version: String,
        }
        serde_json::from_slice::<Head>(bytes)
            .ok()
            .and_then(|h| self.1.version_of(&h.api_version))
            .unwrap_or(self.1.conversion.unnamed)
    }

    /// The object in `version`, as a client of that version reads it (its managedFields as recorded).
    pub fn to_version(&self, version: impl Into<VersionIndex>) -> Result<Stored> {
        let (from, version) = (self.version(), version.into());
        if from == version {
            return Ok(self.clone());
        }
        if let Some(rest) = self.splice_rest(from) {
            let bytes = [self.1.version(version).json_head.as_bytes(), rest].concat();
            let obj = Object::from_parts(&self.0.key, self.0.meta.clone(), bytes.into(), self.0.mod_revision);
            return Ok(Self(Arc::new(obj), self.1));
        }
        let mut value = self.to_value()?;
        self.1.convert_value(&mut value, from, version);
        if self.0.mod_revision == 0 {
            return Ok(Self::unstored(value, self.1));
        }
        let obj = Object::new(&self.0.key, value, self.0.mod_revision).map_err(|e| unreadable(&self.0, e))?;
        Ok(Self(Arc::new(obj), self.1))
    }

    /// What `make` derives from this revision (a Table row, say), made once and kept as long as the revision is;
    /// `None` if another kind of value was kept first.
    pub fn memo<T: std::any::Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.0.memo(make)
    }

    pub(crate) fn matches(&self, labels: &Selector, fields: &FieldSelector) -> bool {
        object_matches(&self.0, labels, fields)
    }

    /// The same object reported at a later revision (a watch's DELETED for an object that left its selector).
    pub(crate) fn restamped(&self, revision: Revision) -> Result<Self> {
        let obj = Object::new(&self.0.key, self.to_value()?, revision).map_err(|e| unreadable(&self.0, e))?;
        Ok(Self(Arc::new(obj), self.1))
    }

    /// What follows `apiVersion` in the stored bytes, when every version differs from the stored one only there
    /// (the rest holds nothing a conversion moves): most objects, converted by splicing, nothing parsed.
    fn splice_rest(&self, from: VersionIndex) -> Option<&[u8]> {
        let rest = self.0.bytes.strip_prefix(self.1.version(from).json_head.as_bytes())?;
        (self.1.conversion.version_neutral)(rest).then_some(rest)
    }

    /// Whether every other version has this object by [`Stored::to_version`]'s splice (the stored bytes with only
    /// the apiVersion changed, so with the same metadata and the same fields under it): what a Table row or
    /// PartialObjectMetadata may take from the stored bytes in any version. Depends on the bytes alone, so a caller
    /// may keep it with the revision.
    pub fn converts_by_splicing(&self) -> bool {
        self.splice_rest(self.version()).is_some()
    }

    /// Appends the object as `version` has it to `buf` (a list's items): the stored bytes, spliced when they can be,
    /// with no copy of the object in between.
    pub fn put_in_version(&self, buf: &mut impl bytes::BufMut, version: impl Into<VersionIndex>) -> Result<()> {
        let (from, version) = (self.version(), version.into());
        if from == version {
            buf.put_slice(&self.0.bytes);
        } else if let Some(rest) = self.splice_rest(from) {
            buf.put_slice(self.1.version(version).json_head.as_bytes());
            buf.put_slice(rest);
        } else {
            buf.put_slice(self.to_version(version)?.bytes());
        }
        Ok(())
    }

    /// True when this differs from `prev` only in `status` (and so its resourceVersion and managedFields, which
    /// every status write touches): a status write, which changes nothing a controller acts on.
    pub fn only_status_differs(&self, prev: &Stored) -> bool {
        // Compared in one version: a migration rewrites an object in another without changing it.
        let (Ok(now), Ok(before)) = (self.to_value(), prev.to_version(self.version()).and_then(|p| p.to_value()))
        else {
            return false;
        };
        let meta = |v: &Value| {
            let mut m = v.get("metadata").cloned().unwrap_or_default();
            if let Some(o) = m.as_object_mut() {
                o.remove("resourceVersion");
                o.remove("managedFields");
            }
            m
        };
        now.get("spec") == before.get("spec") && meta(&now) == meta(&before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Version;
    use serde_json::json;

    fn stored(v: Value, revision: Revision) -> Stored {
        Stored::new(Arc::new(Object::new("/podsets/ns/a", v, revision).unwrap()), &crate::resources::podset::INFO)
    }

    #[test]
    fn conversion_splices_the_api_version_when_nothing_else_differs_and_converts_otherwise() {
        let plain = json!({"apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x"}}, "spec": {"replicas": 2}});
        let spliced = stored(plain.clone(), 7).to_version(Version::V1alpha1).unwrap();
        assert!(spliced.bytes().starts_with(br#"{"apiVersion":"demo.k8s.io/v1alpha1","#));
        let mut want = plain.clone();
        want["apiVersion"] = json!("demo.k8s.io/v1alpha1");
        want["metadata"]["resourceVersion"] = json!("7");
        assert_eq!(spliced.to_value().unwrap(), want);
        assert_eq!((spliced.resource_version(), spliced.name(), spliced.version()), (7, "a", Version::V1alpha1.into()));
        assert!(spliced.matches(&Selector::parse("app=x").unwrap(), &FieldSelector::default()), "indexes kept");
        // With the field, the real conversion.
        let mut with = plain.clone();
        with["spec"]["minReadySeconds"] = json!(5);
        let converted = stored(with, 7).to_version(Version::V1alpha1).unwrap().to_value().unwrap();
        assert_eq!(converted["metadata"]["annotations"]["demo.k8s.io/v1beta1-min-ready-seconds"], "5");
        assert_eq!(converted["spec"].get("minReadySeconds"), None);
        let back = stored(converted, 7).to_version(Version::V1beta1).unwrap().to_value().unwrap();
        assert_eq!(back["spec"]["minReadySeconds"], 5);
        assert_eq!(back["metadata"].get("annotations"), None);
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
