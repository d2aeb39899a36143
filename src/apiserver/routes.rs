//! The installer's map from path to storage: which groups, versions and resources this server serves, built from
//! the resources' storages. The request-info filter resolves a path here once; the handler, discovery and the
//! metrics read what it resolved.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::api::resource::{ResourceInfo, VersionIndex};
use crate::api::Subresource;
use crate::registry::RestStorage;

/// One served resource.
pub struct Route {
    pub resource: &'static ResourceInfo,
    pub storage: Arc<dyn RestStorage>,
}

impl Route {
    /// Whether `sub` is served: `/status` and `/scale` only for a resource that has them.
    pub fn serves(&self, sub: Subresource) -> bool {
        match sub {
            Subresource::Main => true,
            Subresource::Status => self.resource.status,
            Subresource::Scale => self.storage.has_scale(),
        }
    }
}

/// A served group and its versions, highest priority first (the first is the preferred one).
pub struct Group {
    pub name: &'static str,
    pub versions: Vec<&'static str>,
}

/// Everything served, in the order the resources were given.
#[derive(Default)]
pub struct Routes {
    routes: Vec<Route>,
    groups: Vec<Group>,
}

/// A resolved resource path: which route, in which of its resource's versions.
#[derive(Debug, Clone, Copy)]
pub struct Resolved {
    pub route: usize,
    pub resource: &'static ResourceInfo,
    pub version: VersionIndex,
}

impl PartialEq for Resolved {
    fn eq(&self, other: &Self) -> bool {
        (self.route, self.version) == (other.route, other.version) && std::ptr::eq(self.resource, other.resource)
    }
}

impl Eq for Resolved {}

impl Routes {
    pub fn new(storages: Vec<Arc<dyn RestStorage>>) -> Self {
        let routes: Vec<Route> =
            storages.into_iter().map(|storage| Route { resource: storage.resource(), storage }).collect();
        let groups = groups_of(routes.iter().map(|r| r.resource));
        Self { routes, groups }
    }

    /// What discovery describes of each resource.
    pub fn described(&self) -> Vec<Described> {
        let describe = |r: &Route| Described {
            resource: r.resource,
            storage_version: r.storage.storage_version(),
            scale: r.storage.has_scale(),
        };
        self.routes.iter().map(describe).collect()
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub fn route(&self, index: usize) -> &Route {
        &self.routes[index]
    }

    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// The resource `plural` of `group` served in `version`.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Resolved> {
        let (route, r) =
            self.routes.iter().enumerate().find(|(_, r)| r.resource.plural == plural && r.resource.group == group)?;
        let i = r.resource.versions.iter().position(|v| v.name == version)?;
        Some(Resolved { route, resource: r.resource, version: VersionIndex(i as u8) })
    }
}

/// A served resource as discovery describes it.
#[derive(Debug, Clone, Copy)]
pub struct Described {
    pub resource: &'static ResourceInfo,
    pub storage_version: VersionIndex,
    pub scale: bool,
}

/// The groups of `resources`, in the order they first come, each with its resources' versions by priority.
pub fn groups_of(resources: impl Iterator<Item = &'static ResourceInfo>) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for r in resources {
        let at = match groups.iter().position(|g| g.name == r.group) {
            Some(i) => i,
            None => {
                groups.push(Group { name: r.group, versions: Vec::new() });
                groups.len() - 1
            }
        };
        let versions = &mut groups[at].versions;
        for v in r.versions {
            if !versions.contains(&v.name) {
                versions.push(v.name);
            }
        }
    }
    for g in &mut groups {
        g.versions.sort_by(|a, b| compare_versions(b, a));
    }
    groups
}

