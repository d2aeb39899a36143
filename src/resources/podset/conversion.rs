//! Conversion between the served versions, through the hub ([`PodSet`], which has every version's fields).
//!
//! `v1beta1` adds `spec.minReadySeconds`. `v1alpha1` carries it in the annotation [`MIN_READY_SECONDS`] (as
//! `autoscaling/v1` carries `v2`'s metrics), so a `v1alpha1` object converts to `v1beta1` and back unchanged,
//! and a `v1alpha1` client that writes back what it read keeps the value.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{PodSet, Version};
use crate::api::resource::{ServedVersion, VersionIndex};

/// Where `v1alpha1` keeps `v1beta1`'s `spec.minReadySeconds`.
pub const MIN_READY_SECONDS: &str = "demo.k8s.io/v1beta1-min-ready-seconds";

/// The annotation's value for `seconds`, and back: only the canonical text of a number above 0 is one (anything
/// else stays an annotation, which validation then refuses), so both directions are exact inverses.
fn annotation_of(seconds: i32) -> Option<String> {
    (seconds > 0).then(|| seconds.to_string())
}

fn seconds_of(annotation: &str) -> Option<i32> {
    annotation.parse::<i32>().ok().filter(|s| *s > 0 && s.to_string() == annotation)
}

/// `ps`, read in `from`, as the hub holds it (with no `apiVersion`: the hub is no version clients see).
pub fn to_hub(ps: &mut PodSet, from: Version) {
    ps.api_version.clear();
    if from == Version::V1alpha1 {
        let annotations = &mut ps.metadata.annotations;
        if let Some(seconds) = annotations.as_ref().and_then(|a| a.get(MIN_READY_SECONDS)).and_then(|v| seconds_of(v)) {
            ps.spec.min_ready_seconds = seconds;
            if let Some(a) = annotations.as_mut() {
                a.remove(MIN_READY_SECONDS);
            }
            if annotations.as_ref().is_some_and(BTreeMap::is_empty) {
                *annotations = None;
            }
        }
    }
}

/// The hub object `ps` in version `to`, its `apiVersion` set.
pub fn from_hub(ps: &mut PodSet, to: Version) {
    if to == Version::V1alpha1 {
        if let Some(text) = annotation_of(std::mem::take(&mut ps.spec.min_ready_seconds)) {
            ps.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(MIN_READY_SECONDS.to_owned(), text);
        }
    }
    ps.api_version = to.api_version().to_owned();
}

/// `ps` from version `from` to version `to`.
pub fn convert(ps: &mut PodSet, from: Version, to: Version) {
    to_hub(ps, from);
    from_hub(ps, to);
}

/// A PodSet as JSON (whole, or an apply's partial configuration), in version `from`, converted to `to` in place:
/// only the paths that differ are touched, so what the struct would not know (unknown fields) passes as it was.
pub fn convert_value(value: &mut Value, from: Version, to: Version) {
    if let Some(obj) = value.as_object_mut() {
        if obj.get("apiVersion").is_some_and(|v| !v.is_null()) || from != to {
            obj.insert("apiVersion".into(), Value::String(to.api_version().into()));
        }
    }
    match (from, to) {
        (Version::V1alpha1, Version::V1beta1) => {
            let Some(annotations) = value.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) else {
                return;
            };
            let Some(seconds) = annotations.get(MIN_READY_SECONDS).and_then(Value::as_str).and_then(seconds_of) else {
                return;
            };
            annotations.remove(MIN_READY_SECONDS);
            if annotations.is_empty() {
                if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("annotations");
                }
            }
            if let Some(obj) = value.as_object_mut() {
                let spec = obj.entry("spec").or_insert_with(|| Value::Object(Default::default()));
                if let Some(spec) = spec.as_object_mut() {
                    spec.insert("minReadySeconds".into(), seconds.into());
                }
            }
        }
        (Version::V1beta1, Version::V1alpha1) => {
            let Some(taken) =
                value.get_mut("spec").and_then(Value::as_object_mut).and_then(|s| s.remove("minReadySeconds"))
            else {
                return;
            };
            let Some(text) = taken.as_i64().and_then(|n| i32::try_from(n).ok()).and_then(annotation_of) else {
                return;
            };
            if let Some(obj) = value.as_object_mut() {
                let meta = obj.entry("metadata").or_insert_with(|| Value::Object(Default::default()));
                if let Some(meta) = meta.as_object_mut() {
                    let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
                    if let Some(a) = annotations.as_object_mut() {
                        a.insert(MIN_READY_SECONDS.into(), Value::String(text));
                    }
                }
            }
        }
        _ => {}
    }
}

