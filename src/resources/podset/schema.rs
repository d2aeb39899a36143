//! PodSet's part of the OpenAPI documents (v2 and v3): its definitions, built from the Rust types; the paths and
//! the documents are every resource's ([`crate::api::openapi`]).

use serde_json::{json, Map, Value};

use super::{PodSet, PodSetList, Version, GROUP};
use crate::api::openapi::{definitions_of, Flavor, ListType};
use crate::api::resource::{ServedVersion, VersionIndex};

/// The documents are built for `v1alpha1` from the types (the hub), then retargeted per version ([`retarget`]).
const VERSION: &str = "v1alpha1";

/// The name of the PodSet definition in `version`'s OpenAPI documents.
pub fn podset_definition(version: Version) -> String {
    format!("io.k8s.demo.{version}.PodSet")
}

/// Paths or definitions built for `v1alpha1` from the hub types, as `version` publishes them: its names, paths and
/// operation ids, and only its fields (`v1alpha1` has no `spec.minReadySeconds`).
fn retarget(doc: Map<String, Value>, version: Version) -> Map<String, Value> {
    let mut doc = match version {
        Version::V1alpha1 => doc,
        v => {
            let text = Value::Object(doc)
                .to_string()
                .replace("io.k8s.demo.v1alpha1.", &format!("io.k8s.demo.{v}."))
                .replace(&format!("/apis/{GROUP}/v1alpha1"), &format!("/apis/{GROUP}/{v}"))
                .replace("DemoV1alpha1", &format!("Demo{}", capitalized(v.as_str())))
                .replace("\"demoV1alpha1\"", &format!("\"demo{}\"", capitalized(v.as_str())));
            serde_json::from_str(&text).expect("a retargeted document is JSON")
        }
    };
    doc.values_mut().for_each(|d| retarget_gvks(d, version));
    // Applied to a map of definitions: v1alpha1 keeps spec.minReadySeconds in an annotation.
    if version == Version::V1alpha1 {
        let spec = doc.get_mut("io.k8s.demo.v1alpha1.PodSetSpec").and_then(|s| s.get_mut("properties"));
        if let Some(props) = spec.and_then(Value::as_object_mut) {
            props.remove("minReadySeconds");
        }
    }
    // Applied to a map of definitions: from v1beta1 on, a selector is required (as apps/v1's), not defaulted.
    if let Some(spec) = doc.get_mut(&format!("io.k8s.demo.{version}.PodSetSpec")).and_then(Value::as_object_mut) {
        if version != Version::V1alpha1 {
            let required = spec.entry("required").or_insert_with(|| json!([]));
            if let Some(list) = required.as_array_mut().filter(|l| !l.contains(&json!("selector"))) {
                list.push(json!("selector"));
            }
            if let Some(selector) = spec.get_mut("properties").and_then(|p| p.get_mut("selector")) {
                selector["description"] = json!(SELECTOR_REQUIRED);
            }
        }
    }
    doc
}

/// `spec.selector` as v1beta1 describes it (the types' doc comment is v1alpha1's, which defaults it).
const SELECTOR_REQUIRED: &str = "Selector is a label query over Pods that should match the replica count. \
    Required: it must match the template's labels, and it cannot change after creation.";

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Every `x-kubernetes-group-version-kind` of this group names `version`.
fn retarget_gvks(v: &mut Value, version: Version) {
    match v {
        Value::Object(m) => {
            // A list on definitions, one object on operations.
            match m.get_mut("x-kubernetes-group-version-kind") {
                Some(Value::Array(gvks)) => {
                    for g in gvks.iter_mut().filter(|g| g["group"] == GROUP) {
                        g["version"] = json!(version.as_str());
                    }
                }
                Some(g @ Value::Object(_)) if g["group"] == GROUP => g["version"] = json!(version.as_str()),
                _ => {}
            }
            m.values_mut().for_each(|x| retarget_gvks(x, version));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| retarget_gvks(x, version)),
        _ => {}
    }
}
/// PodSet's definitions as the hub's types give them (v1alpha1's names, retargeted per version by [`retarget`]).
fn definitions(flavor: Flavor) -> Map<String, Value> {
    definitions_of::<PodSet, PodSetList>(flavor, GROUP, VERSION, LIST_TYPES)
}

/// PodSet's own lists that merge by key.
pub(crate) const LIST_TYPES: &[ListType] = &[("io.k8s.demo.v1alpha1.PodSetStatus", "conditions", &["type"])];

/// The OpenAPI v3 component schemas of `version`, which server-side apply merges by.
pub fn component_schemas(version: Version) -> Map<String, Value> {
    retarget(definitions(Flavor::V3), version)
}

/// PodSet's definitions in `version`, as the documents every resource's are assembled into take them.
pub(super) fn definitions_at(version: VersionIndex, flavor: Flavor) -> Map<String, Value> {
    retarget(definitions(flavor), Version::from_index(version))
}

