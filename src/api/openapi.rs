//! The OpenAPI paths of a resource, as k8s.io/apiserver's installer publishes them for every resource it serves:
//! the collection and item operations in the resource's scope, its `status` and `scale` subresources, with kube's
//! operation ids (`{verb}{Group}{Version}[Namespaced]{Kind}[Status|Scale]`) and tags.
//!
//! PATCH operations list JSON patch and JSON merge patch only: with no strategic-merge-patch on offer, kubectl apply
//! sends a merge patch, as it does for custom resources.

use std::borrow::Cow;

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Status, WatchEvent};
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::resource::{ResourceInfo, Scope, VersionIndex};

pub const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
pub const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
pub const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

/// Swagger 2.0 (`/openapi/v2`) or OpenAPI 3.0 (`/openapi/v3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    V2,
    V3,
}

impl Flavor {
    pub fn ref_to(self, name: &str) -> Value {
        match self {
            Flavor::V2 => json!({"$ref": format!("#/definitions/{name}")}),
            Flavor::V3 => json!({"$ref": format!("#/components/schemas/{name}")}),
        }
    }
}

/// What a resource's paths are made of, in one served version.
pub struct ResourcePaths<'a> {
    pub resource: &'a ResourceInfo,
    pub version: &'a str,
    /// The definition names of the object and of its list in this version.
    pub object: &'a str,
    pub list: &'a str,
    pub status: bool,
    pub scale: bool,
}

struct Param {
    name: &'static str,
    location: &'static str,
    kind: &'static str,
    description: Cow<'static, str>,
}

const fn param(name: &'static str, location: &'static str, kind: &'static str, description: &'static str) -> Param {
    Param { name, location, kind, description: Cow::Borrowed(description) }
}

static NAMESPACE: Param =
    param("namespace", "path", "string", "object name and auth scope, such as for teams and projects");
