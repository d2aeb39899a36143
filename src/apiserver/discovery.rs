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

use crate::api::schema::{openapi_v2, openapi_v3};
use crate::api::{Version, CATEGORIES, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR};

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
    pub group: Doc,
    /// Each version's `APIResourceList`, by [`Version::index`].
    pub resource_lists: Vec<Doc>,
    pub aggregated_v2: Doc,
    pub aggregated_v2beta1: Doc,
    pub openapi_v2: Doc,
    /// Each version's OpenAPI v3 document, by [`Version::index`].
    pub openapi_v3: Vec<Doc>,
    pub openapi_v3_root: Doc,
    pub version: Doc,
}

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const SUB_VERBS: &[&str] = &["get", "patch", "update"];

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|v| v.to_string()).collect()
}

fn group_version(v: Version) -> GroupVersionForDiscovery {
    GroupVersionForDiscovery { group_version: v.api_version().into(), version: v.as_str().into() }
}

/// The versions in the order discovery lists them: the preferred first, then newest to oldest, as kube-apiserver
/// orders a group's versions.
fn by_priority() -> Vec<Version> {
    let mut versions: Vec<Version> = Version::ALL.iter().rev().copied().collect();
    versions.sort_by_key(|v| *v != Version::PREFERRED);
    versions
}

fn api_group() -> APIGroup {
    APIGroup {
        name: GROUP.into(),
        versions: by_priority().into_iter().map(group_version).collect(),
        preferred_version: Some(group_version(Version::PREFERRED)),
        server_address_by_client_cidrs: None,
    }
}

/// `storageVersionHash` as k8s.io/apiserver computes it (`discovery.StorageVersionHash`): base64 of the first 8 bytes
/// of SHA-256 of `<group>/<version>/<kind>` of the storage version. Storage migrators compare it over time to know
/// when objects must be rewritten.
pub fn storage_version_hash(storage: Version) -> String {
    use base64::Engine;
    let gvk = format!("{GROUP}/{}/{KIND}", storage.as_str());
    base64::engine::general_purpose::STANDARD.encode(&Sha256::digest(gvk.as_bytes())[..8])
}

fn resource_list(version: Version, storage: Version) -> APIResourceList {
    let sub = |name: &str, group: Option<&str>, version: Option<&str>, kind: &str| APIResource {
        name: name.into(),
        singular_name: String::new(),
        namespaced: true,
        group: group.map(Into::into),
        version: version.map(Into::into),
        kind: kind.into(),
        verbs: strings(SUB_VERBS),
        ..Default::default()
    };
    APIResourceList {
        group_version: version.api_version().into(),
        resources: vec![
            APIResource {
                name: PLURAL.into(),
                singular_name: SINGULAR.into(),
                namespaced: true,
                kind: KIND.into(),
                verbs: strings(VERBS),
                short_names: Some(strings(SHORT_NAMES)),
                categories: Some(strings(CATEGORIES)),
                // On the resource only: subresources have none, as in kube-apiserver.
                storage_version_hash: Some(storage_version_hash(storage)),
                ..Default::default()
            },
            sub(&format!("{PLURAL}/status"), None, None, KIND),
            sub(&format!("{PLURAL}/scale"), Some("autoscaling"), Some("v1"), "Scale"),
        ],
    }
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

fn aggregated(version: &str) -> Doc {
    let sub = |name: &str, kind: Option<GroupVersionKind>| APISubresourceDiscovery {
        subresource: Some(name.into()),
        response_kind: kind,
        accepted_types: Vec::new(),
        verbs: strings(SUB_VERBS),
    };
    let list = APIGroupDiscoveryList {
        metadata: None,
        items: vec![APIGroupDiscovery {
            metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(GROUP.into()),
                ..Default::default()
            }),
            versions: by_priority()
                .into_iter()
                .map(|v| APIVersionDiscovery {
                    version: Some(v.as_str().into()),
                    resources: vec![APIResourceDiscovery {
                        resource: Some(PLURAL.into()),
                        response_kind: gvk(GROUP, v.as_str(), KIND),
                        scope: Some("Namespaced".into()),
                        singular_resource: Some(SINGULAR.into()),
                        verbs: strings(VERBS),
                        short_names: strings(SHORT_NAMES),
                        categories: strings(CATEGORIES),
                        subresources: vec![
                            sub("status", gvk(GROUP, v.as_str(), KIND)),
                            sub("scale", gvk("autoscaling", "v1", "Scale")),
                        ],
                    }],
                    freshness: Some("Current".into()),
                })
                .collect(),
        }],
    };
    Doc::new(&Typed {
        kind: "APIGroupDiscoveryList",
        api_version: format!("apidiscovery.k8s.io/{version}"),
        inner: &list,
    })
}

