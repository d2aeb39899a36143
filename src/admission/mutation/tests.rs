//! The cases of k8s.io/apiserver's `policy/mutating/patch/json_patch_test.go` that are about the patch (not the CEL
//! that makes it), on the same Deployment-shaped objects, and the apply configuration's wrapping.

use serde_json::{json, Value};

use super::*;
use crate::admission::BoxError;

fn deployment(spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec})
}

fn with_labels(labels: Value) -> Value {
    let mut d = deployment(json!({}));
    d["metadata"]["labels"] = labels;
    d
}

fn with_containers(names: &[&str]) -> Value {
    let containers: Vec<Value> = names.iter().map(|n| json!({"name": n})).collect();
    deployment(json!({"template": {"spec": {"containers": containers}}}))
}

fn op(op: &str, path: &str, value: Value) -> Value {
    operation(op, path, None, Some(value))
}

fn op_from(op: &str, from: &str, path: &str) -> Value {
    operation(op, path, Some(from), None)
}

fn patched(object: &Value, ops: &[Value]) -> Value {
    json_patch(object, ops).unwrap_or_else(|e| panic!("{ops:?}: {e}"))
}

#[test]
fn a_failed_test_leaves_the_object_as_it_was_and_a_passed_one_lets_the_rest_apply() {
    let d = deployment(json!({"replicas": 1}));
    let failing = [op("test", "/spec/replicas", json!(100)), op("replace", "/spec/replicas", json!(3))];
    assert_eq!(patched(&d, &failing), d);
    let passing = [op("test", "/spec/replicas", json!(1)), op("replace", "/spec/replicas", json!(3))];
    assert_eq!(patched(&d, &passing), deployment(json!({"replicas": 3})));
    // Operations before the failed test are undone too.
    let after = [op("replace", "/spec/replicas", json!(3)), op("test", "/spec/replicas", json!(1))];
    assert_eq!(patched(&d, &after), d);
    // A CEL number is a double: 1.0 passes where the object has 1.
    assert_eq!(
        patched(&d, &[op("test", "/spec/replicas", json!(1.0)), op("remove", "/spec/replicas", json!(null))]),
        deployment(json!({}))
    );
    // An absent key matches only a test without a value; a missing parent is an error, not a failed test.
    assert_eq!(patched(&d, &[operation("test", "/spec/paused", None, None)]), d);
    assert_eq!(patched(&d, &[op("test", "/spec/paused", json!(null)), op("add", "/x", json!(1))]), d);
    assert_eq!(
        json_patch(&d, &[op("test", "/spec/strategy/type", json!("x"))]).unwrap_err(),
        "JSON Patch: test operation does not apply: is missing path: /spec/strategy/type: missing value"
    );
}

#[test]
fn remove_unsets_a_field_a_map_entry_or_a_list_item() {
    assert_eq!(
        patched(&deployment(json!({"replicas": 1})), &[operation("remove", "/spec/replicas", None, None)]),
        deployment(json!({}))
    );
    let labels = with_labels(json!({"x": "1", "y": "1"}));
    assert_eq!(
        patched(&labels, &[operation("remove", "/metadata/labels/y", None, None)]),
        with_labels(json!({"x": "1"}))
    );
    let remove_1 = [operation("remove", "/spec/template/spec/containers/1", None, None)];
    assert_eq!(patched(&with_containers(&["a", "b", "c"]), &remove_1), with_containers(&["a", "c"]));
    assert_eq!(
        json_patch(&labels, &[operation("remove", "/metadata/labels/z", None, None)]).unwrap_err(),
        "JSON Patch: error in remove for path: '/metadata/labels/z': Unable to remove nonexistent key: z: missing value"
    );
}

