use super::*;
use serde_json::json;

/// A small schema in the shape of a Deployment: a struct, a keyed list, a set, an atomic list, a map, an
/// atomic struct.
fn schema() -> Schema {
    let defs = json!({
        "Obj": {"type": "object", "properties": {
            "metadata": {"$ref": "#/components/schemas/Meta"},
            "spec": {"$ref": "#/components/schemas/Spec"},
            "status": {"type": "object", "properties": {"n": {"type": "integer"}}}
        }},
        "Meta": {"type": "object", "properties": {
            "name": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}
        }},
        "Spec": {"type": "object", "properties": {
            "replicas": {"type": "integer"},
            "selector": {"type": "object", "properties": {"matchLabels": {"type": "object",
                "additionalProperties": {"type": "string"}}}, "x-kubernetes-map-type": "atomic"},
            "containers": {"type": "array", "items": {"$ref": "#/components/schemas/C"},
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
            "strategy": {"type": "object", "properties": {"max": {"type": "integer"}, "min": {"type": "integer"}}}
        }},
        "C": {"type": "object", "properties": {
            "name": {"type": "string"}, "image": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
            "ports": {"type": "array", "items": {"$ref": "#/components/schemas/P"},
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["containerPort", "protocol"]}
        }},
        "P": {"type": "object", "properties": {"containerPort": {"type": "integer"}, "protocol": {"type": "string"}}}
    });
    Schema::from_openapi(defs.as_object().unwrap(), "Obj")
}

fn fields(s: &Set) -> Value {
    s.to_fields_v1()
}

#[test]
fn field_set_names_leaves_list_items_and_map_entries() {
    let s = schema();
    let obj = json!({
        "metadata": {"labels": {"app": "web"}, "finalizers": ["a"]},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "containers": [{"name": "main", "image": "x", "args": ["a"], "ports": [{"containerPort": 80}]}],
                 "strategy": {}}
    });
    let set = to_field_set(&s, &obj).unwrap();
    assert_eq!(
        fields(&set),
        json!({
            "f:metadata": {"f:labels": {"f:app": {}}, "f:finalizers": {"v:\"a\"": {}}},
            "f:spec": {
                "f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:args": {}, "f:image": {}, "f:name": {},
                    "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}},
                "f:replicas": {}, "f:selector": {}
            }
        })
    );
}

#[test]
fn compare_reports_added_modified_removed_with_new_nodes() {
    let s = schema();
    let a = json!({"spec": {"replicas": 1, "containers": [{"name": "main", "image": "x"}]}});
    let b = json!({"metadata": {"labels": {"app": "w"}}, "spec": {"replicas": 2, "strategy": {"max": 1},
                    "containers": [{"name": "main", "image": "x"}, {"name": "side", "image": "y"}]}});
    let c = compare(&s, &a, &b).unwrap();
    assert_eq!(fields(&c.modified), json!({"f:spec": {"f:replicas": {}}}));
    assert_eq!(
        fields(&c.added),
        json!({"f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}}, "f:spec": {
            "f:containers": {"k:{\"name\":\"side\"}": {".": {}, "f:image": {}, "f:name": {}}},
            "f:strategy": {".": {}, "f:max": {}}}})
    );
    let back = compare(&s, &b, &a).unwrap();
    assert_eq!(fields(&back.removed), fields(&c.added));
}

#[test]
fn created_set_is_what_compare_from_nothing_adds_or_modifies() {
    let s = schema();
    let objects = [
        json!({}),
        json!({"metadata": {"name": "a", "labels": {"app": "web", "tier": ""}, "finalizers": ["x", "y"]},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "strategy": {"max": 1},
                        "containers": [{"name": "main", "image": "x", "args": ["a", "b"],
                                        "ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}]},
                                       {"name": "side"}]},
               "status": {"n": 1}, "extra": {"deep": {"er": [1, {"x": null}]}}}),
        // Empty and null values, next to and instead of the skeleton's.
        json!({"metadata": {}, "spec": {"strategy": {}, "containers": [], "replicas": null, "selector": {}},
               "status": null}),
        json!({"metadata": {"labels": {}}, "spec": {"strategy": null, "containers": [{"name": "a", "args": []}]}}),
        // Values of the wrong shape for their type.
        json!({"metadata": "x", "spec": {"containers": "nope", "strategy": 3, "replicas": {"x": 1}}}),
        json!({"spec": {"containers": [{"name": "a", "ports": 5}], "strategy": ["a"]}, "status": []}),
    ];
    let skeletons = [
        None,
        Some(json!({"metadata": {}, "spec": {"strategy": {}, "containers": null}, "status": {}})),
        Some(json!({"spec": {"strategy": {"max": 1}, "replicas": 2}})),
        Some(json!({"spec": {"containers": [{"name": "main", "image": "x"}]}, "metadata": {"labels": {"app": "web"}}})),
    ];
    for obj in &objects {
        for skel in &skeletons {
            let cmp = compare_with_skeleton(&s, &json!({}), obj, skel.as_ref()).unwrap();
            let created = created_set(&s, obj, skel.as_ref()).unwrap();
            assert_eq!(fields(&created), fields(&cmp.added.union(&cmp.modified)), "{obj} on {skel:?}");
            assert_eq!(created, cmp.added.union(&cmp.modified), "{obj} on {skel:?}");
        }
    }
    let dup = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    assert!(created_set(&s, &dup, None).unwrap_err().message.contains("duplicate entries"));
    let keyless = json!({"spec": {"containers": [{"image": "a"}]}});
    assert!(created_set(&s, &keyless, None).unwrap_err().message.contains("omits key field \"name\""));
}

