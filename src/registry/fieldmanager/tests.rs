//! Field management on the real PodSet schema. The expected FieldsV1 are what kube-apiserver records for the same
//! writes on a Deployment's `spec.replicas` and `spec.template` (tests/server_side_apply.rs checks that against a
//! running kube-apiserver).

use serde_json::{json, Value};

use super::*;
use crate::api::schema::{component_schemas, podset_definition};
use crate::api::Version;

const V: &str = "demo.k8s.io/v1alpha1";
const T1: &str = "2026-01-01T00:00:01Z";
const T2: &str = "2026-01-01T00:00:02Z";

fn fm() -> FieldManager {
    FieldManager::new(
        &component_schemas(Version::V1alpha1),
        &podset_definition(Version::V1alpha1),
        V,
        json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": null}}}, "status": {}}),
        &crate::resources::podset::RESET_FIELDS,
    )
}

fn podset(replicas: i64, containers: Value) -> Value {
    json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": containers}}}})
}

fn entries(obj: &Value) -> Vec<(String, String, String, Value)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap().to_owned(),
                        e["operation"].as_str().unwrap().to_owned(),
                        e.get("subresource").and_then(Value::as_str).unwrap_or("").to_owned(),
                        e["fieldsV1"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fields_of(obj: &Value, manager: &str) -> Value {
    entries(obj).into_iter().find(|e| e.0 == manager).map(|e| e.3).unwrap_or(Value::Null)
}

fn main_container(image: &str) -> Value {
    json!([{"name": "main", "image": image}])
}

#[test]
fn every_list_type_names_a_real_field() {
    let defs = component_schemas(Version::V1alpha1);
    let text = serde_json::to_string(&defs).unwrap();
    assert!(text.contains("\"x-kubernetes-list-map-keys\":[\"containerPort\",\"protocol\"]"));
    let containers = &defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
    assert_eq!(containers["x-kubernetes-list-type"], "map");
    assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(defs["io.k8s.api.core.v1.Container"]["properties"]["args"]["x-kubernetes-list-type"], "atomic");
    assert_eq!(
        defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["finalizers"]["x-kubernetes-list-type"],
        "set"
    );
    for (def, prop, _) in crate::api::openapi::LIST_TYPES.iter().chain(crate::api::schema::LIST_TYPES) {
        assert!(defs[*def]["properties"].get(*prop).is_some(), "{def}.{prop} does not exist");
    }
    for def in crate::api::openapi::ATOMIC_STRUCTS {
        assert_eq!(defs[*def]["x-kubernetes-map-type"], "atomic", "{def}");
    }
}

#[test]
fn create_records_the_creator_without_system_fields() {
    let mut obj = podset(2, main_container("nginx"));
    fm().update(None, &mut obj, "kubectl-create", Subresource::Main, T1).unwrap();
    let mf = &obj["metadata"]["managedFields"][0];
    assert_eq!(mf["manager"], "kubectl-create");
    assert_eq!(mf["operation"], "Update");
    assert_eq!(mf["apiVersion"], V);
    assert_eq!(mf["time"], T1);
    assert_eq!(mf["fieldsType"], "FieldsV1");
    assert!(mf.get("subresource").is_none());
    assert_eq!(
        mf["fieldsV1"],
        json!({"f:spec": {"f:replicas": {}, "f:template": {
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
    );
}

/// PodSets of many shapes, as the registry stores them (system fields, defaults) and as clients send them.
fn varied_podsets() -> Vec<Value> {
    let full = json!({"apiVersion": V, "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default", "uid": "u1", "generation": 1, "resourceVersion": "",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "generateName": "web-",
                     "labels": {"app": "web", "tier": ""}, "annotations": {"a": "b"},
                     "finalizers": ["example.com/f", "orphan"],
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "o1",
                                          "controller": true}]},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                                             "matchExpressions": [{"key": "a", "operator": "Exists"}]},
                 "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"x": "y"}},
                              "spec": {"containers": [
                                  {"name": "main", "image": "nginx", "args": ["-g", "daemon off;"],
                                   "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
                                   "env": [{"name": "A", "value": "1"},
                                           {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
                                   "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}},
                                   "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                                  {"name": "side", "image": "busybox", "command": ["sleep", "3600"]}],
                                  "initContainers": [{"name": "init", "image": "busybox"}],
                                  "volumes": [{"name": "v", "emptyDir": {}}],
                                  "tolerations": [{"key": "k", "operator": "Exists"}],
                                  "nodeSelector": {"disk": "ssd"},
                                  "securityContext": {}, "restartPolicy": "Always"}}},
        "status": {"replicas": 1, "podNames": ["web-a"], "conditions": [{"type": "ReplicaFailure", "status": "True",
                   "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R", "message": "m"}]}});
    let mut out = vec![
        full.clone(),
        json!({}),
        json!({"metadata": {"name": "web"}}),
        json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web", "labels": {"app": "bench"}},
               "spec": {"replicas": 1}}),
        podset(2, main_container("nginx")),
        podset(0, json!([])),
        podset(1, json!(null)),
        json!({"metadata": {"labels": {}, "annotations": null}, "spec": {"template": {}, "selector": {}},
               "status": {}}),
        json!({"spec": {"template": {"metadata": {}, "spec": {}}}}),
        json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "ports": []}]}}}}),
    ];
    let mut no_status = full.clone();
    no_status.as_object_mut().unwrap().remove("status");
    out.push(no_status);
    let mut bare_template = full;
    bare_template["spec"]["template"] = json!({"spec": {"containers": [{"name": "only"}]}});
    out.push(bare_template);
    out
}

