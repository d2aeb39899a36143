//! Field errors worded as k8s.io/apimachinery's `field.Error`s, and the validation every object shares (names,
//! labels, object metadata).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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

/// ObjectMeta as kube-apiserver validates it for any object: name, labels, annotations, finalizers, owners.
pub fn validate_object_meta(meta: &ObjectMeta) -> Vec<FieldError> {
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
