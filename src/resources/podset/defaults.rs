//! Defaulting, applied to every PodSet written through the API before validation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::{PodSet, Version, DEFAULT_LABEL};

/// The Pod a PodSet runs when it names none: busybox sleeping for an hour.
pub fn default_pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "busybox".into(),
            image: Some("busybox".into()),
            command: Some(vec!["sleep".into(), "3600".into()]),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Fills `spec.replicas` (1), `spec.template` (busybox, labelled) and, in `v1alpha1` only, `spec.selector` (the
/// template's labels): `v1beta1` requires a selector, as `apps/v1` does.
pub fn default_podset(ps: &mut PodSet, version: Version) {
    let name = ps.metadata.name.clone().unwrap_or_default();
    let spec = &mut ps.spec;
    spec.replicas.get_or_insert(1);
    let template = spec.template.get_or_insert_with(PodTemplateSpec::default);
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    if labels.is_empty() {
        match spec.selector.as_ref().and_then(|s| s.match_labels.as_ref()).filter(|m| !m.is_empty()) {
            Some(wanted) => labels.extend(wanted.clone()),
            None => {
                labels.insert(DEFAULT_LABEL.to_owned(), name);
            }
        }
    }
    let labels = labels.clone();
    template.spec.get_or_insert_with(default_pod_spec);
    if version == Version::V1alpha1 {
        spec.selector.get_or_insert(LabelSelector { match_labels: Some(labels), match_expressions: None });
    }
}