#[test]
fn a_create_owns_what_comparing_against_nothing_finds() {
    let fm = fm();
    for obj in varied_podsets() {
        for sub in [Subresource::Main, Subresource::Status, Subresource::Scale] {
            let mut created = obj.clone();
            fm.update(None, &mut created, "m", sub, T1).unwrap();
            // What comparing the new object against `{}` and taking from every other manager would record.
            let mut managed = Managed::new();
            let id = fm.id("m", Operation::Update, sub);
            let cmp = fm.update_managers(&json!({}), &obj, &mut managed, &id, true, fm.ignored(sub)).unwrap();
            let set = cmp.modified.union(&cmp.added).difference(&fm.strip);
            if !set.is_empty() {
                managed.insert(id, Entry { set, api_version: V.into(), time: Some(T1.into()) });
            }
            let mut expected = obj.clone();
            set_managed_fields(&mut expected, &managed);
            assert_eq!(created, expected, "{obj} through {sub:?}");
        }
    }
    let mut dup = podset(1, json!([{"name": "a"}, {"name": "a"}]));
    assert!(matches!(fm.update(None, &mut dup, "m", Subresource::Main, T1), Err(FieldManagerError::Schema(_))));
}

#[test]
fn a_create_written_out_is_what_update_records() {
    let fm = fm();
    let mut objects = varied_podsets();
    let mut odd = podset(1, main_container("x"));
    odd["metadata"]["annotations"] = json!({"we\"ird\\key\n": "x", "ünï": "y"});
    odd["metadata"]["managedFields"] = Value::Null;
    objects.push(odd);
    objects.push(json!([1, 2]));
    for obj in objects {
        for manager in ["m", "kubectl-client-side-apply", "with \"quotes\" and \\"] {
            let mut general = obj.clone();
            fm.update(None, &mut general, manager, Subresource::Main, T1).unwrap();
            let mut written = obj.clone();
            let raw = fm.created_managed_fields(&mut written, manager, T1).unwrap();
            match raw {
                Some(raw) => {
                    let want = serde_json::to_string(&general["metadata"]["managedFields"]).unwrap();
                    assert_eq!(raw, want, "{obj}");
                    written["metadata"]["managedFields"] = serde_json::from_str(&raw).unwrap();
                }
                None => assert!(general.pointer("/metadata/managedFields").is_none(), "{obj}"),
            }
            assert_eq!(written, general, "{obj}");
        }
    }
    let mut dup = podset(1, json!([{"name": "a"}, {"name": "a"}]));
    let e = fm.created_managed_fields(&mut dup, "m", T1).unwrap_err().to_string();
    assert!(e.contains(".spec.template.spec.containers: ") && e.contains("duplicate entries"), "{e}");
    // A shape that fails the set-based walk fails this one too, even under a field nobody may own through it.
    let mut bad_status = podset(1, main_container("x"));
    bad_status["status"] = json!({"conditions": [{"type": "A"}, {"type": "A"}]});
    assert!(fm.update(None, &mut bad_status.clone(), "m", Subresource::Main, T1).is_err());
    assert!(fm.created_managed_fields(&mut bad_status, "m", T1).is_err());
}

