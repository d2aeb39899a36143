//! Discovery documents (`/apis`, the group, the group-version, aggregated discovery v2), OpenAPI and `/version`,
//! all built once at start with their ETags.

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, GroupVersionForDiscovery,
};
use kube::core::discovery::v2::{
    APIGroupDiscovery, APIGroupDiscoveryList, APIResourceDiscovery, APISubresourceDiscovery, APIVersionDiscovery,
    GroupVersionKind,
};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use std::collections::HashMap;

use super::routes::{groups_of, Described, Group};
use crate::api::openapi::{document_v2, document_v3, Published};
use crate::api::resource::{ResourceInfo, Scope, VersionIndex};

/// A precomputed response body with its strong ETag.
#[derive(Clone)]
pub struct Doc {
    pub body: Bytes,
    pub etag: String,
}

impl Doc {
    fn new(value: &impl Serialize) -> Self {
        let body = Bytes::from(serde_json::to_vec(value).expect("discovery documents serialize"));
        let etag = format!("\"{}\"", hex(&Sha256::digest(&body)[..16]));
        Self { body, etag }
    }

    /// The hash used in `/openapi/v3` URLs.
    pub fn hash(&self) -> &str {
        self.etag.trim_matches('"')
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

pub struct Discovery {
    pub group_list: Doc,
    /// Each group's `APIGroup`, by name.
    groups: HashMap<&'static str, Doc>,
    /// Each group version's `APIResourceList`.
    resource_lists: Vec<((&'static str, &'static str), Doc)>,
    pub aggregated_v2: Doc,
    pub aggregated_v2beta1: Doc,
    pub openapi_v2: Doc,
    /// Each group version's OpenAPI v3 document.
    openapi_v3: Vec<((&'static str, &'static str), Doc)>,
    pub openapi_v3_root: Doc,
    pub version: Doc,
}

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const SUB_VERBS: &[&str] = &["get", "patch", "update"];

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|v| v.to_string()).collect()
}

/// A list kube leaves out when it is empty.
fn listed(s: &[&str]) -> Option<Vec<String>> {
    (!s.is_empty()).then(|| strings(s))
}

fn group_version(group: &str, version: &str) -> GroupVersionForDiscovery {
    GroupVersionForDiscovery { group_version: format!("{group}/{version}"), version: version.into() }
}

/// A group with its versions in the order discovery lists them: the preferred (highest priority) first.
fn api_group(g: &Group) -> APIGroup {
    APIGroup {
        name: g.name.into(),
        versions: g.versions.iter().map(|v| group_version(g.name, v)).collect(),
        preferred_version: g.versions.first().map(|v| group_version(g.name, v)),
        server_address_by_client_cidrs: None,
    }
}

/// `storageVersionHash` as k8s.io/apiserver computes it (`discovery.StorageVersionHash`): base64 of the first 8 bytes
/// of SHA-256 of `<group>/<version>/<kind>` of the storage version. Storage migrators compare it over time to know
/// when objects must be rewritten.
pub fn storage_version_hash(resource: &ResourceInfo, storage: VersionIndex) -> String {
    use base64::Engine;
    let gvk = format!("{}/{}/{}", resource.group, resource.version(storage).name, resource.kind);
    base64::engine::general_purpose::STANDARD.encode(&Sha256::digest(gvk.as_bytes())[..8])
}

fn scope(r: &ResourceInfo) -> &'static str {
    match r.scope {
        Scope::Namespaced => "Namespaced",
        Scope::Cluster => "Cluster",
    }
}

/// The resources of `group` served in `version`.
fn in_version<'a>(described: &'a [Described], group: &'a str, version: &'a str) -> impl Iterator<Item = &'a Described> {
    described.iter().filter(move |d| d.resource.group == group && d.resource.versions.iter().any(|v| v.name == version))
}