pub(super) fn definition_at(version: VersionIndex) -> String {
    podset_definition(Version::from_index(version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openapi::{document_v2, document_v3, Published};
    use crate::resources::podset::INFO;

    const PODSETS: &[Published] = &[Published { resource: &INFO, scale: true }];

    fn openapi_v2() -> Value {
        document_v2(PODSETS, Version::PREFERRED.as_str())
    }

    fn openapi_v3(v: Version) -> Value {
        document_v3(PODSETS, GROUP, v.as_str())
    }

    #[test]
    fn podset_schema_carries_its_gvk_and_field_docs() {
        for (doc, defs, v) in [
            (openapi_v2(), "/definitions", Version::V1alpha1),
            (openapi_v2(), "/definitions", Version::V1beta1),
            (openapi_v3(Version::V1alpha1), "/components/schemas", Version::V1alpha1),
            (openapi_v3(Version::V1beta1), "/components/schemas", Version::V1beta1),
        ] {
            let ps = doc.pointer(&format!("{defs}/{}", podset_definition(v))).expect("PodSet definition");
            assert_eq!(ps["x-kubernetes-group-version-kind"][0]["kind"], "PodSet");
            assert_eq!(ps["x-kubernetes-group-version-kind"][0]["version"], v.as_str());
            let spec = &ps["properties"]["spec"];
            let spec_ref =
                spec.pointer("/$ref").or(spec.pointer("/allOf/0/$ref")).and_then(Value::as_str).expect("spec ref");
            let spec_name = spec_ref.rsplit('/').next().unwrap();
            let replicas = doc.pointer(&format!("{defs}/{spec_name}/properties/replicas")).expect("replicas");
            assert!(replicas["description"].as_str().unwrap().contains("Defaults to 1"));
            let min_ready = doc.pointer(&format!("{defs}/{spec_name}/properties/minReadySeconds"));
            assert_eq!(min_ready.is_some(), v == Version::V1beta1, "{spec_name}: minReadySeconds in {v} only");
            assert!(doc.pointer(&format!("{defs}/io.k8s.api.core.v1.PodTemplateSpec")).is_some());
            let text = doc.to_string();
            assert!(!text.contains("strategic-merge-patch"));
            assert!(!text.contains("anyOf") && !text.contains("nullable"), "schemars-only shapes left");
            // Every reference resolves inside the document.
            for r in text.split("\"$ref\":\"").skip(1) {
                let target = &r[..r.find('"').unwrap()];
                let ptr = target.trim_start_matches('#').replace("~1", "/");
                assert!(doc.pointer(&ptr).is_some(), "dangling {target}");
            }
        }
    }

    /// What each version requires and defaults, in its own words, under its own tag.
    #[test]
    fn each_version_says_what_it_requires_under_its_own_tag() {
        let docs = [
            (openapi_v2(), "/definitions", Version::V1alpha1),
            (openapi_v2(), "/definitions", Version::V1beta1),
            (openapi_v3(Version::V1alpha1), "/components/schemas", Version::V1alpha1),
            (openapi_v3(Version::V1beta1), "/components/schemas", Version::V1beta1),
        ];
        for (doc, defs, v) in docs {
            let spec = doc.pointer(&format!("{defs}/io.k8s.demo.{v}.PodSetSpec")).expect("spec");
            let required = spec["required"].as_array().cloned().unwrap_or_default().contains(&json!("selector"));
            let described = spec["properties"]["selector"]["description"].as_str().unwrap_or_default();
            assert_eq!(required, v == Version::V1beta1, "{v}: {spec}");
            assert_eq!(described.contains("Defaults to the template's labels"), v == Version::V1alpha1, "{v}");
            assert_eq!(described.contains("Required"), v == Version::V1beta1, "{v}");
            let path = format!("/paths/~1apis~1demo.k8s.io~1{v}~1namespaces~1{{namespace}}~1podsets~1{{name}}/get");
            let get = doc.pointer(&path).expect("get");
            assert_eq!(get["tags"], json!([format!("demo{}", capitalized(v.as_str()))]), "{v}");
        }
    }

    #[test]
    fn patch_operations_offer_merge_and_json_patch_with_write_params() {
        let doc = openapi_v3(Version::V1beta1);
        let patch = &doc["paths"]["/apis/demo.k8s.io/v1beta1/namespaces/{namespace}/podsets/{name}"]["patch"];
        assert_eq!(patch["operationId"], "patchDemoV1beta1NamespacedPodSet");
        // kubectl explain finds the kind of a resource by its operations' GVK.
        assert_eq!(patch["x-kubernetes-group-version-kind"]["version"], "v1beta1");
        let content = patch["requestBody"]["content"].as_object().unwrap();
        assert!(content.contains_key("application/merge-patch+json"));
        assert!(content.contains_key("application/json-patch+json"));
        let names: Vec<&str> =
            patch["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        for want in ["dryRun", "fieldValidation", "fieldManager", "force"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
    }
}