impl Discovery {
    /// The documents of a server that stores PodSets in `storage`.
    pub fn build(storage: Version) -> Self {
        let openapi_v3: Vec<Doc> = Version::ALL.iter().map(|v| Doc::new(&openapi_v3(*v))).collect();
        let paths: serde_json::Map<String, serde_json::Value> = Version::ALL
            .iter()
            .map(|v| {
                let url = format!("/openapi/v3/apis/{GROUP}/{v}?hash={}", openapi_v3[v.index()].hash());
                (format!("apis/{GROUP}/{v}"), json!({"serverRelativeURL": url}))
            })
            .collect();
        let root = json!({ "paths": paths });
        Self {
            group_list: Doc::new(&APIGroupList { groups: vec![api_group()] }),
            group: Doc::new(&api_group()),
            resource_lists: Version::ALL.iter().map(|v| Doc::new(&resource_list(*v, storage))).collect(),
            aggregated_v2: aggregated("v2"),
            aggregated_v2beta1: aggregated("v2beta1"),
            openapi_v2: Doc::new(&openapi_v2()),
            openapi_v3_root: Doc::new(&root),
            openapi_v3,
            version: Doc::new(&crate::version::info()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_carry_type_fields_and_response_kinds() {
        let d = Discovery::build(Version::V1alpha1);
        let v: serde_json::Value = serde_json::from_slice(&d.resource_lists[Version::V1beta1.index()].body).unwrap();
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
        assert_eq!(storage_version_hash(Version::V1alpha1), "Yd5hXh3MgaM=");
        assert_eq!(storage_version_hash(Version::V1beta1), "jnZbWqzqWzc=");
        for storage in Version::ALL {
            let d = Discovery::build(storage);
            for v in Version::ALL {
                let list: serde_json::Value = serde_json::from_slice(&d.resource_lists[v.index()].body).unwrap();
                let hashes: Vec<_> =
                    list["resources"].as_array().unwrap().iter().map(|r| &r["storageVersionHash"]).collect();
                assert_eq!(hashes[0], &serde_json::json!(storage_version_hash(storage)), "{v} on {storage}");
                assert!(hashes[1..].iter().all(|h| h.is_null()), "subresources carry none: {hashes:?}");
            }
        }
    }

    /// Every document as served, byte for byte (the version document aside: it names the build).
    #[test]
    fn documents_equal_their_snapshots() {
        for storage in Version::ALL {
            let d = Discovery::build(storage);
            let name = |doc: &str| format!("discovery/{storage}-storage/{doc}.json");
            super::super::golden::check(&name("group-list"), &d.group_list.body);
            super::super::golden::check(&name("group"), &d.group.body);
            for v in Version::ALL {
                super::super::golden::check(&name(&format!("resources-{v}")), &d.resource_lists[v.index()].body);
            }
            super::super::golden::check(&name("aggregated-v2"), &d.aggregated_v2.body);
            super::super::golden::check(&name("aggregated-v2beta1"), &d.aggregated_v2beta1.body);
        }
        let d = Discovery::build(Version::STORAGE);
        super::super::golden::check("openapi/v2.json", &d.openapi_v2.body);
        for v in Version::ALL {
            super::super::golden::check(&format!("openapi/v3-{v}.json"), &d.openapi_v3[v.index()].body);
        }
        super::super::golden::check("openapi/v3-root.json", &d.openapi_v3_root.body);
    }
}