#[test]
fn apply_creates_then_conflicts_then_force_moves_ownership() {
    let fm = fm();
    let created = fm.apply(None, &podset(2, main_container("nginx")), "alice", Subresource::Main, false, T1).unwrap();
    assert_eq!(entries(&created)[0].1, "Apply");
    assert_eq!(
        fields_of(&created, "alice"),
        json!({"f:spec": {"f:replicas": {}, "f:template": {
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
    );
    // The same value from someone else is shared, not a conflict.
    let bob_same = json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web"}, "spec": {"replicas": 2}});
    let shared = fm.apply(Some(&created), &bob_same, "bob", Subresource::Main, false, T2).unwrap();
    assert_eq!(fields_of(&shared, "bob"), json!({"f:spec": {"f:replicas": {}}}));
    assert!(fields_of(&shared, "alice")["f:spec"]["f:replicas"].is_object());
    // A different value is a conflict naming the field and the manager.
    let carol = json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web"}, "spec": {"replicas": 5}});
    let err = fm.apply(Some(&shared), &carol, "carol", Subresource::Main, false, T2).unwrap_err();
    let FieldManagerError::Conflicts(c) = &err else { panic!("{err:?}") };
    let mut got: Vec<(String, String)> = c.iter().map(|c| (c.manager.clone(), c.field.clone())).collect();
    got.sort();
    assert_eq!(got, [("\"alice\"".into(), ".spec.replicas".into()), ("\"bob\"".into(), ".spec.replicas".into())]);
    assert!(err.to_string().starts_with("Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.replicas"));
    // Forced: carol owns it alone; bob, who owned nothing else, is gone.
    let forced = fm.apply(Some(&shared), &carol, "carol", Subresource::Main, true, T2).unwrap();
    assert_eq!(forced["spec"]["replicas"], 5);
    assert_eq!(fields_of(&forced, "carol"), json!({"f:spec": {"f:replicas": {}}}));
    assert!(fields_of(&forced, "alice")["f:spec"].get("f:replicas").is_none());
    assert!(entries(&forced).iter().all(|e| e.0 != "bob"));
}

#[test]
fn an_update_takes_fields_from_appliers_without_conflict() {
    let fm = fm();
    let applied = fm.apply(None, &podset(2, main_container("nginx")), "alice", Subresource::Main, false, T1).unwrap();
    let mut patched = applied.clone();
    patched["spec"]["replicas"] = json!(4);
    fm.update(Some(&applied), &mut patched, "kubectl-patch", Subresource::Main, T2).unwrap();
    assert_eq!(fields_of(&patched, "kubectl-patch"), json!({"f:spec": {"f:replicas": {}}}));
    assert!(fields_of(&patched, "alice")["f:spec"].get("f:replicas").is_none());
    // Nothing changed: no new entry, no new time.
    let mut same = patched.clone();
    fm.update(Some(&patched), &mut same, "someone", Subresource::Main, T2).unwrap();
    assert!(entries(&same).iter().all(|e| e.0 != "someone"));
}

#[test]
fn fields_the_applier_stops_sending_are_removed_unless_someone_else_owns_them() {
    let fm = fm();
    let two = json!([{"name": "main", "image": "nginx"}, {"name": "side", "image": "busybox"}]);
    let mut cfg = podset(2, two);
    cfg["metadata"]["labels"] = json!({"team": "a", "tier": "web"});
    let v1 = fm.apply(None, &cfg, "alice", Subresource::Main, false, T1).unwrap();
    // Bob also sets the tier label to the same value: shared.
    let bob = json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web", "labels": {"tier": "web"}}});
    let v2 = fm.apply(Some(&v1), &bob, "bob", Subresource::Main, false, T1).unwrap();
    // Alice drops the side container and both labels.
    let v3 = fm.apply(Some(&v2), &podset(2, main_container("nginx")), "alice", Subresource::Main, false, T2).unwrap();
    let names: Vec<&str> = v3["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["main"]);
    assert_eq!(v3["metadata"]["labels"], json!({"tier": "web"}));
}

#[test]
fn two_appliers_each_own_their_container() {
    let fm = fm();
    let v1 = fm.apply(None, &podset(1, main_container("nginx")), "alice", Subresource::Main, false, T1).unwrap();
    let side = json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "side", "image": "envoy", "ports": [{"containerPort": 9901}]}]}}}});
    let v2 = fm.apply(Some(&v1), &side, "mesh", Subresource::Main, false, T2).unwrap();
    let containers = v2["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(
        fields_of(&v2, "mesh"),
        json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"side\"}": {".": {}, "f:image": {}, "f:name": {},
            "f:ports": {"k:{\"containerPort\":9901,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}}}}}})
    );
    // Alice re-applies her own config: the mesh's container stays.
    let v3 = fm.apply(Some(&v2), &podset(1, main_container("nginx:2")), "alice", Subresource::Main, false, T2).unwrap();
    assert_eq!(v3["spec"]["template"]["spec"]["containers"].as_array().unwrap().len(), 2);
    assert_eq!(v3["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:2");
}

#[test]
fn status_writes_own_status_only_and_ignore_sent_managed_fields() {
    let fm = fm();
    let live = fm.apply(None, &podset(1, main_container("nginx")), "alice", Subresource::Main, false, T1).unwrap();
    let mut new = live.clone();
    new["status"] = json!({"replicas": 1, "readyReplicas": 0, "availableReplicas": 0, "podNames": ["web-a"]});
    new["metadata"]["managedFields"] = json!([{}]);
    fm.update(Some(&live), &mut new, "podset-controller", Subresource::Status, T2).unwrap();
    let e = entries(&new);
    assert_eq!(e.len(), 2, "{e:?}");
    let ctrl = e.iter().find(|e| e.0 == "podset-controller").unwrap();
    assert_eq!(ctrl.2, "status");
    assert_eq!(
        ctrl.3,
        json!({"f:status": {"f:availableReplicas": {}, "f:podNames": {}, "f:readyReplicas": {}, "f:replicas": {}}})
    );
    // Status in a write to the main resource is not owned by the writer.
    let mut cfg = podset(1, main_container("nginx"));
    cfg["status"] = json!({"replicas": 9});
    let applied = fm.apply(Some(&new), &cfg, "alice", Subresource::Main, false, T2).unwrap();
    assert!(fields_of(&applied, "alice").get("f:status").is_none());
}

#[test]
fn scale_moves_replicas_only() {
    let fm = fm();
    let live = fm.apply(None, &podset(1, main_container("nginx")), "alice", Subresource::Main, false, T1).unwrap();
    let mut new = live.clone();
    new["spec"]["replicas"] = json!(3);
    fm.update(Some(&live), &mut new, "kubectl", Subresource::Scale, T2).unwrap();
    let scale = entries(&new).into_iter().find(|e| e.0 == "kubectl").unwrap();
    assert_eq!((scale.1.as_str(), scale.2.as_str()), ("Update", "scale"));
    assert_eq!(scale.3, json!({"f:spec": {"f:replicas": {}}}));
    assert!(fields_of(&new, "alice")["f:spec"].get("f:replicas").is_none());
}

#[test]
fn managed_fields_sent_in_a_write_replace_reset_or_fall_back() {
    let fm = fm();
    let mut live = podset(1, main_container("nginx"));
    fm.update(None, &mut live, "creator", Subresource::Main, T1).unwrap();
    // [{}] clears; an existing object without tracking stays untracked on update.
    let mut cleared = live.clone();
    cleared["metadata"]["managedFields"] = json!([{}]);
    fm.update(Some(&live), &mut cleared, "x", Subresource::Main, T2).unwrap();
    assert!(cleared["metadata"].get("managedFields").is_none());
    let mut next = cleared.clone();
    next["spec"]["replicas"] = json!(2);
    fm.update(Some(&cleared), &mut next, "x", Subresource::Main, T2).unwrap();
    assert!(next["metadata"].get("managedFields").is_none());
    // Garbage is ignored: the live entries stay.
    let mut garbage = live.clone();
    garbage["metadata"]["managedFields"] = json!([{"manager": "m", "operation": "Bogus"}]);
    fm.update(Some(&live), &mut garbage, "x", Subresource::Main, T2).unwrap();
    assert_eq!(entries(&garbage), entries(&live));
    // Valid entries sent by the client replace the live ones.
    let mut replaced = live.clone();
    replaced["metadata"]["managedFields"] = json!([{"manager": "other", "operation": "Update", "apiVersion": V,
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]);
    fm.update(Some(&live), &mut replaced, "x", Subresource::Main, T2).unwrap();
    assert_eq!(entries(&replaced).iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["other"]);
}

#[test]
fn first_apply_on_an_untracked_object_attributes_its_fields() {
    let fm = fm();
    let mut live = podset(1, main_container("nginx"));
    live["metadata"]["uid"] = json!("u");
    let applied = fm
        .apply(
            Some(&live),
            &json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web"}, "spec": {"replicas": 3}}),
            "alice",
            Subresource::Main,
            false,
            T2,
        )
        .unwrap_err();
    let FieldManagerError::Conflicts(c) = applied else { panic!() };
    assert_eq!(c, [Conflict { manager: format!("\"before-first-apply\" using {V}"), field: ".spec.replicas".into() }]);
}

#[test]
fn kubectl_takes_over_fields_of_its_client_side_apply() {
    let fm = fm();
    let mut cfg = podset(2, main_container("nginx"));
    let mut live = cfg.clone();
    live["metadata"]["annotations"] = json!({LAST_APPLIED: serde_json::to_string(&cfg).unwrap()});
    fm.update(None, &mut live, "kubectl-client-side-apply", Subresource::Main, T1).unwrap();
    cfg["spec"]["replicas"] = json!(3);
    // Someone else may not; kubectl may, and keeps the annotation in step.
    assert!(matches!(
        fm.apply(Some(&live), &cfg, "other", Subresource::Main, false, T2),
        Err(FieldManagerError::Conflicts(_))
    ));
    let taken = fm.apply(Some(&live), &cfg, "kubectl", Subresource::Main, false, T2).unwrap();
    assert_eq!(taken["spec"]["replicas"], 3);
    let last: Value = serde_json::from_str(taken["metadata"]["annotations"][LAST_APPLIED].as_str().unwrap()).unwrap();
    assert_eq!(last["spec"]["replicas"], 3);
    assert!(fields_of(&taken, "kubectl-client-side-apply")["f:spec"].get("f:replicas").is_none());
    // A field the client-side apply set to another value than live is not taken over.
    let mut drifted = live.clone();
    drifted["spec"]["template"]["spec"]["containers"][0]["image"] = json!("drift");
    let mut cfg2 = cfg.clone();
    cfg2["spec"]["template"]["spec"]["containers"][0]["image"] = json!("mine");
    fm.update(Some(&live), &mut drifted, "kubectl-edit", Subresource::Main, T2).unwrap();
    assert!(matches!(
        fm.apply(Some(&drifted), &cfg2, "kubectl", Subresource::Main, false, T2),
        Err(FieldManagerError::Conflicts(_))
    ));
}

#[test]
fn more_than_ten_updaters_fold_into_ancient_changes() {
    let fm = fm();
    let mut obj = podset(0, main_container("nginx"));
    fm.update(None, &mut obj, "m00", Subresource::Main, "2026-01-01T00:00:00Z").unwrap();
    for i in 1..=11 {
        let mut next = obj.clone();
        next["metadata"]["annotations"] = json!({format!("a{i}"): "x"});
        let mut ann = next["metadata"]["annotations"].as_object().unwrap().clone();
        if let Some(prev) = obj["metadata"]["annotations"].as_object() {
            ann.extend(prev.clone());
        }
        next["metadata"]["annotations"] = Value::Object(ann);
        fm.update(Some(&obj), &mut next, &format!("m{i:02}"), Subresource::Main, &format!("2026-01-01T00:00:{i:02}Z"))
            .unwrap();
        obj = next;
    }
    let e = entries(&obj);
    assert_eq!(e.len(), 10, "{e:?}");
    assert_eq!(e[0].0, "ancient-changes");
    assert!(e[0].3["f:spec"]["f:replicas"].is_object(), "the oldest updater's fields are kept");
}

#[test]
fn bad_apply_requests_are_refused() {
    let fm = fm();
    let no_version = json!({"kind": "PodSet", "metadata": {"name": "web"}});
    assert!(matches!(
        fm.apply(None, &no_version, "a", Subresource::Main, false, T1),
        Err(FieldManagerError::BadRequest(_))
    ));
    let with_mf = json!({"apiVersion": V, "kind": "PodSet", "metadata": {"name": "web", "managedFields": []}});
    let err = fm.apply(None, &with_mf, "a", Subresource::Main, false, T1).unwrap_err();
    assert_eq!(err.to_string(), "metadata.managedFields must be nil");
    let dup = podset(1, json!([{"name": "a"}, {"name": "a"}]));
    assert!(matches!(fm.apply(None, &dup, "a", Subresource::Main, false, T1), Err(FieldManagerError::Schema(_))));
}