#[test]
fn merge_applies_config_over_live_by_list_kind() {
    let s = schema();
    let live = json!({"spec": {"replicas": 1, "selector": {"matchLabels": {"a": "1", "b": "2"}},
        "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "y"}]},
        "metadata": {"labels": {"keep": "1"}, "finalizers": ["f1"]}});
    let config = json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "1"}},
        "containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]},
        "metadata": {"labels": {"new": "2"}, "finalizers": ["f2"]}});
    let merged = merge(&s, &live, &config).unwrap();
    assert_eq!(
        merged,
        json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "1"}},
            "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "z"},
                           {"name": "c", "image": "w"}]},
            "metadata": {"labels": {"keep": "1", "new": "2"}, "finalizers": ["f1", "f2"]}})
    );
}

#[test]
fn removal_drops_subtrees_and_emptied_maps() {
    let s = schema();
    let obj = json!({"metadata": {"labels": {"app": "w"}}, "spec": {"replicas": 2,
        "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
    let mut set = Set::new();
    set.insert(&[
        PathElement::Field("metadata".into()),
        PathElement::Field("labels".into()),
        PathElement::Field("app".into()),
    ]);
    set.insert(&[
        PathElement::Field("spec".into()),
        PathElement::Field("containers".into()),
        PathElement::Key(vec![("name".into(), json!("b"))]),
    ]);
    let out = remove_items(&s, &obj, &set);
    // The labels map emptied, and the metadata with it.
    assert_eq!(out, json!({"spec": {"replicas": 2, "containers": [{"name": "a", "image": "x"}]}}));
    let ensured = ensure_named_fields_are_members(&s, &set);
    assert!(ensured.has(&[PathElement::Field("metadata".into())]));
    assert!(ensured.has(&[PathElement::Field("metadata".into()), PathElement::Field("labels".into())]));
    // `containers` is a struct field above a member, so it becomes one; list items do not add their list.
    assert!(ensured.has(&[PathElement::Field("spec".into()), PathElement::Field("containers".into())]));
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let s = schema();
    let dup = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    assert!(to_field_set(&s, &dup).unwrap_err().message.contains("duplicate entries"));
    let keyless = json!({"spec": {"containers": [{"image": "a"}]}});
    assert!(to_field_set(&s, &keyless).unwrap_err().message.contains("omits key field \"name\""));
    let wrong = json!({"spec": {"containers": "nope", "replicas": {"x": 1}}});
    assert!(to_field_set(&s, &wrong).is_ok());
    // A live list may repeat a key (structured-merge-diff's merge allows it on its left side); a configuration may not.
    assert_eq!(merge(&s, &dup, &json!({})).unwrap(), dup);
    assert!(merge(&s, &json!({}), &dup).is_err());
    let mut unknown = json!({"spec": {"bogus": 1, "containers": [{"name": "a", "nope": true}]}});
    assert_eq!(prune_unknown(&s, &mut unknown), [".spec.bogus", ".spec.containers[0].nope"]);
    assert_eq!(unknown, json!({"spec": {"containers": [{"name": "a"}]}}));
}

#[test]
fn a_key_the_live_list_repeats_stays_until_the_config_sets_it() {
    let s = schema();
    let live =
        json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}, {"name": "a", "image": "2"}]}});
    let mut untouched = live.clone();
    untouched["spec"]["replicas"] = json!(1);
    assert_eq!(merge(&s, &live, &json!({"spec": {"replicas": 1}})).unwrap(), untouched);
    // Set by the configuration, the repeats become its one item, where the first of them was.
    let merged = merge(&s, &live, &json!({"spec": {"containers": [{"name": "a", "image": "3"}]}})).unwrap();
    assert_eq!(merged, json!({"spec": {"containers": [{"name": "a", "image": "3"}, {"name": "b"}]}}));
}

