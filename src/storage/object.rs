//! One stored object as the cache keeps it: its JSON, serialized once per revision, and the few metadata fields
//! selectors and lookups read (as kube-apiserver's cacher keeps an object's labels and fields beside it). No parsed
//! tree stays alive: a reader that needs more parses the bytes for the one request.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::value::ValueError;
use super::{Result, Revision, StorageError};

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

/// An object on its way into storage, serialized by the writer's caller (so not on the store's one writer
/// thread): its JSON with an empty `metadata.resourceVersion` for the store to fill in, and what the cache indexes.
#[derive(Debug, Clone)]
pub struct Draft {
    json: Vec<u8>,
    /// Where the revision goes: between the quotes of `"resourceVersion":""`.
    revision_at: usize,
    /// What a store that keeps the revision beside the object (etcd) leaves out: that field with a comma beside it,
    /// or the whole `metadata` when the draft added it only to hold the field.
    unstamped_cut: Range<usize>,
    meta: ObjectMeta,
}

impl Draft {
    /// `value` as it will be stored. `raw_meta` are fields of `metadata` the caller serialized already (JSON
    /// text), in place of any of the same name; the bytes are those of `value` with them set, stamped, and
    /// serialized.
    pub fn new(value: &Value, raw_meta: &[(&str, &str)]) -> Result<Self> {
        let root = value.as_object().ok_or(StorageError::InvalidObject)?;
        let meta = match root.get("metadata") {
            None => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => return Err(StorageError::InvalidObject),
        };
        let mut extra: Vec<(&str, Option<&str>)> = raw_meta.iter().map(|(k, v)| (*k, Some(*v))).collect();
        extra.retain(|(k, _)| *k != "resourceVersion");
        extra.push(("resourceVersion", None));
        extra.sort_by_key(|(k, _)| *k);
        let mut w = JsonWriter { out: Vec::with_capacity(1024), revision_at: 0, revision_field: 0..0 };
        w.out.push(b'{');
        let mut first = true;
        // The `metadata` added when `value` has none: etcd's form leaves it out, unless raw fields came in it.
        let mut added_meta = None;
        for (k, v) in root {
            if meta.is_none() && added_meta.is_none() && k.as_str() > "metadata" {
                added_meta = Some(w.added_meta(&mut first, &extra)?);
            }
            w.key(&mut first, k)?;
            if k == "metadata" {
                w.meta(meta, &extra)?;
            } else {
                w.value(v)?;
            }
        }
        if meta.is_none() && added_meta.is_none() {
            added_meta = Some(w.added_meta(&mut first, &extra)?);
        }
        w.out.push(b'}');
        let JsonWriter { mut out, revision_at, revision_field } = w;
        out.shrink_to_fit();
        let mut cut = added_meta.filter(|_| extra.len() == 1).unwrap_or(revision_field);
        if out[cut.start] != b',' && out[cut.end] == b',' {
            cut.end += 1; // the first member: the comma after it goes instead
        }
        Ok(Self { json: out, revision_at, unstamped_cut: cut, meta: ObjectMeta::from_value(value) })
    }

    /// `header` followed by the JSON stamped with `revision`, in one exactly sized buffer (it is kept for the
    /// life of the revision: spare capacity would be a third of the cache's memory), and the indexed metadata.
    pub fn stamp(self, revision: Revision, header: &[u8]) -> (Vec<u8>, ObjectMeta) {
        let digits = revision.to_string();
        let (head, tail) = self.json.split_at(self.revision_at);
        let mut out = Vec::with_capacity(header.len() + self.json.len() + digits.len());
        out.extend_from_slice(header);
        out.extend_from_slice(head);
        out.extend_from_slice(digits.as_bytes());
        out.extend_from_slice(tail);
        (out, self.meta)
    }

    /// The JSON without `metadata.resourceVersion`, as a store that keeps the revision beside the object holds it
    /// (etcd): the bytes of `value` with the raw fields set, serialized (no `metadata` when `value` had none and
    /// no raw field came).
    pub fn into_unstamped(self) -> Vec<u8> {
        let mut json = self.json;
        json.drain(self.unstamped_cut);
        json
    }
}

/// Compact JSON as serde_json writes a `Value`, with fields of `metadata` spliced in.
struct JsonWriter {
    out: Vec<u8>,
    revision_at: usize,
    /// The member `"resourceVersion":""`, with the comma before it if any.
    revision_field: Range<usize>,
}

impl JsonWriter {
    fn key(&mut self, first: &mut bool, k: &str) -> Result<()> {
        if !std::mem::take(first) {
            self.out.push(b',');
        }
        self.value(k)?;
        self.out.push(b':');
        Ok(())
    }

