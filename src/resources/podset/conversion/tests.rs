use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{PodSetSpec, PodSetStatus};

/// Annotation values, the reserved key's most of all: canonical numbers, 0, negatives, leading zeros, signs, text.
fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..i32::MAX).prop_map(|n| n.to_string()),
        (i32::MIN..=0).prop_map(|n| n.to_string()),
        (0..1000i32).prop_map(|n| format!("0{n}")),
        (0..1000i32).prop_map(|n| format!("+{n}")),
        Just(String::new()),
        "[a-z0-9 .-]{0,12}",
        Just("99999999999".to_owned()),
    ]
}

fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let key = prop_oneof![Just(MIN_READY_SECONDS.to_owned()), "[a-z]{1,8}(/[a-z]{1,8})?"];
    proptest::option::of(proptest::collection::btree_map(key, annotation_value(), 1..4))
}

fn labels() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    proptest::option::of(proptest::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 0..3))
}

fn spec() -> impl Strategy<Value = PodSetSpec> {
    (proptest::option::of(-2..100i32), labels(), labels(), any::<bool>()).prop_map(
        |(replicas, selector, template_labels, has_template)| PodSetSpec {
            replicas,
            selector: selector.map(|m| LabelSelector { match_labels: Some(m), match_expressions: None }),
            template: has_template.then(|| PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: template_labels, ..Default::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some("busybox".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            min_ready_seconds: 0,
        },
    )
}

fn status() -> impl Strategy<Value = Option<PodSetStatus>> {
    proptest::option::of((0..10i32, 0..10i32, proptest::option::of(0..20i64)).prop_map(|(r, ready, g)| PodSetStatus {
        replicas: r,
        ready_replicas: ready,
        available_replicas: ready,
        observed_generation: g,
        ..Default::default()
    }))
}

/// A PodSet as a `v1alpha1` client may send or read it: any annotations, no `spec.minReadySeconds`.
fn v1alpha1() -> impl Strategy<Value = PodSet> {
    ("[a-z][a-z0-9-]{0,10}", annotations(), labels(), spec(), status()).prop_map(
        |(name, annotations, labels, spec, status)| PodSet {
            api_version: Version::V1alpha1.api_version().into(),
            kind: "PodSet".into(),
            metadata: ObjectMeta { name: Some(name), annotations, labels, ..Default::default() },
            spec,
            status,
        },
    )
}

/// A PodSet as `v1beta1` holds it once validated: any `spec.minReadySeconds` of 0 or more, and never the
/// annotation that carries it for `v1alpha1`.
fn v1beta1() -> impl Strategy<Value = PodSet> {
    (v1alpha1(), 0..i32::MAX).prop_map(|(mut ps, seconds)| {
        if let Some(a) = ps.metadata.annotations.as_mut() {
            a.remove(MIN_READY_SECONDS);
            if a.is_empty() {
                ps.metadata.annotations = None;
            }
        }
        ps.spec.min_ready_seconds = seconds;
        ps.api_version = Version::V1beta1.api_version().into();
        ps
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn every_v1alpha1_object_converts_to_v1beta1_and_back_unchanged(original in v1alpha1()) {
        let mut ps = original.clone();
        convert(&mut ps, Version::V1alpha1, Version::V1beta1);
        prop_assert_eq!(&ps.api_version, Version::V1beta1.api_version());
        // Through JSON too, as storage and clients carry it.
        let mut ps: PodSet = serde_json::from_slice(&serde_json::to_vec(&ps).unwrap()).unwrap();
        convert(&mut ps, Version::V1beta1, Version::V1alpha1);
        let wire = serde_json::to_value(&ps).unwrap();
        prop_assert!(wire["spec"].get("minReadySeconds").is_none(), "v1alpha1 has no spec.minReadySeconds: {}", wire);
        prop_assert_eq!(ps, original);
    }

    #[test]
    fn every_valid_v1beta1_object_converts_to_v1alpha1_and_back_unchanged(original in v1beta1()) {
        let mut ps = original.clone();
        convert(&mut ps, Version::V1beta1, Version::V1alpha1);
        let mut ps: PodSet = serde_json::from_slice(&serde_json::to_vec(&ps).unwrap()).unwrap();
        convert(&mut ps, Version::V1alpha1, Version::V1beta1);
        prop_assert_eq!(ps, original);
    }

    #[test]
    fn json_and_struct_conversions_agree(alpha in v1alpha1(), beta in v1beta1()) {
        for (original, from, to) in [(alpha, Version::V1alpha1, Version::V1beta1), (beta, Version::V1beta1, Version::V1alpha1)] {
            let mut by_struct = original.clone();
            convert(&mut by_struct, from, to);
            let mut by_json = serde_json::to_value(&original).unwrap();
            convert_value(&mut by_json, from, to);
            prop_assert_eq!(serde_json::to_value(&by_struct).unwrap(), by_json);
        }
    }

    #[test]
    fn converting_to_its_own_version_changes_nothing(alpha in v1alpha1(), beta in v1beta1()) {
        for (original, v) in [(alpha, Version::V1alpha1), (beta, Version::V1beta1)] {
            let mut ps = original.clone();
            convert(&mut ps, v, v);
            prop_assert_eq!(ps, original);
        }
    }
}

#[test]
fn the_annotation_carries_min_ready_seconds_for_v1alpha1() {
    let mut ps: PodSet = serde_json::from_value(json!({
        "apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
        "metadata": {"name": "web"}, "spec": {"minReadySeconds": 30}
    }))
    .unwrap();
    convert(&mut ps, Version::V1beta1, Version::V1alpha1);
    let v = serde_json::to_value(&ps).unwrap();
    assert_eq!(v["apiVersion"], "demo.k8s.io/v1alpha1");
    assert_eq!(v["metadata"]["annotations"][MIN_READY_SECONDS], "30");
    assert_eq!(v["spec"].get("minReadySeconds"), None);
    // Values that are not a canonical number above 0 stay annotations (validation refuses them).
    for kept in ["0", "-3", "030", "+3", "x", ""] {
        let mut ps = PodSet::default();
        ps.metadata.annotations = Some([(MIN_READY_SECONDS.to_owned(), kept.to_owned())].into());
        to_hub(&mut ps, Version::V1alpha1);
        assert_eq!(ps.spec.min_ready_seconds, 0, "{kept:?}");
        assert_eq!(ps.metadata.annotations.unwrap()[MIN_READY_SECONDS], kept);
    }
}

#[test]
fn field_sets_name_min_ready_seconds_where_each_version_keeps_it() {
    let beta =
        json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:minReadySeconds": {}, "f:replicas": {}}});
    let alpha = json!({"f:metadata": {"f:labels": {"f:app": {}}, "f:annotations": {format!("f:{MIN_READY_SECONDS}"): {}}},
                       "f:spec": {"f:replicas": {}}});
    let mut f = beta.clone();
    convert_fields(&mut f, Version::V1beta1, Version::V1alpha1);
    assert_eq!(f, alpha);
    convert_fields(&mut f, Version::V1alpha1, Version::V1beta1);
    assert_eq!(f, beta);
    // Parents owned for nothing else go with it.
    let mut f = json!({"f:spec": {"f:minReadySeconds": {}}});
    convert_fields(&mut f, Version::V1beta1, Version::V1alpha1);
    assert_eq!(f, json!({"f:metadata": {"f:annotations": {format!("f:{MIN_READY_SECONDS}"): {}}}}));
    convert_fields(&mut f, Version::V1alpha1, Version::V1beta1);
    assert_eq!(f, json!({"f:spec": {"f:minReadySeconds": {}}}));
    // A parent owned itself stays owned: `{".": {}}` beside children, `{}` without (found on a store an older
    // release wrote: the annotations' own entry lost on a round trip).
    let annotation = format!("f:{MIN_READY_SECONDS}");
    let alpha = json!({"f:metadata": {"f:annotations": {".": {}, annotation.clone(): {}}}});
    let beta = json!({"f:metadata": {"f:annotations": {}}, "f:spec": {"f:minReadySeconds": {}}});
    let mut f = alpha.clone();
    convert_fields(&mut f, Version::V1alpha1, Version::V1beta1);
    assert_eq!(f, beta);
    convert_fields(&mut f, Version::V1beta1, Version::V1alpha1);
    assert_eq!(f, alpha);
}