fn resource_list(described: &[Described], group: &str, version: &str) -> APIResourceList {
    let mut resources = Vec::new();
    for d in in_version(described, group, version) {
        let r = d.resource;
        let sub = |name: &str, group: Option<&str>, version: Option<&str>, kind: &str| APIResource {
            name: format!("{}/{name}", r.plural),
            singular_name: String::new(),
            namespaced: r.namespaced(),
            group: group.map(Into::into),
            version: version.map(Into::into),
            kind: kind.into(),
            verbs: strings(SUB_VERBS),
            ..Default::default()
        };
        resources.push(APIResource {
            name: r.plural.into(),
            singular_name: r.singular.into(),
            namespaced: r.namespaced(),
            kind: r.kind.into(),
            verbs: strings(VERBS),
            short_names: listed(r.short_names),
            categories: listed(r.categories),
            // On the resource only: subresources have none, as in kube-apiserver.
            storage_version_hash: Some(storage_version_hash(r, d.storage_version)),
            ..Default::default()
        });
        if r.status {
            resources.push(sub("status", None, None, r.kind));
        }
        if d.scale {
            resources.push(sub("scale", Some("autoscaling"), Some("v1"), "Scale"));
        }
    }
    APIResourceList { group_version: format!("{group}/{version}"), resources }
}

fn gvk(group: &str, version: &str, kind: &str) -> Option<GroupVersionKind> {
    Some(GroupVersionKind { group: Some(group.into()), version: Some(version.into()), kind: Some(kind.into()) })
}

/// `APIGroupDiscoveryList` with its type fields (kube-core's struct leaves them to the caller).
#[derive(Serialize)]
struct Typed<'a, T> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: String,
    #[serde(flatten)]
    inner: &'a T,
}

fn aggregated(described: &[Described], groups: &[Group], version: &str) -> Doc {
    let sub = |name: &str, kind: Option<GroupVersionKind>| APISubresourceDiscovery {
        subresource: Some(name.into()),
        response_kind: kind,
        accepted_types: Vec::new(),
        verbs: strings(SUB_VERBS),
    };
    let resource = |d: &Described, v: &str| {
        let r = d.resource;
        let mut subresources = Vec::new();
        if r.status {
            subresources.push(sub("status", gvk(r.group, v, r.kind)));
        }
        if d.scale {
            subresources.push(sub("scale", gvk("autoscaling", "v1", "Scale")));
        }
        APIResourceDiscovery {
            resource: Some(r.plural.into()),
            response_kind: gvk(r.group, v, r.kind),
            scope: Some(scope(r).into()),
            singular_resource: Some(r.singular.into()),
            verbs: strings(VERBS),
            short_names: strings(r.short_names),
            categories: strings(r.categories),
            subresources,
        }
    };
    let list = APIGroupDiscoveryList {
        metadata: None,
        items: groups
            .iter()
            .map(|g| APIGroupDiscovery {
                metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(g.name.into()),
                    ..Default::default()
                }),
                versions: g
                    .versions
                    .iter()
                    .map(|v| APIVersionDiscovery {
                        version: Some(v.to_string()),
                        resources: in_version(described, g.name, v).map(|d| resource(d, v)).collect(),
                        freshness: Some("Current".into()),
                    })
                    .collect(),
            })
            .collect(),
    };
    Doc::new(&Typed {
        kind: "APIGroupDiscoveryList",
        api_version: format!("apidiscovery.k8s.io/{version}"),
        inner: &list,
    })
}

impl Discovery {
    /// The documents of a server that serves `described`.
    pub fn build(described: &[Described]) -> Self {
        let groups = groups_of(described.iter().map(|d| d.resource));
        let published: Vec<Published> =
            described.iter().map(|d| Published { resource: d.resource, scale: d.scale }).collect();
        let (mut openapi_v3, mut resource_lists) = (Vec::new(), Vec::new());
        let mut paths = serde_json::Map::new();
        for g in &groups {
            for v in &g.versions {
                let doc = Doc::new(&document_v3(&published, g.name, v));
                let url = format!("/openapi/v3/apis/{}/{v}?hash={}", g.name, doc.hash());
                paths.insert(format!("apis/{}/{v}", g.name), json!({"serverRelativeURL": url}));
                openapi_v3.push(((g.name, *v), doc));
                resource_lists.push(((g.name, *v), Doc::new(&resource_list(described, g.name, v))));
            }
        }
        let root = json!({ "paths": paths });
        let preferred = groups.first().and_then(|g| g.versions.first()).copied().unwrap_or_default();
        Self {
            group_list: Doc::new(&APIGroupList { groups: groups.iter().map(api_group).collect() }),
            groups: groups.iter().map(|g| (g.name, Doc::new(&api_group(g)))).collect(),
            resource_lists,
            aggregated_v2: aggregated(described, &groups, "v2"),
            aggregated_v2beta1: aggregated(described, &groups, "v2beta1"),
            openapi_v2: Doc::new(&document_v2(&published, preferred)),
            openapi_v3_root: Doc::new(&root),
            openapi_v3,
            version: Doc::new(&crate::version::info()),
        }
    }

