//! PodSet's part of the OpenAPI documents (v2 and v3): its definitions, built from the Rust types; the paths and
//! the documents are every resource's ([`crate::api::openapi`]).

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Status, WatchEvent};
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

use super::{PodSet, PodSetList, Version, GROUP};
use crate::api::openapi::{Flavor, DELETE_OPTIONS, PATCH, SCALE, STATUS, WATCH_EVENT};
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
fn definitions(flavor: Flavor) -> Map<String, Value> {
    let settings = match flavor {
        Flavor::V2 => SchemaSettings::openapi3().with(|s| s.definitions_path = "/definitions".into()),
        Flavor::V3 => SchemaSettings::openapi3(),
    };
    let mut generator = settings.into_generator();
    generator.subschema_for::<PodSet>();
    generator.subschema_for::<PodSetList>();
    generator.subschema_for::<Scale>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<WatchEvent<PodSet>>();
    let mut defs = generator.take_definitions(true);
    defs.values_mut().for_each(|d| normalize(d, flavor));
    merge_semantics(&mut defs);
    let gvk = |group: &str, version: &str, kind: &str| json!([{"group": group, "version": version, "kind": kind}]);
    let mut extend = |name: &str, key: &str, value: Value| {
        if let Some(Value::Object(def)) = defs.get_mut(name) {
            def.insert(key.into(), value);
        }
    };
    extend(SCALE, "x-kubernetes-group-version-kind", gvk("autoscaling", "v1", "Scale"));
    extend(STATUS, "x-kubernetes-group-version-kind", gvk("", "v1", "Status"));
    extend(DELETE_OPTIONS, "x-kubernetes-group-version-kind", gvk(GROUP, VERSION, "DeleteOptions"));
    extend(WATCH_EVENT, "x-kubernetes-group-version-kind", gvk(GROUP, VERSION, "WatchEvent"));
    // schemars names the generic WatchEvent after its parameter; publish it under the Kubernetes name.
    if let Some(key) = defs.keys().find(|k| k.contains("WatchEvent") && *k != WATCH_EVENT).cloned() {
        let v = defs.remove(&key).expect("present");
        defs.insert(WATCH_EVENT.into(), v);
    }
    defs.insert(
        PATCH.into(),
        json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
    );
    defs
}

/// How lists and structs merge (server-side apply), as Kubernetes 1.37 marks its types: lists not named here are
/// atomic, which is also what the absence of a marker means.
pub(crate) const LIST_TYPES: &[(&str, &str, &[&str])] = &[
    ("io.k8s.demo.v1alpha1.PodSetStatus", "conditions", &["type"]),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers", &[]),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences", &["uid"]),
    ("io.k8s.api.core.v1.PodSpec", "containers", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "initContainers", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "ephemeralContainers", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "volumes", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "imagePullSecrets", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", &["ip"]),
    ("io.k8s.api.core.v1.PodSpec", "topologySpreadConstraints", &["topologyKey", "whenUnsatisfiable"]),
    ("io.k8s.api.core.v1.PodSpec", "resourceClaims", &["name"]),
    ("io.k8s.api.core.v1.PodSpec", "schedulingGates", &["name"]),
    ("io.k8s.api.core.v1.Container", "ports", &["containerPort", "protocol"]),
    ("io.k8s.api.core.v1.Container", "env", &["name"]),
    ("io.k8s.api.core.v1.Container", "volumeMounts", &["mountPath"]),
    ("io.k8s.api.core.v1.Container", "volumeDevices", &["devicePath"]),
    ("io.k8s.api.core.v1.EphemeralContainer", "ports", &["containerPort", "protocol"]),
    ("io.k8s.api.core.v1.EphemeralContainer", "env", &["name"]),
    ("io.k8s.api.core.v1.EphemeralContainer", "volumeMounts", &["mountPath"]),
    ("io.k8s.api.core.v1.EphemeralContainer", "volumeDevices", &["devicePath"]),
    ("io.k8s.api.core.v1.ResourceRequirements", "claims", &["name"]),
];

/// Structs replaced as a whole, never merged field by field.
pub(crate) const ATOMIC_STRUCTS: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.api.core.v1.TypedObjectReference",
];

/// Publishes the merge semantics as kube-apiserver does (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
/// `x-kubernetes-map-type`): server-side apply reads them back from here, and so can any client.
fn merge_semantics(defs: &mut Map<String, Value>) {
    for (def, prop, keys) in LIST_TYPES {
        let Some(Value::Object(p)) = defs.get_mut(*def).and_then(|d| d.pointer_mut(&format!("/properties/{prop}")))
        else {
            continue;
        };
        if keys.is_empty() {
            p.insert("x-kubernetes-list-type".into(), json!("set"));
        } else {
            p.insert("x-kubernetes-list-type".into(), json!("map"));
            p.insert("x-kubernetes-list-map-keys".into(), json!(keys));
        }
    }
    for def in ATOMIC_STRUCTS {
        if let Some(Value::Object(d)) = defs.get_mut(*def) {
            d.insert("x-kubernetes-map-type".into(), json!("atomic"));
        }
    }
    for def in defs.values_mut() {
        let Some(Value::Object(props)) = def.get_mut("properties") else { continue };
        for p in props.values_mut() {
            if let Value::Object(p) = p {
                if p.contains_key("items") && !p.contains_key("x-kubernetes-list-type") {
                    p.insert("x-kubernetes-list-type".into(), json!("atomic"));
                }
            }
        }
    }
}

/// The OpenAPI v3 component schemas of `version`, which server-side apply merges by.
pub fn component_schemas(version: Version) -> Map<String, Value> {
    retarget(definitions(Flavor::V3), version)
}

/// Rewrites schemars' output into the shapes kube-apiserver publishes: optional fields are plain (no
/// `anyOf [X, null]`, no `nullable`); a described reference is `allOf: [$ref]` in v3 and `$ref` beside its
/// description in v2 (Swagger 2.0 has neither `anyOf` nor `nullable`).
fn normalize(v: &mut Value, flavor: Flavor) {
    match v {
        Value::Object(m) => {
            m.remove("nullable");
            if let Some(Value::Array(any)) = m.get("anyOf") {
                let is_null = |s: &Value| s.get("enum").is_some_and(|e| e == &json!([null]));
                if any.len() == 2 && any.iter().any(is_null) {
                    let inner = any.iter().find(|s| !is_null(s)).cloned().unwrap_or_default();
                    m.remove("anyOf");
                    if inner.get("$ref").is_some() {
                        m.insert("allOf".into(), json!([inner]));
                    } else if let Value::Object(fields) = inner {
                        for (k, val) in fields {
                            m.entry(k).or_insert(val);
                        }
                    }
                }
            }
            if flavor == Flavor::V2 {
                let single_ref = match m.get("allOf") {
                    Some(Value::Array(all)) if all.len() == 1 => all[0].get("$ref").cloned(),
                    _ => None,
                };
                if let Some(r) = single_ref {
                    m.remove("allOf");
                    m.insert("$ref".into(), r);
                }
            }
            m.values_mut().for_each(|x| normalize(x, flavor));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| normalize(x, flavor)),
        _ => {}
    }
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