/// [`convert_value`] between versions as the layers that serve any resource name them.
pub(super) fn convert_value_at(value: &mut Value, from: VersionIndex, to: VersionIndex) {
    convert_value(value, Version::from_index(from), Version::from_index(to))
}

/// Whether a PodSet's JSON (or managedFields' field sets, `f:minReadySeconds`) reads the same in every version: it
/// has neither `minReadySeconds` nor the annotation that holds it in `v1alpha1`, the one difference.
pub(super) fn version_neutral(json: &[u8]) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: a finder's searcher costs as much to build as a short object takes to scan.
    static FIELD: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"minReadySeconds"));
    static ANNOTATION: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(MIN_READY_SECONDS.as_bytes()));
    FIELD.find(json).is_none() && ANNOTATION.find(json).is_none()
}

/// The version a stored or sent object's `apiVersion` names, if it is one of ours.
pub fn version_of(value: &Value) -> Option<Version> {
    value.get("apiVersion").and_then(Value::as_str).and_then(Version::of_api_version)
}

/// A managedFields entry's field set (FieldsV1 JSON), recorded in `from`, as `to` names the same fields: only
/// `spec.minReadySeconds` lives elsewhere in `v1alpha1`.
pub fn convert_fields(fields: &mut Value, from: Version, to: Version) {
    const SPEC: &str = "f:spec";
    const FIELD: &str = "f:minReadySeconds";
    let annotation = format!("f:{MIN_READY_SECONDS}");
    let take = |fields: &mut Value, outer: &str, inner: &str, key: &str| -> Option<Value> {
        let parent = fields.get_mut(outer)?;
        let parent = if inner.is_empty() { parent } else { parent.get_mut(inner)? };
        let owned = parent.as_object_mut()?.remove(key)?;
        Some(owned)
    };
    // In FieldsV1 a node that is owned itself is `{}` when nothing under it is owned, and carries `".": {}` beside
    // its children otherwise; moving a child in or out keeps that.
    let put = |fields: &mut Value, path: &[&str], owned: Value| {
        let mut at = fields;
        for p in path {
            let Some(map) = at.as_object_mut() else { return };
            if map.get(*p).and_then(Value::as_object).is_some_and(|m| m.is_empty()) {
                map.insert(p.to_string(), serde_json::json!({".": {}}));
            }
            at = map.entry(p.to_string()).or_insert_with(|| Value::Object(Default::default()));
        }
        *at = owned;
    };
    let prune = |fields: &mut Value, path: &[&str]| {
        // A parent left with nothing owned under it is owned no more (smd's sets have no empty nodes), or, owned
        // itself, is a leaf again.
        for depth in (1..=path.len()).rev() {
            let (parents, last) = path[..depth].split_at(depth - 1);
            let mut at = &mut *fields;
            for p in parents {
                match at.get_mut(*p) {
                    Some(next) => at = next,
                    None => return,
                }
            }
            let Some(m) = at.as_object_mut() else { return };
            match m.get(last[0]).and_then(Value::as_object) {
                Some(node) if node.is_empty() => {
                    m.remove(last[0]);
                }
                Some(node) if node.len() == 1 && node.contains_key(".") => {
                    m.insert(last[0].to_owned(), Value::Object(Default::default()));
                    return;
                }
                _ => return,
            }
        }
    };
    match (from, to) {
        (Version::V1beta1, Version::V1alpha1) => {
            if let Some(owned) = take(fields, SPEC, "", FIELD) {
                put(fields, &["f:metadata", "f:annotations", &annotation], owned);
                prune(fields, &[SPEC]);
            }
        }
        (Version::V1alpha1, Version::V1beta1) => {
            if let Some(owned) = take(fields, "f:metadata", "f:annotations", &annotation) {
                put(fields, &[SPEC, FIELD], owned);
                prune(fields, &["f:metadata", "f:annotations"]);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