static PRETTY: Param = param("pretty", "query", "string", "If 'true', then the output is pretty printed.");
static DRY_RUN: Param = param("dryRun", "query", "string", "When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed");
static FIELD_MANAGER: Param = param(
    "fieldManager",
    "query",
    "string",
    "fieldManager is a name associated with the actor or entity that is making these changes.",
);
static FIELD_VALIDATION: Param = param("fieldValidation", "query", "string", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn (default), Strict.");
static FORCE: Param = param("force", "query", "boolean", "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.");
static GRACE: Param =
    param("gracePeriodSeconds", "query", "integer", "The duration in seconds before the object should be deleted.");
static PROPAGATION: Param = param("propagationPolicy", "query", "string", "Whether and how garbage collection will be performed. Acceptable values are: 'Orphan', 'Background', 'Foreground'.");
static LIST_PARAMS: &[Param] = &[
    param("allowWatchBookmarks", "query", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
    param("continue", "query", "string", "The continue option should be set when retrieving more results from the server."),
    param("fieldSelector", "query", "string", "A selector to restrict the list of returned objects by their fields (metadata.name, metadata.namespace)."),
    param("labelSelector", "query", "string", "A selector to restrict the list of returned objects by their labels."),
    param("limit", "query", "integer", "limit is a maximum number of responses to return for a list call."),
    param("resourceVersion", "query", "string", "resourceVersion sets a constraint on what resource versions a request may be served from."),
    param("resourceVersionMatch", "query", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls."),
    param("sendInitialEvents", "query", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`: the stream begins with synthetic events for all objects, then a bookmark."),
    param("timeoutSeconds", "query", "integer", "Timeout for the list/watch call."),
    param("watch", "query", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
];

fn render_params(flavor: Flavor, params: &[&Param]) -> Value {
    params
        .iter()
        .map(|p| {
            let mut v = json!({"name": p.name, "in": p.location, "description": p.description});
            if p.location == "path" {
                v["required"] = json!(true);
            }
            match flavor {
                Flavor::V2 => v["type"] = json!(p.kind),
                Flavor::V3 => v["schema"] = json!({"type": p.kind}),
            }
            v
        })
        .collect()
}

struct Operation<'a> {
    method: &'static str,
    action: &'static str,
    id: String,
    body: Option<&'static [&'static str]>,
    body_schema: &'a str,
    response: &'a str,
    kind: (&'a str, &'a str, &'a str),
    params: Vec<&'a Param>,
}

/// kube-openapi's `ToValidOperationID`: letters and digits kept, each run of anything else dropped and the letter
/// after it capitalized.
fn operation_id_part(s: &str, capitalize_first: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut capitalize = capitalize_first;
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            match capitalize {
                true => out.extend(c.to_uppercase()),
                false => out.push(c),
            }
            capitalize = false;
        } else {
            capitalize = true;
        }
    }
    out
}

/// The group as kube's operation ids and tags name it: `.k8s.io` dropped (`rbac.authorization.k8s.io` is
/// `RbacAuthorization`).
fn friendly_group(group: &str, capitalize_first: bool) -> String {
    operation_id_part(group.strip_suffix(".k8s.io").unwrap_or(group), capitalize_first)
}

fn render_operation(flavor: Flavor, tag: &str, resource_kind: &str, op: &Operation) -> Value {
    let mut parameters = render_params(flavor, &op.params);
    let response = json!({"description": "OK", "schema": flavor.ref_to(op.response)});
    let mut v = json!({
        "operationId": op.id,
        "tags": [tag],
        "description": format!("{} {resource_kind}", op.action),
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": {"group": op.kind.0, "version": op.kind.1, "kind": op.kind.2},
    });
    let produces = ["application/json", "application/yaml"];
    match flavor {
        Flavor::V2 => {
            if let (Some(_), Value::Array(list)) = (op.body, &mut parameters) {
                list.push(
                    json!({"name": "body", "in": "body", "required": true, "schema": flavor.ref_to(op.body_schema)}),
                );
            }
            v["parameters"] = parameters;
            v["produces"] = json!(produces);
            if let Some(types) = op.body {
                v["consumes"] = json!(types);
            }
            v["schemes"] = json!(["https"]);
            v["responses"] = json!({"200": response, "401": {"description": "Unauthorized"}});
        }
        Flavor::V3 => {
            v["parameters"] = parameters;
            if let Some(types) = op.body {
                let content: Map<String, Value> =
                    types.iter().map(|t| (t.to_string(), json!({"schema": flavor.ref_to(op.body_schema)}))).collect();
                v["requestBody"] = json!({"required": true, "content": content});
            }
            let content: Map<String, Value> =
                produces.iter().map(|t| (t.to_string(), json!({"schema": flavor.ref_to(op.response)}))).collect();
            v["responses"] =
                json!({"200": {"description": "OK", "content": content}, "401": {"description": "Unauthorized"}});
        }
    }
    v
}

const PATCH_TYPES: &[&str] = &["application/json-patch+json", "application/merge-patch+json"];
const JSON_BODY: &[&str] = &["application/json", "application/yaml"];

fn params<'a>(first: &[&'a Param], rest: &[&'a Param]) -> Vec<&'a Param> {
    [first, rest].concat()
}

/// The paths of one resource in one version.
pub fn resource_paths(p: &ResourcePaths<'_>, flavor: Flavor) -> Map<String, Value> {
    let r = p.resource;
    let (group, version, kind, plural) = (r.group, p.version, r.kind, r.plural);
    let (object, list) = (p.object, p.list);
    let gvk = (group, version, kind);
    let scale_gvk = ("autoscaling", "v1", "Scale");
    let prefix = format!("{}{}", friendly_group(group, true), operation_id_part(version, true));
    let tag = format!("{}{}", friendly_group(group, false), operation_id_part(version, true));
    let base = format!("/apis/{group}/{version}");
    let namespaced = r.scope == Scope::Namespaced;
    let scoped = if namespaced { "Namespaced" } else { "" };
    let name = Param {
        name: "name",
        location: "path",
        kind: "string",
        description: Cow::Owned(format!("name of the {kind}")),
    };
    let scope: Vec<&Param> = if namespaced { vec![&NAMESPACE] } else { vec![] };
    let item: Vec<&Param> = [vec![&name], scope.clone()].concat();
    let listing: Vec<&Param> = std::iter::once(&PRETTY).chain(LIST_PARAMS).collect();
    let writes = [&PRETTY, &DRY_RUN, &FIELD_MANAGER, &FIELD_VALIDATION];
    let patches = [&PRETTY, &DRY_RUN, &FIELD_MANAGER, &FIELD_VALIDATION, &FORCE];
    let deletes = [&PRETTY, &DRY_RUN, &GRACE, &PROPAGATION];
    let deletes_selected: Vec<&Param> = deletes.into_iter().chain(LIST_PARAMS).collect();
    let op = |method, action, id: String, body, body_schema, response, kind, params| Operation {
        method,
        action,
        id,
        body,
        body_schema,
        response,
        kind,
        params,
    };
    let mut entries: Vec<(String, Vec<Operation>)> = Vec::new();
    if namespaced {
        let id = format!("list{prefix}{kind}ForAllNamespaces");
        entries.push((format!("{base}/{plural}"), vec![op("get", "list", id, None, list, list, gvk, listing.clone())]));
    }
    let collection = match namespaced {
        true => format!("{base}/namespaces/{{namespace}}/{plural}"),
        false => format!("{base}/{plural}"),
    };
    entries.push((
        collection.clone(),
        vec![
            op("get", "list", format!("list{prefix}{scoped}{kind}"), None, list, list, gvk, params(&scope, &listing)),
            op(
                "post",
                "post",
                format!("create{prefix}{scoped}{kind}"),
                Some(JSON_BODY),
                object,
                object,
                gvk,
                params(&scope, &writes),
            ),
            op(
                "delete",
                "deletecollection",
                format!("delete{prefix}Collection{scoped}{kind}"),
                None,
                DELETE_OPTIONS,
                STATUS,
                gvk,
                params(&scope, &deletes_selected),
            ),
        ],
    ));
    // The object, then each subresource: read, replace and patch (and the object's delete).
    let mut parts = vec![("", object, gvk)];
    if p.status {
        parts.push(("Status", object, gvk));
    }
    if p.scale {
        parts.push(("Scale", SCALE, scale_gvk));
    }
    for (sub, schema, sub_gvk) in parts {
        let id = |verb: &str| format!("{verb}{prefix}{scoped}{kind}{sub}");
        let mut ops = vec![
            op("get", "get", id("read"), None, schema, schema, sub_gvk, params(&item, &[&PRETTY])),
            op("put", "put", id("replace"), Some(JSON_BODY), schema, schema, sub_gvk, params(&item, &writes)),
            op("patch", "patch", id("patch"), Some(PATCH_TYPES), PATCH, schema, sub_gvk, params(&item, &patches)),
        ];
        if sub.is_empty() {
            ops.push(op("delete", "delete", id("delete"), None, DELETE_OPTIONS, STATUS, gvk, params(&item, &deletes)));
        }
        let path = match sub {
            "" => format!("{collection}/{{name}}"),
            sub => format!("{collection}/{{name}}/{}", sub.to_lowercase()),
        };
        entries.push((path, ops));
    }
    entries
        .into_iter()
        .map(|(path, ops)| {
            let item: Map<String, Value> =
                ops.iter().map(|o| (o.method.to_owned(), render_operation(flavor, &tag, kind, o))).collect();
            (path, Value::Object(item))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_name_the_group_as_kube_does() {
        assert_eq!(friendly_group("demo.k8s.io", true), "Demo");
        assert_eq!(friendly_group("rbac.authorization.k8s.io", true), "RbacAuthorization");
        assert_eq!(friendly_group("test.podset.example", false), "testPodsetExample");
        assert_eq!(operation_id_part("v1beta1", true), "V1beta1");
    }

    /// A cluster-scoped resource with a status: no namespace anywhere, ids without `Namespaced`, no scale.
    #[test]
    fn a_cluster_scoped_resource_has_paths_and_ids_of_its_scope() {
        let (object, list) = ("example.podset.test.v1.Widget", "example.podset.test.v1.WidgetList");
        let p = ResourcePaths {
            resource: &super::super::resource::WIDGETS,
            version: "v1",
            object,
            list,
            status: true,
            scale: false,
        };
        let paths = resource_paths(&p, Flavor::V3);
        let names: Vec<&str> = paths.keys().map(String::as_str).collect();
        let base = "/apis/test.podset.example/v1/widgets";
        assert_eq!(names, [base.to_owned(), format!("{base}/{{name}}"), format!("{base}/{{name}}/status")]);
        let ids = |path: &str| -> Vec<String> {
            paths[path].as_object().unwrap().values().map(|o| o["operationId"].as_str().unwrap().to_owned()).collect()
        };
        assert_eq!(
            ids(base),
            [
                "deleteTestPodsetExampleV1CollectionWidget",
                "listTestPodsetExampleV1Widget",
                "createTestPodsetExampleV1Widget"
            ]
        );
        assert_eq!(ids(&format!("{base}/{{name}}/status"))[0], "readTestPodsetExampleV1WidgetStatus");
        let text = Value::Object(paths.clone()).to_string();
        assert!(!text.contains("\"namespace\""), "no namespace parameter");
        assert_eq!(paths[base]["get"]["tags"], json!(["testPodsetExampleV1"]));
        assert_eq!(
            paths[base]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/{object}")
        );
    }
}

/// A resource's part of the OpenAPI documents: its definitions in one version (the object, its list and what they
/// reference, the shared kinds its paths name among them), and the name of its object's definition there (its
/// list's is that name with `List`).
#[derive(Debug)]
pub struct OpenApi {
    pub definitions: fn(VersionIndex, Flavor) -> Map<String, Value>,
    pub definition: fn(VersionIndex) -> String,
}

/// A served resource as the documents describe it: whether it has `/scale` (its strategy says).
#[derive(Debug, Clone, Copy)]
pub struct Published {
    pub resource: &'static ResourceInfo,
    pub scale: bool,
}

/// `from`'s definitions added to `into`; a definition both have (a kind every resource shares) lists the
/// group-version-kinds of both.
fn merge(into: &mut Map<String, Value>, from: Map<String, Value>) {
    const GVK: &str = "x-kubernetes-group-version-kind";
    for (name, def) in from {
        match into.get_mut(&name) {
            None => {
                into.insert(name, def);
            }
            Some(have) => {
                let (Some(Value::Array(mine)), Some(Value::Array(theirs))) = (have.get_mut(GVK), def.get(GVK)) else {
                    continue;
                };
                for g in theirs {
                    if !mine.contains(g) {
                        mine.push(g.clone());
                    }
                }
            }
        }
    }
}

/// The paths and definitions of `published` in `version` (a resource not served in it adds nothing).
fn resource_parts(
    p: &Published,
    version: &str,
    flavor: Flavor,
    paths: &mut Map<String, Value>,
    definitions: &mut Map<String, Value>,
) {
    let r = p.resource;
    let Some(v) = r.versions.iter().position(|x| x.name == version).map(|i| VersionIndex(i as u8)) else { return };
    let object = (r.openapi.definition)(v);
    let list = format!("{object}List");
    let rp = ResourcePaths { resource: r, version, object: &object, list: &list, status: r.status, scale: p.scale };
    paths.extend(resource_paths(&rp, flavor));
    merge(definitions, (r.openapi.definitions)(v, flavor));
}

/// The Swagger 2.0 document served at `/openapi/v2`: every resource's paths and definitions in every version.
/// `info.version` is the first resource's preferred version.
pub fn document_v2(published: &[Published], preferred: &str) -> Value {
    let (mut paths, mut definitions) = (Map::new(), Map::new());
    for p in published {
        for v in p.resource.versions {
            resource_parts(p, v.name, Flavor::V2, &mut paths, &mut definitions);
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "podset-apiserver", "version": preferred},
        "paths": paths,
        "definitions": definitions,
    })
}

/// The OpenAPI 3.0 document served at `/openapi/v3/apis/<group>/<version>`.
pub fn document_v3(published: &[Published], group: &str, version: &str) -> Value {
    let (mut paths, mut schemas) = (Map::new(), Map::new());
    for p in published.iter().filter(|p| p.resource.group == group) {
        resource_parts(p, version, Flavor::V3, &mut paths, &mut schemas);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "podset-apiserver", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// A resource's definitions generated from its types, in the shapes kube-apiserver publishes: `Object`, `List`
/// and what they reference, with the kinds every resource's paths name (Scale, Status, DeleteOptions,
/// WatchEvent and Patch; DeleteOptions and WatchEvent for `group`/`version`), merge semantics marked on
/// Kubernetes' own types and on the resource's `list_types`.
pub fn definitions_of<Object, List>(
    flavor: Flavor,
    group: &str,
    version: &str,
    list_types: &[ListType],
) -> Map<String, Value>
where
    Object: JsonSchema + Clone + Serialize + DeserializeOwned,
    List: JsonSchema,
{
    let settings = match flavor {
        Flavor::V2 => SchemaSettings::openapi3().with(|s| s.definitions_path = "/definitions".into()),
        Flavor::V3 => SchemaSettings::openapi3(),
    };
    let mut generator = settings.into_generator();
    generator.subschema_for::<Object>();
    generator.subschema_for::<List>();
    generator.subschema_for::<Scale>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<WatchEvent<Object>>();
    let mut defs = generator.take_definitions(true);
    defs.values_mut().for_each(|d| normalize(d, flavor));
    merge_semantics(&mut defs, list_types);
    let gvk = |group: &str, version: &str, kind: &str| json!([{"group": group, "version": version, "kind": kind}]);
    let mut extend = |name: &str, key: &str, value: Value| {
        if let Some(Value::Object(def)) = defs.get_mut(name) {
            def.insert(key.into(), value);
        }
    };
    extend(SCALE, "x-kubernetes-group-version-kind", gvk("autoscaling", "v1", "Scale"));
    extend(STATUS, "x-kubernetes-group-version-kind", gvk("", "v1", "Status"));
    extend(DELETE_OPTIONS, "x-kubernetes-group-version-kind", gvk(group, version, "DeleteOptions"));
    extend(WATCH_EVENT, "x-kubernetes-group-version-kind", gvk(group, version, "WatchEvent"));
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

/// A list that merges by key (`x-kubernetes-list-type: map` with these keys) or as a set (no keys): a
/// definition, its property, the keys.
pub type ListType = (&'static str, &'static str, &'static [&'static str]);

/// How Kubernetes' own lists merge (server-side apply), as Kubernetes 1.37 marks its types: lists named neither
/// here nor by a resource are atomic, which is also what the absence of a marker means.
pub const LIST_TYPES: &[ListType] = &[
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
pub const ATOMIC_STRUCTS: &[&str] = &[
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
fn merge_semantics(defs: &mut Map<String, Value>, own: &[ListType]) {
    for (def, prop, keys) in own.iter().chain(LIST_TYPES) {
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