#[test]
fn copy_and_move_take_map_entries_and_list_items_to_the_list_end() {
    let x = with_labels(json!({"x": "1"}));
    assert_eq!(
        patched(&x, &[op_from("copy", "/metadata/labels/x", "/metadata/labels/y")]),
        with_labels(json!({"x": "1", "y": "1"}))
    );
    assert_eq!(
        patched(&x, &[op_from("move", "/metadata/labels/x", "/metadata/labels/y")]),
        with_labels(json!({"y": "1"}))
    );
    let abc = with_containers(&["a", "b", "c"]);
    let to_end = |kind| [op_from(kind, "/spec/template/spec/containers/0", "/spec/template/spec/containers/-")];
    assert_eq!(patched(&abc, &to_end("copy")), with_containers(&["a", "b", "c", "a"]));
    assert_eq!(patched(&abc, &to_end("move")), with_containers(&["b", "c", "a"]));
    assert_eq!(
        json_patch(&x, &[op_from("move", "/metadata/labels/nope", "/metadata/labels/y")]).unwrap_err(),
        "JSON Patch: error in move for path: 'nope': Unable to remove nonexistent key: nope: missing value"
    );
}

#[test]
fn add_sets_map_entries_whole_maps_and_list_items() {
    assert_eq!(
        patched(&with_labels(json!({"y": "1"})), &[op("add", "/metadata/labels/x", json!("2"))]),
        with_labels(json!({"y": "1", "x": "2"}))
    );
    assert_eq!(
        patched(&deployment(json!({})), &[op("add", "/metadata/labels", json!({"y": "2"}))]),
        with_labels(json!({"y": "2"}))
    );
    // On an existing map it replaces it.
    assert_eq!(
        patched(&with_labels(json!({"x": "1"})), &[op("add", "/metadata/labels", json!({"y": "2"}))]),
        with_labels(json!({"y": "2"}))
    );
    let a = with_containers(&["a"]);
    let add_x = |path| [op("add", path, json!({"name": "x"}))];
    assert_eq!(patched(&a, &add_x("/spec/template/spec/containers/0")), with_containers(&["x", "a"]));
    assert_eq!(patched(&a, &add_x("/spec/template/spec/containers/-")), with_containers(&["a", "x"]));
    assert_eq!(patched(&a, &add_x("/spec/template/spec/containers/1")), with_containers(&["a", "x"]));
    // evanphx/json-patch counts negative indexes from the end: -1 is the end itself for add.
    assert_eq!(patched(&a, &add_x("/spec/template/spec/containers/-1")), with_containers(&["a", "x"]));
    let spec = json!({"selector": {}, "replicas": 10});
    assert_eq!(patched(&deployment(json!({})), &[op("add", "/spec", spec.clone())]), deployment(spec));
    assert_eq!(
        json_patch(&a, &add_x("/spec/template/spec/containers/5")).unwrap_err(),
        "JSON Patch: error in add for path: '/spec/template/spec/containers/5': Unable to access invalid index: 5: \
         invalid index referenced"
    );
    assert_eq!(
        json_patch(&a, &[op("add", "/spec/strategy/type", json!("Recreate"))]).unwrap_err(),
        "JSON Patch: add operation does not apply: doc is missing path: \"/spec/strategy/type\": missing value"
    );
}

#[test]
fn replace_sets_absent_keys_too_but_not_past_a_list_end() {
    // evanphx/json-patch v4 replaces an absent object key by setting it, where RFC 6902 fails.
    assert_eq!(
        patched(&with_labels(json!({"y": "1"})), &[op("replace", "/metadata/labels/x", json!("2"))]),
        with_labels(json!({"y": "1", "x": "2"}))
    );
    assert_eq!(
        patched(&deployment(json!({})), &[op("replace", "/metadata/labels", json!({"y": "2"}))]),
        with_labels(json!({"y": "2"}))
    );
    assert_eq!(
        patched(&with_labels(json!({"x": "1"})), &[op("replace", "/metadata/labels", json!({"y": "2"}))]),
        with_labels(json!({"y": "2"}))
    );
    let a = with_containers(&["a"]);
    assert_eq!(
        patched(&a, &[op("replace", "/spec/template/spec/containers/0", json!({"name": "x"}))]),
        with_containers(&["x"])
    );
    assert_eq!(
        json_patch(&a, &[op("replace", "/spec/template/spec/containers/-", json!({"name": "x"}))]).unwrap_err(),
        "JSON Patch: replace operation does not apply: doc is missing key: /spec/template/spec/containers/-: \
         missing value"
    );
    assert_eq!(patched(&a, &[op("replace", "", json!({"kind": "Other"}))]), json!({"kind": "Other"}));
}

