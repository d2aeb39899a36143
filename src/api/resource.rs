//! What the registry and the layers above it need to know of a resource to serve it: its names, its scope and where
//! its objects live in storage (sample-apiserver's `APIGroupInfo` and a storage's `NamespaceScoped`).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// A resource's names and place in storage. Each resource has one, a `static`.
#[derive(Debug)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub scope: Scope,
    /// Where the resource's objects live in its group's storage, `/<plural>/`: `/<plural>/<namespace>/<name>`, or
    /// `/<plural>/<name>` when cluster-scoped, as kube-apiserver keys them under the group's prefix.
    pub key_root: &'static str,
}

impl ResourceInfo {
    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }
}

/// `<plural>.<group>`, as errors and `EncryptionConfiguration` name the resource.
impl fmt::Display for ResourceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group {
            "" => f.write_str(self.plural),
            group => write!(f, "{}.{group}", self.plural),
        }
    }
}

/// A cluster-scoped kind for tests of what every resource gets: `widgets.test.podset.example`.
#[cfg(test)]
pub(crate) static WIDGETS: ResourceInfo = ResourceInfo {
    group: "test.podset.example",
    kind: "Widget",
    list_kind: "WidgetList",
    plural: "widgets",
    singular: "widget",
    short_names: &[],
    categories: &[],
    scope: Scope::Cluster,
    key_root: "/widgets/",
};
