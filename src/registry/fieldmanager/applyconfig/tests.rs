//! On PodSet's schema: the cases of k8s.io/apiserver's `policy/mutating/patch/smd_test.go` (a Deployment's there,
//! with the same PodTemplateSpec and LabelSelector), and how labels, containers and their lists merge.

use serde_json::{json, Value};

use super::*;
use crate::api::schema::{component_schemas, podset_definition};
use crate::api::Version;

const V: &str = "demo.k8s.io/v1alpha1";

fn schema() -> Schema {
    Schema::from_openapi(&component_schemas(Version::V1alpha1), &podset_definition(Version::V1alpha1))
}

fn object(spec: Value) -> Value {
    json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
}

fn template(pod: Value) -> Value {
    json!({"replicas": 1, "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod}})
}

/// A configuration as the policy's plugin hands it over: with the object's apiVersion and kind.
fn patch(body: Value) -> Value {
    let mut p = json!({"apiVersion": V, "kind": "PodSet"});
    p.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
    p
}

fn apply(object: &Value, body: Value) -> Result<Value, String> {
    apply_configuration(&schema(), object, &patch(body))
}

fn pod_of(v: &Value) -> &Value {
    &v["spec"]["template"]["spec"]
}

#[test]
fn labels_and_annotations_merge_into_the_existing_ones() {
    let mut live = object(template(json!({"containers": [{"name": "main", "image": "x"}]})));
    live["metadata"]["labels"] = json!({"app": "web", "tier": "front"});
    live["metadata"]["annotations"] = json!({"a": "1"});
    let out =
        apply(&live, json!({"metadata": {"labels": {"tier": "back", "new": "b"}, "annotations": {"b": "2"}}})).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"app": "web", "tier": "back", "new": "b"}));
    assert_eq!(out["metadata"]["annotations"], json!({"a": "1", "b": "2"}));
    assert_eq!(out["spec"], live["spec"]);
}

#[test]
fn containers_merge_by_name_and_their_env_and_ports_by_key() {
    let live = object(template(json!({"containers": [
        {"name": "main", "image": "x", "command": ["serve"], "env": [{"name": "A", "value": "1"}],
         "ports": [{"containerPort": 80, "protocol": "TCP"}]},
        {"name": "other", "image": "o"}]})));
    let out = apply(
        &live,
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "y", "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
             "ports": [{"containerPort": 8080}]},
            {"name": "side", "image": "z"}]}}}}),
    )
    .unwrap();
    assert_eq!(
        pod_of(&out)["containers"],
        json!([
            {"name": "main", "image": "y", "command": ["serve"],
             "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
             "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 8080}]},
            {"name": "other", "image": "o"},
            {"name": "side", "image": "z"}
        ])
    );
}

#[test]
fn atomic_lists_and_structs_are_refused_with_kube_s_message() {
    let live = object(template(json!({"containers": [{"name": "main", "image": "x", "args": ["a"]}]})));
    let args =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "args": ["b"], "command": ["c"]}]}}}});
    assert_eq!(
        apply(&live, args).unwrap_err(),
        "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: \
         .spec.template.spec.containers[0].args, .spec.template.spec.containers[0].command"
    );
    // smd_test.go: "apply configuration with change to atomic".
    assert_eq!(
        apply(&live, json!({"spec": {"selector": {"matchLabels": {"l": "v"}}}})).unwrap_err(),
        "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: .spec.selector"
    );
}

#[test]
fn undeclared_fields_and_other_kinds_are_refused() {
    let live = object(template(json!({"containers": [{"name": "main"}]})));
    // smd_test.go: "apply configuration with invalid field name".
    assert_eq!(
        apply(&live, json!({"spec": {"replicasx": 1}})).unwrap_err(),
        "failed to convert patch object to typed object: .spec.replicasx: field not declared in schema"
    );
    assert_eq!(
        apply(&live, json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "imagex": "i"}]}}}}))
            .unwrap_err(),
        "failed to convert patch object to typed object: \
         .spec.template.spec.containers[name=\"main\"].imagex: field not declared in schema"
    );
    let mut other = patch(json!({"spec": {"replicas": 2}}));
    other["apiVersion"] = json!("demo.k8s.io/v1beta1");
    assert_eq!(
        apply_configuration(&schema(), &live, &other).unwrap_err(),
        "patch (demo.k8s.io/v1beta1, Kind=PodSet) and original object (demo.k8s.io/v1alpha1, Kind=PodSet) are not \
         of the same gvk"
    );
}

#[test]
fn list_maps_take_new_items_and_update_existing_ones() {
    // smd_test.go: "apply configuration add to listType=map".
    let live = object(template(json!({"containers": [{"name": "main"}], "volumes": [{"name": "x"}]})));
    let out = apply(&live, json!({"spec": {"template": {"spec": {"volumes": [{"name": "y"}]}}}})).unwrap();
    assert_eq!(pod_of(&out)["volumes"], json!([{"name": "x"}, {"name": "y"}]));
    // smd_test.go: "apply configuration update listType=map entry".
    let live = object(template(json!({"containers": [{"name": "main"}], "volumes": [{"name": "x"}, {"name": "y"}]})));
    let out =
        apply(&live, json!({"spec": {"template": {"spec": {"volumes": [{"name": "y", "hostPath": {"path": "a"}}]}}}}))
            .unwrap();
    assert_eq!(pod_of(&out)["volumes"], json!([{"name": "x"}, {"name": "y", "hostPath": {"path": "a"}}]));
}

#[test]
fn scalars_are_replaced_and_an_empty_object_takes_the_whole_configuration() {
    // smd_test.go: "apply configuration with conditionals" (the expression's result).
    let live = object(json!({"replicas": 2}));
    assert_eq!(apply(&live, json!({"spec": {"replicas": 3}})).unwrap(), object(json!({"replicas": 3})));
    // smd_test.go: "complex apply configuration initialization".
    let spec = json!({"replicas": 1, "template": {
        "metadata": {"labels": {"app": "nginx"}},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.14.2", "ports": [{"containerPort": 80}],
                                 "resources": {"limits": {"cpu": "128M"}}}]}}});
    assert_eq!(apply(&object(json!({})), json!({"spec": spec.clone()})).unwrap(), object(spec));
}

#[test]
fn duplicates_in_the_live_object_stay_until_the_configuration_sets_their_key() {
    let with_env = |env: Value| object(template(json!({"containers": [{"name": "nginx", "env": env}]})));
    let dup = json!([{"name": "test", "value": "a"}, {"name": "test", "value": "b"}, {"name": "foo", "value": "bar"}]);
    // smd_test.go: "apply configuration with duplicate env vars in original object".
    let out = apply(&with_env(dup.clone()), json!({"spec": {"replicas": 3}})).unwrap();
    assert_eq!(out["spec"]["replicas"], 3);
    assert_eq!(pod_of(&out)["containers"][0]["env"], dup);
    // smd_test.go: "apply configuration modify existing env variable": the repeats become the one set.
    let set_test = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "nginx", "env": [{"name": "test", "value": "c"}]}]}}}});
    let out = apply(&with_env(dup), set_test).unwrap();
    assert_eq!(
        pod_of(&out)["containers"][0]["env"],
        json!([{"name": "test", "value": "c"}, {"name": "foo", "value": "bar"}])
    );
}