#[test]
fn escaped_keys_and_operations_kube_does_not_know() {
    // json_patch_test.go: "JSONPatch key escaping" (the key jsonpatch.escapeKey makes of "k8s.io/x~y").
    let ops = [op("add", "/metadata/labels", json!({})), op("add", "/metadata/labels/k8s.io~1x~0y", json!("true"))];
    assert_eq!(patched(&with_labels(json!({})), &ops), with_labels(json!({"k8s.io/x~y": "true"})));
    // `~01` is `~1`, not `/`.
    assert_eq!(
        patched(&with_labels(json!({})), &[op("add", "/metadata/labels/a~01", json!("v"))]),
        with_labels(json!({"a~1": "v"}))
    );
    let d = deployment(json!({}));
    assert_eq!(
        json_patch(&d, &[op("frobnicate", "/spec", json!(1))]).unwrap_err(),
        "JSON Patch: Unexpected kind: frobnicate"
    );
    assert_eq!(
        json_patch(&d, &[json!({"op": "replace", "value": 1})]).unwrap_err(),
        "JSON Patch: replace operation failed to decode path: operation missing path field: missing value"
    );
    assert_eq!(
        json_patch(&with_containers(&["a"]), &[op("add", "/spec/template/spec/containers/x", json!(1))]).unwrap_err(),
        "JSON Patch: error in add for path: '/spec/template/spec/containers/x': value was not a proper array index: \
         'x': strconv.Atoi: parsing \"x\": invalid syntax"
    );
}

#[test]
fn copies_are_limited_as_kube_apiserver_limits_them() {
    let big = with_labels(json!({"x": "v".repeat(MAX_COPY_BYTES / 2)}));
    let copy = |to: &str| op_from("copy", "/metadata/labels/x", to);
    assert!(json_patch(&big, &[copy("/metadata/labels/a")]).is_ok());
    let e = json_patch(&big, &[copy("/metadata/labels/a"), copy("/metadata/labels/b")]).unwrap_err();
    assert!(e.starts_with("JSON Patch: Unable to complete the copy, the accumulated size increase of copy is "), "{e}");
}

/// Merges by echoing the configuration over the object's metadata, or refuses with what it is given.
#[derive(Debug)]
struct Echo(Option<&'static str>);

impl ObjectInterfaces for Echo {
    fn decode_and_default(&self, _object: &mut Value) -> Result<(), BoxError> {
        Ok(())
    }

    fn apply_configuration(&self, _object: &Value, patch: &Value) -> Result<Value, ApplyConfigurationError> {
        match self.0 {
            Some(refusal) => Err(ApplyConfigurationError::Patch(refusal.to_owned())),
            None => Ok(patch.clone()),
        }
    }
}

/// Only the trait's own answer.
#[derive(Debug)]
struct NoSchema;

impl ObjectInterfaces for NoSchema {
    fn decode_and_default(&self, _object: &mut Value) -> Result<(), BoxError> {
        Ok(())
    }
}

#[test]
fn an_apply_configuration_takes_the_object_s_kind_and_kube_s_error_prefix() {
    let d = deployment(json!({"replicas": 1}));
    let merged = apply_configuration(&Echo(None), &d, &json!({"spec": {"replicas": 2}})).unwrap();
    assert_eq!(merged, json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}}));
    let other = json!({"apiVersion": "v1", "kind": "Pod", "spec": {}});
    assert_eq!(apply_configuration(&Echo(None), &d, &other).unwrap()["kind"], "Deployment");
    assert_eq!(
        apply_configuration(&Echo(Some("invalid ApplyConfiguration: x")), &d, &json!({})).unwrap_err().to_string(),
        "error applying patch: invalid ApplyConfiguration: x"
    );
    let none = apply_configuration(&NoSchema, &d, &json!({})).unwrap_err();
    assert_eq!(none, ApplyConfigurationError::KindNotFound("apps/v1, Kind=Deployment".into()));
    assert_eq!(
        none.to_string(),
        "Resource kind apps/v1, Kind=Deployment not found. There can be a delay between when \
         CustomResourceDefinitions are created and when they are available."
    );
    assert_eq!(gvk_text(&json!({"apiVersion": "v1", "kind": "Pod"})), "/v1, Kind=Pod");
    assert_eq!(gvk_text(&json!({})), "/, Kind=");
}