/// kube's `CompareKubeAwareVersionStrings`: `v2` > `v1` > `v1beta2` > `v1beta1` > `v1alpha1` > anything else,
/// which sorts alphabetically.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: u32 = rest[..digits].parse().ok()?;
        let (stage, minor) = match &rest[digits..] {
            "" => (2, 0),
            s => {
                let (stage, n) = if let Some(n) = s.strip_prefix("beta") {
                    (1, n)
                } else if let Some(n) = s.strip_prefix("alpha") {
                    (0, n)
                } else {
                    return None;
                };
                (stage, n.parse().ok().filter(|_| !n.is_empty())?)
            }
        };
        Some((major, stage, minor))
    }
    match (parse(a), parse(b)) {
        // GA first, then beta, then alpha; within one, the higher major, then the higher minor.
        (Some((ma, sa, na)), Some((mb, sb, nb))) => (sa, ma, na).cmp(&(sb, mb, nb)),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => b.cmp(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_as_kube_sorts_them() {
        let mut v = vec!["v1alpha1", "foo", "v1", "v2beta1", "v1beta2", "v1beta1", "v2", "v11alpha2", "bar"];
        v.sort_by(|a, b| compare_versions(b, a));
        assert_eq!(v, ["v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v11alpha2", "v1alpha1", "bar", "foo"]);
    }
}

/// Routes for the tests of the layers that only resolve paths: PodSets and the Widget test kind, over a storage
/// that answers nothing.
#[cfg(test)]
pub(crate) mod testing {
    use async_trait::async_trait;
    use k8s_openapi::api::autoscaling::v1::Scale;
    use serde_json::Value;

    use super::*;
    use crate::registry::{
        DeleteOptions, Deleted, Error, ListPage, ListRequest, ObjectKey, PatchType, Result, Revision, ScaleChange,
        Stored, Watch, WatchRequest, WriteOptions, Written,
    };

    struct Unstored(&'static ResourceInfo, bool);

    fn none<T>() -> Result<T> {
        Err(Error::internal("no storage in this test"))
    }

    #[async_trait]
    impl RestStorage for Unstored {
        fn resource(&self) -> &'static ResourceInfo {
            self.0
        }
        fn has_scale(&self) -> bool {
            self.1
        }
        fn storage_version(&self) -> VersionIndex {
            VersionIndex(0)
        }
        fn object_count(&self) -> usize {
            0
        }
        fn request_object(&self, _: Value, _: Subresource) -> Option<Value> {
            None
        }
        async fn migrate_storage(&self) -> Result<crate::registry::Migration> {
            none()
        }
        async fn get(&self, _: &ObjectKey, _: Option<Revision>) -> Result<Stored> {
            none()
        }
        async fn list(&self, _: ListRequest) -> Result<ListPage> {
            none()
        }
        async fn watch(&self, _: WatchRequest) -> Result<Watch> {
            none()
        }
        async fn create(&self, _: &str, _: Value, _: &WriteOptions) -> Result<Written> {
            none()
        }
        async fn create_json(&self, _: &str, _: &[u8], _: &WriteOptions) -> Result<Written> {
            none()
        }
        async fn replace(&self, _: &ObjectKey, _: Value, _: Subresource, _: &WriteOptions) -> Result<Written> {
            none()
        }
        async fn patch(
            &self,
            _: &ObjectKey,
            _: &[u8],
            _: PatchType,
            _: Subresource,
            _: &WriteOptions,
        ) -> Result<Written> {
            none()
        }
        async fn get_scale(&self, _: &ObjectKey, _: Option<Revision>) -> Result<Scale> {
            none()
        }
        async fn update_scale(&self, _: &ObjectKey, _: ScaleChange<'_>, _: &WriteOptions) -> Result<Scale> {
            none()
        }
        async fn delete(&self, _: &ObjectKey, _: &DeleteOptions, _: &WriteOptions) -> Result<Deleted> {
            none()
        }
        async fn delete_collection(
            &self,
            _: ListRequest,
            _: &DeleteOptions,
            _: &WriteOptions,
        ) -> Result<(Vec<Stored>, Revision)> {
            none()
        }
    }

    /// PodSets (with `/scale`) and widgets (without).
    pub(crate) fn routes() -> Routes {
        Routes::new(vec![
            Arc::new(Unstored(&crate::resources::podset::INFO, true)),
            Arc::new(Unstored(&crate::api::resource::WIDGETS, false)),
        ])
    }
}