#[test]
fn validation_names_undeclared_fields_and_wrong_shapes_as_structured_merge_diff_does() {
    let s = schema();
    let fine = json!({"metadata": {"labels": {"a": "b"}, "finalizers": ["x"]}, "status": null,
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "containers": [{"name": "a", "ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}]}]}});
    assert_eq!(validate(&s, &fine), Ok(()));
    let e = |v: Value| validate(&s, &v).unwrap_err().to_string();
    assert_eq!(e(json!({"spec": {"replicasx": 1}})), ".spec.replicasx: field not declared in schema");
    assert_eq!(
        e(json!({"spec": {"containers": [{"name": "a", "nope": 1}]}})),
        r#".spec.containers[name="a"].nope: field not declared in schema"#
    );
    assert_eq!(
        e(json!({"spec": {"containers": {"name": "a"}}})),
        r#".spec.containers: expected list, got {"name":"a"}"#
    );
    assert_eq!(e(json!({"spec": {"strategy": [1]}})), ".spec.strategy: expected map, got [1]");
    assert_eq!(e(json!({"spec": {"replicas": {"x": 1}}})), r#".spec.replicas: expected scalar, got {"x":1}"#);
    assert_eq!(e(json!([])), "expected map, got []");
    assert_eq!(
        e(json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}})),
        r#".spec.containers: duplicate entries for key [name="a"]"#
    );
    assert!(e(json!({"spec": {"containers": [{"image": "a"}]}})).contains("omits key field \"name\""));
    // Several at once, one a line; a map's first undeclared field ends the walk of that map.
    assert_eq!(
        e(json!({"metadata": {"bogus": 1, "zzz": 2}, "spec": {"other": 1}})),
        "errors:\n  .metadata.bogus: field not declared in schema\n  .spec.other: field not declared in schema"
    );
    // The schema has no scalar kinds: a string where an integer goes is for the typed decode to refuse.
    assert_eq!(validate(&s, &json!({"spec": {"replicas": "three"}})), Ok(()));
}

#[test]
fn atomics_are_found_by_the_schema_and_printed_as_kube_prints_them() {
    let s = schema();
    let patch = json!({"metadata": {"labels": {"a": "b"}, "finalizers": ["x"]}, "bogus": [1],
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "strategy": {"max": 1},
                 "containers": [{"name": "a", "ports": [{"containerPort": 80}]}, {"name": "b", "args": ["x"]}]}});
    // Items by index, whatever the list's kind; undeclared fields are not walked.
    assert_eq!(find_atomics(&s, &patch), [".spec.containers[1].args", ".spec.selector"]);
    let granular = json!({"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "a", "image": "i"}]}});
    assert!(find_atomics(&s, &granular).is_empty());
    // Without a schema, a map is walked no further and a list is atomic with all it holds.
    let defs = json!({"T": {"type": "object", "properties": {"raw": {"type": "object"}}}});
    let untyped = Schema::from_openapi(defs.as_object().unwrap(), "T");
    assert!(find_atomics(&untyped, &json!({"raw": {"x": [1, {"y": [2]}]}})).is_empty());
    assert_eq!(find_atomics(&untyped, &json!({"raw": [{"a": [1]}, [2]]})), [".raw", ".raw[0]", ".raw[1]"]);
}

#[test]
fn merge_in_place_is_the_merge_for_a_valid_configuration() {
    let s = schema();
    let lives = [
        json!({"spec": {"replicas": 1, "selector": {"matchLabels": {"a": "1", "b": "2"}},
            "containers": [{"name": "a", "image": "x", "args": ["1", "2"], "ports": [{"containerPort": 80}]},
                           {"name": "b", "image": "y"}]},
            "metadata": {"labels": {"keep": "1"}, "finalizers": ["f1"]}, "status": {"n": 1}}),
        json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}, {"name": "a", "image": "2"}]}}),
        json!({"metadata": null, "spec": {"containers": [], "strategy": {}}, "extra": {"x": [1, {"y": 2}]}}),
        json!({"spec": {"replicas": "one", "strategy": 3}}),
        json!({}),
    ];
    let configs = [
        json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "1"}},
            "containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]},
            "metadata": {"labels": {"new": "2"}, "finalizers": ["f2"]}}),
        json!({"spec": {"containers": [{"name": "a", "image": "3", "ports": [{"containerPort": 80, "protocol": "UDP"}]}]}}),
        json!({"metadata": {"labels": {"keep": "2"}}, "spec": {"strategy": {"max": 1}}}),
        json!({"metadata": null, "spec": {"containers": null, "strategy": {}}, "status": {}}),
        json!({"spec": {"containers": [], "replicas": null}, "extra": {"x": {"z": 1}, "w": []}}),
        json!({"metadata": {"finalizers": ["f1", "f3"], "labels": {}}, "spec": {"strategy": {"min": 2}}}),
        json!({}),
    ];
    // Every pair merges (a configuration setting a key the live list repeats included), and the same way.
    for live in &lives {
        for config in &configs {
            let merged = merge(&s, live, config).unwrap();
            let mut in_place = live.clone();
            merge_into(&s, &mut in_place, config).unwrap();
            assert_eq!(in_place, merged, "{config} into {live}");
        }
    }
    // What the configuration leaves alone is not walked: a repeated key there stays, as the merge keeps it.
    let mut dup = lives[1].clone();
    merge_into(&s, &mut dup, &json!({"spec": {"replicas": 2}})).unwrap();
    assert_eq!(dup["spec"]["containers"], lives[1]["spec"]["containers"]);
    // A keyed list the configuration sets is merged, and checked, as the merge does.
    let keyless = json!({"spec": {"containers": [{"image": "a"}]}});
    assert!(merge_into(&s, &mut lives[0].clone(), &keyless).is_err());
}
