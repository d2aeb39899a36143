//! One stored object as the cache keeps it: its JSON, serialized once per revision, and the few metadata fields
//! selectors and lookups read (as kube-apiserver's cacher keeps an object's labels and fields beside it). No parsed
//! tree stays alive: a reader that needs more parses the bytes for the one request.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::{stamp_resource_version, Result, Revision, StorageError};

/// The metadata the cache indexes: namespace, name, uid and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    pub namespace: Box<str>,
    pub name: Box<str>,
    pub uid: Box<str>,
    /// Sorted by key.
    labels: Box<[(Box<str>, Box<str>)]>,
}

impl ObjectMeta {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.labels[i].1)
    }

    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(k, v)| (&**k, &**v))
    }

    fn from_value(value: &Value) -> Self {
        let meta = value.get("metadata");
        let s = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or_default().into();
        let labels = meta.and_then(|m| m.get("labels")).and_then(Value::as_object);
        let labels = labels
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
            .collect::<BTreeMap<Box<str>, Box<str>>>();
        Self { namespace: s("namespace"), name: s("name"), uid: s("uid"), labels: labels.into_iter().collect() }
    }

    /// Reads only `metadata` of a JSON document; everything else is skipped without building a tree.
    fn from_json(json: &[u8]) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(Deserialize, Default)]
        struct Meta {
            #[serde(default)]
            namespace: String,
            #[serde(default)]
            name: String,
            #[serde(default)]
            uid: String,
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        let m = serde_json::from_slice::<Doc>(json)?.metadata;
        Ok(Self {
            namespace: m.namespace.into(),
            name: m.name.into(),
            uid: m.uid.into(),
            labels: m.labels.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        })
    }
}

/// A value derived from one revision of an object by a layer above storage (a Table row, say), made at most once
/// and dropped with the revision.
#[derive(Default)]
pub struct Memo(OnceLock<Box<dyn Any + Send + Sync>>);

impl fmt::Debug for Memo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() { "Memo(set)" } else { "Memo(empty)" })
    }
}

#[derive(Debug)]
pub struct Object {
    pub key: String,
    pub meta: ObjectMeta,
    /// The JSON, `metadata.resourceVersion` included.
    pub bytes: Bytes,
    pub mod_revision: Revision,
    memo: Memo,
}

impl Object {
    /// Stamps `metadata.resourceVersion` with `revision` and serializes, once for the life of this state.
    pub fn new(key: &str, mut value: Value, revision: Revision) -> Result<Self> {
        stamp_resource_version(&mut value, revision)?;
        let mut json = serde_json::to_vec(&value).map_err(|e| StorageError::Backend(e.to_string()))?;
        // The buffer grew by doubling; kept for the life of the revision, its spare capacity would be a third of
        // the cache's memory.
        json.shrink_to_fit();
        Ok(Self::with_bytes(key, &value, Bytes::from(json), revision))
    }

    /// An object whose bytes are already `value` serialized.
    pub fn with_bytes(key: &str, value: &Value, bytes: Bytes, mod_revision: Revision) -> Self {
        Self { key: key.to_owned(), meta: ObjectMeta::from_value(value), bytes, mod_revision, memo: Memo::default() }
    }

    /// An object from its stored JSON (which already carries its resourceVersion).
    pub fn from_json(key: &str, bytes: Bytes, mod_revision: Revision) -> Result<Self> {
        let meta = ObjectMeta::from_json(&bytes).map_err(|e| StorageError::Corrupt(format!("object {key:?}: {e}")))?;
        Ok(Self { key: key.to_owned(), meta, bytes, mod_revision, memo: Memo::default() })
    }

