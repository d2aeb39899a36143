//! Which PodSet: a typed namespace/name pair instead of `"ns/name"` strings (kube-runtime's `ObjectRef`), and the
//! one place that knows how PodSets are keyed in storage.

use std::fmt;

const STORAGE_ROOT: &str = "/podsets/";

/// The resource the registry stores, as a storage configuration names it (`--encryption-provider-config`'s
/// `podsets.demo.k8s.io`).
#[derive(Debug, Clone, Copy)]
pub struct StoredResource {
    pub resource: &'static str,
    pub group: &'static str,
}

pub const STORED: StoredResource = StoredResource { resource: crate::api::PLURAL, group: crate::api::GROUP };

impl fmt::Display for StoredResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.resource, self.group)
    }
}

/// A PodSet's identity. Displays as `namespace/name`, as kubectl and logs show it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodSetKey {
    pub namespace: String,
    pub name: String,
}

impl PodSetKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// Where the object lives in storage: `/podsets/<namespace>/<name>`.
    pub(crate) fn storage_key(&self) -> String {
        format!("{STORAGE_ROOT}{}/{}", self.namespace, self.name)
    }

    /// The storage prefix of one namespace, or of all PodSets.
    pub(crate) fn prefix(namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{STORAGE_ROOT}{ns}/"),
            None => STORAGE_ROOT.to_owned(),
        }
    }
}

impl fmt::Display for PodSetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_prefixes_and_display() {
        let k = PodSetKey::new("ns", "web");
        assert_eq!(k.to_string(), "ns/web");
        assert_eq!(k.storage_key(), "/podsets/ns/web");
        assert!(k.storage_key().starts_with(&PodSetKey::prefix(Some("ns"))));
        assert!(!k.storage_key().starts_with(&PodSetKey::prefix(Some("n"))), "a namespace prefix ends with '/'");
        assert!(k.storage_key().starts_with(&PodSetKey::prefix(None)));
    }
}
