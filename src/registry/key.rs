//! Which object: a typed namespace/name pair instead of `"ns/name"` strings (kube-runtime's `ObjectRef`), and the
//! one place that knows how objects are keyed in storage.

use std::fmt;

use crate::api::resource::ResourceInfo;

/// An object's identity within its resource; `namespace` is empty for a cluster-scoped one. Displays as
/// `namespace/name` (or `name`), as kubectl and logs show it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// Where the object lives in storage: `<key_root><namespace>/<name>`, or `<key_root><name>`.
    pub(crate) fn storage_key(&self, resource: &ResourceInfo) -> String {
        match self.namespace.as_str() {
            "" => format!("{}{}", resource.key_root, self.name),
            ns => format!("{}{ns}/{}", resource.key_root, self.name),
        }
    }

    /// The storage prefix of one namespace's objects, or of all the resource's.
    pub(crate) fn prefix(resource: &ResourceInfo, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{}{ns}/", resource.key_root),
            None => resource.key_root.to_owned(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.namespace.as_str() {
            "" => f.write_str(&self.name),
            ns => write!(f, "{ns}/{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resource::WIDGETS;

    #[test]
    fn keys_prefixes_and_display() {
        let podsets = &crate::resources::podset::INFO;
        let k = ObjectKey::new("ns", "web");
        assert_eq!(k.to_string(), "ns/web");
        assert_eq!(k.storage_key(podsets), "/podsets/ns/web");
        assert!(k.storage_key(podsets).starts_with(&ObjectKey::prefix(podsets, Some("ns"))));
        assert!(!k.storage_key(podsets).starts_with(&ObjectKey::prefix(podsets, Some("n"))), "a prefix ends with '/'");
        assert!(k.storage_key(podsets).starts_with(&ObjectKey::prefix(podsets, None)));
        let w = ObjectKey::new("", "blue");
        assert_eq!((w.to_string(), w.storage_key(&WIDGETS)), ("blue".into(), "/widgets/blue".into()));
        assert_eq!(
            (podsets.to_string(), WIDGETS.to_string()),
            ("podsets.demo.k8s.io".into(), "widgets.test.podset.example".into())
        );
    }
}