    fn value<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<()> {
        serde_json::to_writer(&mut self.out, v).map_err(|e| StorageError::Backend(e.to_string()))
    }

    /// `metadata` with `extra` (sorted; `None` is the resourceVersion slot) in their places.
    fn meta(&mut self, meta: Option<&serde_json::Map<String, Value>>, extra: &[(&str, Option<&str>)]) -> Result<()> {
        self.out.push(b'{');
        let mut first = true;
        let mut pending = extra.iter().peekable();
        for (k, v) in meta.into_iter().flatten() {
            while let Some((name, raw)) = pending.next_if(|(name, _)| *name < k.as_str()) {
                self.extra(&mut first, name, *raw)?;
            }
            if extra.iter().any(|(name, _)| *name == k.as_str()) {
                continue;
            }
            self.key(&mut first, k)?;
            self.value(v)?;
        }
        for (name, raw) in pending {
            self.extra(&mut first, name, *raw)?;
        }
        self.out.push(b'}');
        Ok(())
    }

    /// A `metadata` of only `extra`, for a value without one; returns the member's bytes, with the comma before it
    /// if any.
    fn added_meta(&mut self, first: &mut bool, extra: &[(&str, Option<&str>)]) -> Result<Range<usize>> {
        let start = self.out.len();
        self.key(first, "metadata")?;
        self.meta(None, extra)?;
        Ok(start..self.out.len())
    }