    /// `/apis/<group>` of a served group.
    pub fn group(&self, group: &str) -> Option<&Doc> {
        self.groups.get(group)
    }

    /// `/apis/<group>/<version>` of a served group version.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<&Doc> {
        find(&self.resource_lists, group, version)
    }

    /// `/openapi/v3/apis/<group>/<version>`, when the group version publishes one.
    pub fn openapi_v3(&self, group: &str, version: &str) -> Option<&Doc> {
        find(&self.openapi_v3, group, version)
    }
}

fn find<'a>(docs: &'a [((&str, &str), Doc)], group: &str, version: &str) -> Option<&'a Doc> {
    docs.iter().find(|((g, v), _)| *g == group && *v == version).map(|(_, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Version, GROUP};
    use crate::resources::podset::INFO;

    fn build(storage: Version) -> Discovery {
        Discovery::build(&[Described { resource: &INFO, storage_version: storage.into(), scale: true }])
    }

    fn list(d: &Discovery, v: Version) -> &Doc {
        d.resource_list(GROUP, v.as_str()).unwrap()
    }

    #[test]
    fn documents_carry_type_fields_and_response_kinds() {
        let d = build(Version::V1alpha1);
        let v: serde_json::Value = serde_json::from_slice(&list(&d, Version::V1beta1).body).unwrap();
        assert_eq!(v["groupVersion"], "demo.k8s.io/v1beta1");
        assert_eq!(v["kind"], "APIResourceList");
        assert_eq!(v["resources"][0]["shortNames"][0], "ps");
        assert_eq!(v["resources"][2]["name"], "podsets/scale");
        assert_eq!(v["resources"][2]["group"], "autoscaling");
        let v: serde_json::Value = serde_json::from_slice(&d.aggregated_v2.body).unwrap();
        assert_eq!(v["kind"], "APIGroupDiscoveryList");
        assert_eq!(v["apiVersion"], "apidiscovery.k8s.io/v2");
        let versions: Vec<&str> =
            v["items"][0]["versions"].as_array().unwrap().iter().map(|v| v["version"].as_str().unwrap()).collect();
        assert_eq!(versions, ["v1beta1", "v1alpha1"], "the preferred version first");
        let res = &v["items"][0]["versions"][0]["resources"][0];
        assert_eq!(res["responseKind"]["kind"], "PodSet");
        for sub in res["subresources"].as_array().unwrap() {
            assert!(sub["responseKind"]["kind"].is_string(), "{sub}");
        }
        let v: serde_json::Value = serde_json::from_slice(&d.group_list.body).unwrap();
        assert_eq!(v["kind"], "APIGroupList");
        assert_eq!(v["groups"][0]["preferredVersion"]["groupVersion"], "demo.k8s.io/v1beta1");
        assert_eq!(v["groups"][0]["versions"][1]["groupVersion"], "demo.k8s.io/v1alpha1");
    }

    /// Values from k8s.io/apiserver's `discovery.StorageVersionHash` on the same group, version and kind (Go:
    /// `base64.StdEncoding.EncodeToString(sha256.Sum256([]byte("demo.k8s.io/v1alpha1/PodSet"))[:8])`), worked out
    /// independently with Python's hashlib.
    #[test]
    fn storage_version_hash_is_k8s_apiservers_on_the_resource_in_every_version() {
        assert_eq!(storage_version_hash(&INFO, Version::V1alpha1.into()), "Yd5hXh3MgaM=");
        assert_eq!(storage_version_hash(&INFO, Version::V1beta1.into()), "jnZbWqzqWzc=");
        for storage in Version::ALL {
            let d = build(storage);
            for v in Version::ALL {
                let list: serde_json::Value = serde_json::from_slice(&list(&d, v).body).unwrap();
                let hashes: Vec<_> =
                    list["resources"].as_array().unwrap().iter().map(|r| &r["storageVersionHash"]).collect();
                assert_eq!(
                    hashes[0],
                    &serde_json::json!(storage_version_hash(&INFO, storage.into())),
                    "{v} on {storage}"
                );
                assert!(hashes[1..].iter().all(|h| h.is_null()), "subresources carry none: {hashes:?}");
            }
        }
    }

    /// Every document as served, byte for byte (the version document aside: it names the build).
    #[test]
    fn documents_equal_their_snapshots() {
        for storage in Version::ALL {
            let d = build(storage);
            let name = |doc: &str| format!("discovery/{storage}-storage/{doc}.json");
            super::super::golden::check(&name("group-list"), &d.group_list.body);
            super::super::golden::check(&name("group"), &d.group(GROUP).unwrap().body);
            for v in Version::ALL {
                super::super::golden::check(&name(&format!("resources-{v}")), &list(&d, v).body);
            }
            super::super::golden::check(&name("aggregated-v2"), &d.aggregated_v2.body);
            super::super::golden::check(&name("aggregated-v2beta1"), &d.aggregated_v2beta1.body);
        }
        let d = build(Version::STORAGE);
        super::super::golden::check("openapi/v2.json", &d.openapi_v2.body);
        for v in Version::ALL {
            super::super::golden::check(
                &format!("openapi/v3-{v}.json"),
                &d.openapi_v3(GROUP, v.as_str()).unwrap().body,
            );
        }
        super::super::golden::check("openapi/v3-root.json", &d.openapi_v3_root.body);
    }

    /// A cluster-scoped group beside demo.k8s.io: listed after it, its resource Cluster-scoped with `/status` and
    /// no `/scale`, no shortNames or categories, PodSets' documents unchanged.
    #[test]
    fn a_second_group_is_listed_with_its_own_scope_and_subresources() {
        use crate::api::resource::WIDGETS;
        let podsets = Described { resource: &INFO, storage_version: Version::V1alpha1.into(), scale: true };
        let widgets = Described { resource: &WIDGETS, storage_version: VersionIndex(0), scale: false };
        let d = Discovery::build(&[podsets, widgets]);
        let groups: serde_json::Value = serde_json::from_slice(&d.group_list.body).unwrap();
        let names: Vec<_> = groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["demo.k8s.io", "test.podset.example"]);
        assert_eq!(groups["groups"][1]["preferredVersion"]["groupVersion"], "test.podset.example/v1");
        let list: serde_json::Value =
            serde_json::from_slice(&d.resource_list("test.podset.example", "v1").unwrap().body).unwrap();
        let r = &list["resources"];
        assert_eq!((r[0]["name"].as_str(), r[0]["namespaced"].as_bool()), (Some("widgets"), Some(false)));
        assert_eq!(r[0]["storageVersionHash"], storage_version_hash(&WIDGETS, VersionIndex(0)));
        assert!(r[0].get("shortNames").is_none() && r[0].get("categories").is_none(), "{list}");
        assert_eq!(r[1]["name"], "widgets/status");
        assert_eq!(r.as_array().unwrap().len(), 2, "no /scale");
        assert!(d.resource_list("test.podset.example", "v1beta1").is_none());
        let v2: serde_json::Value = serde_json::from_slice(&d.aggregated_v2.body).unwrap();
        let w = &v2["items"][1]["versions"][0]["resources"][0];
        assert_eq!((w["resource"].as_str(), w["scope"].as_str()), (Some("widgets"), Some("Cluster")));
        assert_eq!(w["subresources"].as_array().unwrap().len(), 1);
        let v3: serde_json::Value =
            serde_json::from_slice(&d.openapi_v3("test.podset.example", "v1").unwrap().body).unwrap();
        let paths: Vec<&String> = v3["paths"].as_object().unwrap().keys().collect();
        assert!(paths.contains(&&"/apis/test.podset.example/v1/widgets/{name}/status".to_owned()), "{paths:?}");
        assert!(paths.iter().all(|p| p.starts_with("/apis/test.podset.example/v1/") && !p.contains("namespaces")));
        let root: serde_json::Value = serde_json::from_slice(&d.openapi_v3_root.body).unwrap();
        assert!(root["paths"]["apis/test.podset.example/v1"]["serverRelativeURL"].is_string(), "{root}");
        let v2: serde_json::Value = serde_json::from_slice(&d.openapi_v2.body).unwrap();
        assert!(v2["paths"]["/apis/test.podset.example/v1/widgets"]["get"].is_object());
        let alone = build(Version::V1alpha1);
        assert_eq!(d.openapi_v3(GROUP, "v1beta1").unwrap().body, alone.openapi_v3(GROUP, "v1beta1").unwrap().body);
        assert_eq!(
            d.resource_list(GROUP, "v1beta1").unwrap().body,
            alone.resource_list(GROUP, "v1beta1").unwrap().body
        );
    }
}
