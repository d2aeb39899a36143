//! PodSet's validation, as kube-apiserver validates a ReplicaSet: the rules of each version, and what an update may
//! change.

use super::conversion::MIN_READY_SECONDS;
use super::{PodSet, PodSetStatus};
use crate::api::selector::Selector;
use crate::api::validation::*;

fn validate_status(status: &PodSetStatus) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (field, v) in [
        ("status.replicas", status.replicas),
        ("status.readyReplicas", status.ready_replicas),
        ("status.availableReplicas", status.available_replicas),
        ("status.fullyLabeledReplicas", status.fully_labeled_replicas),
        ("status.terminatingReplicas", status.terminating_replicas.unwrap_or_default()),
    ] {
        if v < 0 {
            errs.push(FieldError::invalid(field, v, "must be greater than or equal to 0"));
        }
    }
    if let Some(g) = status.observed_generation.filter(|g| *g < 0) {
        errs.push(FieldError::invalid("status.observedGeneration", g, "must be greater than or equal to 0"));
    }
    errs
}

/// Validates a defaulted PodSet for create (and the new object of an update).
pub fn validate(ps: &PodSet) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&ps.metadata);
    let spec = &ps.spec;
    if let Some(r) = spec.replicas.filter(|r| *r < 0) {
        errs.push(FieldError::invalid("spec.replicas", r, "must be greater than or equal to 0"));
    }
    if spec.min_ready_seconds < 0 {
        errs.push(FieldError::invalid(
            "spec.minReadySeconds",
            spec.min_ready_seconds,
            "must be greater than or equal to 0",
        ));
    }
    // Conversion from v1alpha1 took every value it could carry; what is left was never one. Beside
    // spec.minReadySeconds it is a problem of its own: v1alpha1 would have to drop one of the two.
    let annotation = ps.metadata.annotations.as_ref().and_then(|a| a.get(MIN_READY_SECONDS));
    if let Some(v) = annotation.filter(|_| spec.min_ready_seconds > 0) {
        errs.push(FieldError::invalid(
            format!("metadata.annotations[{MIN_READY_SECONDS}]"),
            v,
            "must be removed before spec.minReadySeconds is set: v1alpha1 carries spec.minReadySeconds in this \
             annotation, so it could not keep both",
        ));
    } else if let Some(v) = annotation {
        errs.push(FieldError::invalid(
            format!("metadata.annotations[{MIN_READY_SECONDS}]"),
            v,
            "carries spec.minReadySeconds for v1alpha1 clients: a whole number of seconds above 0, written through \
             v1alpha1 only (v1beta1 has spec.minReadySeconds)",
        ));
    }
    let selector = match &spec.selector {
        None => {
            errs.push(FieldError::required("spec.selector", ""));
            None
        }
        Some(ls)
            if ls.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && ls.match_expressions.as_ref().is_none_or(|m| m.is_empty()) =>
        {
            errs.push(FieldError::invalid("spec.selector", "{}", "empty selector is invalid for a PodSet"));
            None
        }
        Some(ls) => match Selector::from_label_selector(ls) {
            Ok(s) => Some(s),
            Err(e) => {
                errs.push(FieldError::invalid("spec.selector", Selector::default().to_string(), e));
                None
            }
        },
    };
    match &spec.template {
        None => errs.push(FieldError::required("spec.template", "")),
        Some(t) => {
            let labels = t.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
            errs.extend(validate_labels(&labels, "spec.template.metadata.labels"));
            if let Some(sel) = &selector {
                if !sel.matches(&labels) {
                    errs.push(FieldError::invalid(
                        "spec.template.metadata.labels",
                        &labels,
                        "`selector` does not match template `labels`",
                    ));
                }
            }
            let containers = t.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
            if containers.is_empty() {
                errs.push(FieldError::required("spec.template.spec.containers", ""));
            }
            for (i, c) in containers.iter().enumerate() {
                for e in dns1123_label_errors(&c.name) {
                    errs.push(FieldError::invalid(format!("spec.template.spec.containers[{i}].name"), &c.name, e));
                }
            }
        }
    }
    if let Some(status) = &ps.status {
        errs.extend(validate_status(status));
    }
    errs
}

/// Validates an update of the whole object: everything `validate` checks, plus immutable fields. A problem the stored
/// object already has, left as it is, does not refuse the update (ratcheting, as kube-apiserver does for CRDs): it
/// was stored under older rules (a v1alpha1-only build kept annotations v1beta1 reads as minReadySeconds), and it
/// stays writable, and migratable, until someone changes that field.
pub fn validate_update(new: &PodSet, old: &PodSet) -> Vec<FieldError> {
    let mut errs = validate(new);
    if !errs.is_empty() {
        let had = validate(old);
        errs.retain(|e| !had.contains(e));
    }
    if new.spec.selector != old.spec.selector {
        errs.push(FieldError::invalid(
            "spec.selector",
            new.selector().map(|s| s.to_string()).unwrap_or_default(),
            "field is immutable",
        ));
    }
    errs
}