    fn extra(&mut self, first: &mut bool, name: &str, raw: Option<&str>) -> Result<()> {
        let start = self.out.len();
        self.key(first, name)?;
        match raw {
            Some(json) => self.out.extend_from_slice(json.as_bytes()),
            None => {
                self.out.push(b'"');
                self.revision_at = self.out.len();
                self.out.push(b'"');
                self.revision_field = start..self.out.len();
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
pub struct Object {
    pub key: String,
    pub meta: ObjectMeta,
    /// The JSON, `metadata.resourceVersion` included.
    pub bytes: Bytes,
    pub mod_revision: Revision,
    /// The encryption provider that read the stored value (`None` when the store has no encryption configured).
    pub stored_with: Option<Arc<str>>,
    /// Why the stored value could not be read (no configured provider decrypts it); `bytes` are then empty. The
    /// cache keeps such an object so reads of it fail with the reason rather than skip it.
    pub unreadable: Option<Box<str>>,
    memo: Memo,
}

impl Object {
    /// Stamps `metadata.resourceVersion` with `revision` and serializes, once for the life of this state.
    pub fn new(key: &str, value: Value, revision: Revision) -> Result<Self> {
        Ok(Self::from_draft(key, Draft::new(&value, &[])?, revision))
    }

    /// The draft stamped with `revision`.
    pub fn from_draft(key: &str, draft: Draft, revision: Revision) -> Self {
        let (json, meta) = draft.stamp(revision, &[]);
        Self::from_parts(key, meta, Bytes::from(json), revision)
    }

    /// An object whose metadata the caller read already from `bytes`.
    pub fn from_parts(key: &str, meta: ObjectMeta, bytes: Bytes, mod_revision: Revision) -> Self {
        Self::assemble(key, meta, bytes, mod_revision)
    }

    fn assemble(key: &str, meta: ObjectMeta, bytes: Bytes, mod_revision: Revision) -> Self {
        let (stored_with, unreadable, memo) = (None, None, Memo::default());
        Self { key: key.to_owned(), meta, bytes, mod_revision, stored_with, unreadable, memo }
    }

    /// A stored value no provider could read, kept in place of the object (and named in the log: its reads fail
    /// with the reason).
    pub fn unreadable(key: &str, mod_revision: Revision, e: &ValueError) -> Self {
        tracing::warn!(key, revision = mod_revision, error = %e, "a stored value no configured encryption provider reads");
        Self::unreadable_because(key, mod_revision, e.to_string().into())
    }

    fn unreadable_because(key: &str, mod_revision: Revision, reason: Box<str>) -> Self {
        Self { unreadable: Some(reason), ..Self::assemble(key, ObjectMeta::default(), Bytes::new(), mod_revision) }
    }

    /// An unreadable object as it stood at `mod_revision` (its deletion, say), for the same reason.
    pub fn unreadable_at(&self, mod_revision: Revision) -> Option<Self> {
        self.unreadable.clone().map(|reason| Self::unreadable_because(&self.key, mod_revision, reason))
    }

    /// Records the provider that read the stored value.
    pub fn stored_with(mut self, provider: Option<Arc<str>>) -> Self {
        self.stored_with = provider;
        self
    }

    /// `Unreadable` if no provider could read the stored value.
    pub fn check_readable(&self) -> Result<()> {
        match &self.unreadable {
            None => Ok(()),
            Some(reason) => Err(StorageError::Unreadable { key: self.key.clone(), reason: reason.to_string() }),
        }
    }

    /// An object whose bytes are already `value` serialized.
    pub fn with_bytes(key: &str, value: &Value, bytes: Bytes, mod_revision: Revision) -> Self {
        Self::assemble(key, ObjectMeta::from_value(value), bytes, mod_revision)
    }

    /// An object from its stored JSON (which already carries its resourceVersion).
    pub fn from_json(key: &str, bytes: Bytes, mod_revision: Revision) -> Result<Self> {
        let meta = ObjectMeta::from_json(&bytes).map_err(|e| StorageError::Corrupt(format!("object {key:?}: {e}")))?;
        Ok(Self::assemble(key, meta, bytes, mod_revision))
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

    /// What a draft must store: the value with the raw fields set and the revision stamped, serialized.
    fn reference(value: &Value, raw_meta: &[(&str, &str)], revision: Revision) -> Vec<u8> {
        let mut v = value.clone();
        let meta = v.as_object_mut().unwrap().entry("metadata").or_insert_with(|| json!({}));
        for (k, raw) in raw_meta {
            meta[*k] = serde_json::from_str(raw).unwrap();
        }
        meta["resourceVersion"] = json!(revision.to_string());
        serde_json::to_vec(&v).unwrap()
    }

    /// What a draft must give a store that keeps the revision beside it (etcd): the value with the raw fields set
    /// and without a resourceVersion, serialized, as the etcd backend wrote values before drafts.
    fn reference_unstamped(value: &Value, raw_meta: &[(&str, &str)]) -> Vec<u8> {
        let mut v = value.clone();
        if !raw_meta.is_empty() {
            let meta = v.as_object_mut().unwrap().entry("metadata").or_insert_with(|| json!({}));
            for (k, raw) in raw_meta {
                meta[*k] = serde_json::from_str(raw).unwrap();
            }
        }
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            m.remove("resourceVersion");
        }
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_draft_stores_the_bytes_of_its_value_stamped() {
        let values = [
            json!({}),
            json!({"kind": "PodSet"}),
            json!({"zeta": 1, "apiVersion": "v1"}),
            json!({"metadata": {}}),
            json!({"a": [1, 2.5, -3, null, true], "metadata": {"name": "x", "resourceVersion": "old"}, "z": {"y": {}}}),
            json!({"metadata": {"annotations": {"q\"uote\\": "line\nbreak\u{1}", "ünï": "cödé"}, "zz": 1,
                                "managedFields": [{"manager": "old"}], "labels": {"a": "b"}, "uid": "u"},
                   "spec": {"n": 1e300, "s": "\u{7f}\u{2028}"}, "status": null}),
            json!({"metadata": {"resourceVersionX": 1, "resourceVersio": 2, "managedFieldsZ": 3}}),
            json!({"metadata": {"resourceVersion": "old"}}),
            json!({"spec": 1}),
            json!({"metadata": {"name": "a"}, "spec": 1}),
        ];
        let raws: [&[(&str, &str)]; 4] = [
            &[],
            &[("managedFields", r#"[{"fieldsV1":{"f:spec":{"f:n":{}}},"manager":"m"}]"#)],
            &[("a", "1"), ("zzz", r#""z""#), ("managedFields", "[]")],
            &[("resourceVersion", r#""ignored""#)],
        ];
        for v in &values {
            for raw in raws {
                for revision in [1, 42, u64::MAX] {
                    let obj = Object::from_draft("k", Draft::new(v, raw).unwrap(), revision);
                    let want = reference(
                        v,
                        raw.iter().filter(|(k, _)| *k != "resourceVersion").cloned().collect::<Vec<_>>().as_slice(),
                        revision,
                    );
                    assert_eq!(String::from_utf8_lossy(&obj.bytes), String::from_utf8_lossy(&want), "{v} with {raw:?}");
                    assert_eq!(obj.meta, ObjectMeta::from_value(v));
                    assert_eq!(obj.mod_revision, revision);
                    assert_eq!(obj.bytes.len(), want.len());
                }
                let raw_kept = raw.iter().filter(|(k, _)| *k != "resourceVersion").cloned().collect::<Vec<_>>();
                let unstamped = Draft::new(v, raw).unwrap().into_unstamped();
                let want = reference_unstamped(v, &raw_kept);
                assert_eq!(String::from_utf8_lossy(&unstamped), String::from_utf8_lossy(&want), "{v} with {raw:?}");
            }
        }
        assert!(matches!(Draft::new(&json!([1]), &[]), Err(StorageError::InvalidObject)));
        assert!(matches!(Draft::new(&json!({"metadata": "x"}), &[]), Err(StorageError::InvalidObject)));
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
