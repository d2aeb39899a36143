//! Validation of PodSets, with field errors worded as k8s.io/apimachinery's `field.Error`s.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::conversion::MIN_READY_SECONDS;
use super::selector::Selector;
use super::{PodSet, PodSetStatus};

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Invalid,
    Required,
    Forbidden,
    TooLong,
    NotSupported,
}

/// One problem with one field, as `metav1.StatusCause` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: ErrorType,
    /// The offending value, already rendered (strings quoted).
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, value: impl fmt::Debug, detail: impl Into<String>) -> Self {
        let value = format!("{value:?}");
        Self { field: field.into(), kind: ErrorType::Invalid, value: Some(value), detail: detail.into() }
    }
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { field: field.into(), kind: ErrorType::Required, value: None, detail: detail.into() }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { field: field.into(), kind: ErrorType::Forbidden, value: None, detail: detail.into() }
    }
    /// A value outside a fixed set, listed as Go's `field.NotSupported` lists it.
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list = supported.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
        Self {
            field: field.into(),
            kind: ErrorType::NotSupported,
            value: Some(format!("{value:?}")),
            detail: format!("supported values: {list}"),
        }
    }

    /// `metav1.CauseType` of this error.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::NotSupported => "FieldValueNotSupported",
        }
    }

    /// The message without the field path, as in `StatusCause.message`.
    pub fn body(&self) -> String {
        let head = match self.kind {
            ErrorType::Invalid => "Invalid value",
            ErrorType::Required => "Required value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::NotSupported => "Unsupported value",
        };
        match (&self.value, self.detail.is_empty()) {
            (Some(v), false) => format!("{head}: {v}: {}", self.detail),
            (Some(v), true) => format!("{head}: {v}"),
            (None, false) => format!("{head}: {}", self.detail),
            (None, true) => head.to_owned(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.starts_with(is_alnum_lower)
        && s.ends_with(is_alnum_lower)
}

/// Problems with `s` as an RFC 1123 subdomain (object names).
pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if !s.split('.').all(is_dns1123_label) {
        errs.push(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must \
             start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is \
             '{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*')"
        ));
    }
    errs
}

/// Problems with `s` as an RFC 1123 label (namespaces, container names).
pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !is_dns1123_label(s) {
        errs.push(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start \
             and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is \
             '{DNS1123_LABEL_FMT}')"
        ));
    }
    errs
}

fn is_name_part(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| ok(c) || matches!(c, '-' | '_' | '.'))
        && s.starts_with(ok)
        && s.ends_with(ok)
}

/// Problems with `s` as a qualified name (label and annotation keys): `[prefix/]name`.
pub fn qualified_name_errors(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_owned());
        } else {
            errs.extend(dns1123_subdomain_errors(p).into_iter().map(|e| format!("prefix part {e}")));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_owned());
    } else if !is_name_part(name) {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
                .to_owned(),
        );
    }
    errs
}

/// Problems with `s` as a label value (empty is fine).
pub fn label_value_errors(s: &str) -> Vec<String> {
    if s.is_empty() || is_name_part(s) {
        return Vec::new();
    }
    if s.len() > 63 {
        return vec!["must be no more than 63 characters".to_owned()];
    }
    vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must \
          start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for \
          validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        .to_owned()]
}

pub fn validate_labels(labels: &BTreeMap<String, String>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        for e in qualified_name_errors(k) {
            errs.push(FieldError::invalid(path, k, e));
        }
        for e in label_value_errors(v) {
            errs.push(FieldError::invalid(format!("{path}[{k}]"), v, e));
        }
    }
    errs
}

fn validate_object_meta(meta: &ObjectMeta) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match meta.name.as_deref() {
        None | Some("") => errs.push(FieldError::required("metadata.name", "name or generateName is required")),
        Some(name) => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(FieldError::invalid("metadata.name", name, e));
            }
        }
    }
    if let Some(labels) = &meta.labels {
        errs.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = &meta.annotations {
        let mut size = 0;
        for (k, v) in annotations {
            size += k.len() + v.len();
            for e in qualified_name_errors(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", k, e));
            }
        }
        if size > TOTAL_ANNOTATION_SIZE_LIMIT {
            errs.push(FieldError {
                field: "metadata.annotations".into(),
                kind: ErrorType::TooLong,
                value: None,
                detail: format!("may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
            });
        }
    }
    for (i, f) in meta.finalizers.iter().flatten().enumerate() {
        for e in qualified_name_errors(f) {
            errs.push(FieldError::invalid(format!("metadata.finalizers[{i}]"), f, e));
        }
    }
    let mut controllers = 0;
    for (i, r) in meta.owner_references.iter().flatten().enumerate() {
        let path = format!("metadata.ownerReferences[{i}]");
        for (field, value) in [("apiVersion", &r.api_version), ("kind", &r.kind), ("name", &r.name), ("uid", &r.uid)] {
            if value.is_empty() {
                errs.push(FieldError::invalid(format!("{path}.{field}"), value, format!("{field} must not be empty")));
            }
        }
        controllers += usize::from(r.controller == Some(true));
    }
    if controllers > 1 {
        errs.push(FieldError::invalid(
            "metadata.ownerReferences",
            controllers,
            "Only one reference can have Controller set to true",
        ));
    }
    errs
}

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
    use super::*;
    use crate::api::defaults::default_podset;
    use crate::api::Version;

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