/// Validates a status update: only the status can be wrong there.
pub fn validate_status_update(new: &PodSet) -> Vec<FieldError> {
    new.status.as_ref().map(validate_status).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::defaults::default_podset;
    use super::super::Version;
    use super::*;

    fn podset(v: serde_json::Value) -> PodSet {
        let mut ps: PodSet = serde_json::from_value(v).unwrap();
        default_podset(&mut ps, Version::V1alpha1);
        ps
    }

    #[test]
    fn v1beta1_requires_a_selector_and_min_ready_seconds_of_0_or_more() {
        let mut ps: PodSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "annotations": {MIN_READY_SECONDS: "05"}},
            "spec": {"minReadySeconds": -1}
        }))
        .unwrap();
        default_podset(&mut ps, Version::V1beta1);
        let errs: Vec<String> = validate(&ps).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            [
                "spec.minReadySeconds: Invalid value: -1: must be greater than or equal to 0".to_owned(),
                format!(
                    "metadata.annotations[{MIN_READY_SECONDS}]: Invalid value: \"05\": carries spec.minReadySeconds \
                     for v1alpha1 clients: a whole number of seconds above 0, written through v1alpha1 only (v1beta1 \
                     has spec.minReadySeconds)"
                ),
                "spec.selector: Required value".to_owned(),
            ]
        );
    }

    #[test]
    fn defaulted_minimal_podset_is_valid() {
        let ps = podset(serde_json::json!({"metadata": {"name": "web", "namespace": "default"}}));
        assert_eq!(validate(&ps), vec![]);
    }

    #[test]
    fn reports_each_problem_as_kube_apiserver_words_it() {
        let ps = podset(serde_json::json!({
            "metadata": {"name": "Web_1", "labels": {"bad key!": "x"}},
            "spec": {
                "replicas": -1,
                "selector": {"matchLabels": {"app": "other"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
            }
        }));
        let errs: Vec<String> = validate(&ps).iter().map(|e| e.to_string()).collect();
        assert!(errs.iter().any(|e| e.starts_with("metadata.name: Invalid value: \"Web_1\": a lowercase RFC 1123")));
        assert!(errs.iter().any(|e| e == "spec.replicas: Invalid value: -1: must be greater than or equal to 0"));
        assert!(errs.iter().any(|e| e.starts_with("spec.template.metadata.labels: Invalid value")
            && e.ends_with("`selector` does not match template `labels`")));
        assert!(errs.iter().any(|e| e.starts_with("metadata.labels: Invalid value: \"bad key!\"")));
        assert_eq!(errs.len(), 4, "{errs:#?}");
    }

    // Mirrors ValidateReplicaSetStatus's non-negative counts.
    #[test]
    fn status_counts_are_not_negative() {
        let ps = podset(serde_json::json!({"metadata": {"name": "web"}, "status": {"replicas": 1,
            "fullyLabeledReplicas": -1, "terminatingReplicas": -2, "readyReplicas": 0}}));
        let errs: Vec<String> = validate_status_update(&ps).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            [
                "status.fullyLabeledReplicas: Invalid value: -1: must be greater than or equal to 0",
                "status.terminatingReplicas: Invalid value: -2: must be greater than or equal to 0"
            ]
        );
    }

    #[test]
    fn an_update_is_refused_only_for_problems_it_makes() {
        let old = podset(serde_json::json!({"metadata": {"name": "web", "annotations": {MIN_READY_SECONDS: "soon"}}}));
        assert_eq!(validate(&old).len(), 1, "stored by a build that knew no such annotation");
        let mut new = old.clone();
        new.spec.replicas = Some(3);
        assert_eq!(validate_update(&new, &old), vec![], "left as it was");
        let mut changed = new.clone();
        changed.metadata.annotations.as_mut().unwrap().insert(MIN_READY_SECONDS.into(), "later".into());
        let errs = validate_update(&changed, &old);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].value.as_deref(), Some("\"later\""));
        new.spec.replicas = Some(-1);
        assert_eq!(validate_update(&new, &old).len(), 1, "a new problem is still one");
        // Setting spec.minReadySeconds (through v1beta1) beside it would make v1alpha1 lose one of the two.
        let mut timed = old.clone();
        timed.spec.min_ready_seconds = 10;
        let errs = validate_update(&timed, &old);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].value.as_deref(), Some("\"soon\""));
        assert!(errs[0].detail.starts_with("must be removed before spec.minReadySeconds is set"), "{errs:?}");
    }

    #[test]
    fn selector_is_immutable() {
        let old = podset(serde_json::json!({"metadata": {"name": "web"}}));
        let mut new = old.clone();
        new.spec.selector = Some(Default::default());
        new.spec.selector.as_mut().unwrap().match_labels = Some([("a".into(), "b".into())].into());
        let errs = validate_update(&new, &old);
        assert!(errs.iter().any(|e| e.field == "spec.selector" && e.detail == "field is immutable"), "{errs:?}");
    }

    #[test]
    fn names_and_label_values() {
        assert!(dns1123_subdomain_errors("a.b-c.d").is_empty());
        assert!(!dns1123_subdomain_errors("-a").is_empty());
        assert!(!dns1123_subdomain_errors(&"a".repeat(254)).is_empty());
        assert!(qualified_name_errors("example.com/My_Key.1").is_empty());
        assert!(!qualified_name_errors("/x").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors("-x").is_empty());
    }
}