    /// An object from JSON stored without its resourceVersion (as etcd holds it: the revision is the key's
    /// mod_revision, known only once written), stamped with `revision` by splicing it into `metadata`.
    pub fn from_unstamped_json(key: &str, json: &[u8], revision: Revision) -> Result<Self> {
        #[derive(Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            metadata: Option<&'a serde_json::value::RawValue>,
        }
        let corrupt = |e: &dyn fmt::Display| StorageError::Corrupt(format!("object {key:?}: {e}"));
        let top: Top<'_> = serde_json::from_slice(json).map_err(|e| corrupt(&e))?;
        let meta = top.metadata.map(|m| m.get()).filter(|m| m.starts_with('{') && !m.contains("\"resourceVersion\""));
        let Some(meta) = meta else {
            // No metadata to splice into, or a stale resourceVersion to replace: the slow way.
            let value = serde_json::from_slice(json).map_err(|e| corrupt(&e))?;
            return Self::new(key, value, revision);
        };
        let at = meta.as_ptr() as usize - json.as_ptr() as usize + 1;
        let empty = meta[1..].trim_start().starts_with('}');
        let field = format!("\"resourceVersion\":\"{revision}\"{}", if empty { "" } else { "," });
        let mut out = Vec::with_capacity(json.len() + field.len());
        out.extend_from_slice(&json[..at]);
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(&json[at..]);
        Self::from_json(key, Bytes::from(out), revision)
    }

    /// The object as a JSON tree, parsed for this caller.
    pub fn parse(&self) -> Result<Value> {
        serde_json::from_slice(&self.bytes).map_err(|e| StorageError::Corrupt(format!("object {:?}: {e}", self.key)))
    }

    /// The value `make` derives from this revision, made once; `None` if a different type was memoized first.
    pub fn memo<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.memo.0.get_or_init(|| Box::new(make())).downcast_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_is_indexed_the_same_from_a_tree_and_from_bytes() {
        let v = json!({"kind": "PodSet", "metadata": {"name": "a", "namespace": "ns", "uid": "u1",
                       "labels": {"tier": "b", "app": "web"}, "annotations": {"x": "y"}},
                       "spec": {"replicas": 2}});
        let obj = Object::new("/podsets/ns/a", v, 7).unwrap();
        let again = Object::from_json("/podsets/ns/a", obj.bytes.clone(), 7).unwrap();
        assert_eq!(obj.meta, again.meta);
        assert_eq!((&*obj.meta.namespace, &*obj.meta.name, &*obj.meta.uid), ("ns", "a", "u1"));
        assert_eq!(obj.meta.label("app"), Some("web"));
        assert_eq!(obj.meta.label("tier"), Some("b"));
        assert_eq!(obj.meta.label("x"), None);
        assert_eq!(obj.meta.labels().collect::<Vec<_>>(), [("app", "web"), ("tier", "b")]);
        assert_eq!(obj.parse().unwrap()["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn unstamped_json_gets_its_revision_spliced_in() {
        let stamped = |json: &str| {
            let o = Object::from_unstamped_json("k", json.as_bytes(), 42).unwrap();
            (o.parse().unwrap(), o.mod_revision)
        };
        let (v, rev) = stamped(r#"{"kind":"PodSet","metadata":{"name":"a","labels":{"x":"y"}},"spec":{}}"#);
        assert_eq!(rev, 42);
        assert_eq!(
            v,
            json!({"kind": "PodSet", "metadata": {"resourceVersion": "42", "name": "a", "labels": {"x": "y"}}, "spec": {}})
        );
        assert_eq!(stamped(r#"{"metadata":{}}"#).0, json!({"metadata": {"resourceVersion": "42"}}));
        assert_eq!(stamped(r#"{"metadata": { } }"#).0, json!({"metadata": {"resourceVersion": "42"}}));
        assert_eq!(stamped(r#"{"spec":1}"#).0, json!({"spec": 1, "metadata": {"resourceVersion": "42"}}));
        // A resourceVersion already there is replaced, not duplicated.
        let o = Object::from_unstamped_json("k", br#"{"metadata":{"resourceVersion":"7","name":"a"}}"#, 42).unwrap();
        assert_eq!(o.parse().unwrap(), json!({"metadata": {"resourceVersion": "42", "name": "a"}}));
        assert_eq!(&*o.meta.name, "a");
        assert!(matches!(Object::from_unstamped_json("k", b"{nope", 1), Err(StorageError::Corrupt(_))));
        assert!(Object::from_unstamped_json("k", br#"{"metadata":[1]}"#, 1).is_err());
    }

    #[test]
    fn a_memo_is_made_once_per_revision() {
        let obj = Object::new("k", json!({"metadata": {}}), 1).unwrap();
        let mut calls = 0;
        assert_eq!(
            obj.memo(|| {
                calls += 1;
                5u32
            }),
            Some(&5)
        );
        assert_eq!(
            obj.memo(|| {
                calls += 1;
                6u32
            }),
            Some(&5)
        );
        assert_eq!(calls, 1);
        assert_eq!(obj.memo(|| "other type"), None);
    }

    #[test]
    fn unreadable_bytes_are_corrupt_not_a_panic() {
        assert!(matches!(Object::from_json("k", Bytes::from_static(b"{nope"), 1), Err(StorageError::Corrupt(_))));
        assert!(matches!(
            Object::from_json("k", Bytes::from_static(br#"{"metadata": {"labels": {"a": 1}}}"#), 1),
            Err(StorageError::Corrupt(_))
        ));
    }
}
