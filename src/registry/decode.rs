//! From request bodies to PodSets: JSON/YAML objects, type fields, unknown fields per `fieldValidation`, and the
//! JSON merge and JSON patches applied to a stored object.

use serde_json::Value;

use super::error::{Error, Result};
use super::options::{FieldValidation, PatchType};
use crate::api::validation::FieldError;
use crate::api::{conversion, PodSet, Version, KIND};

fn object(value: Value) -> Result<Value> {
    if !value.is_object() {
        return Err(Error::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// A JSON request body, which must be an object.
pub fn json_object(body: &[u8]) -> Result<Value> {
    object(serde_json::from_slice(body).map_err(|e| Error::bad_request(format!("error decoding JSON body: {e}")))?)
}

/// A YAML request body (an apply patch, or `Content-Type: application/yaml`), which must be an object.
pub fn yaml_object(body: &[u8]) -> Result<Value> {
    object(serde_yaml::from_slice(body).map_err(|e| Error::bad_request(format!("error parsing YAML body: {e}")))?)
}

/// The version a body is read in: the request's (its URL's), else the one the body names, else `v1alpha1`, the
/// version of every body before there were two (in-process callers that name none).
pub(crate) fn body_version(value: &Value, asked: Option<Version>) -> Version {
    asked.or_else(|| conversion::version_of(value)).unwrap_or(Version::V1alpha1)
}

/// Decodes a PodSet sent in `asked` (see [`body_version`]) into the hub, checking its type fields and, per
/// `fieldValidation`, its unknown fields (`spec.minReadySeconds` is one in `v1alpha1`). Returns the warnings
/// `Warn` earns, and the version it was read in.
pub(crate) fn decode_podset(mut value: Value, fv: FieldValidation, asked: Option<Version>) -> Result<Decoded> {
    let version = body_version(&value, asked);
    check_type(&value, version.api_version(), KIND)?;
    let mut unknown = Vec::new();
    if version == Version::V1alpha1 {
        if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
            if spec.remove("minReadySeconds").is_some() {
                unknown.push("spec.minReadySeconds".to_owned());
            }
        }
    }
    let mut ps: PodSet = serde_ignored::deserialize(value, |path| unknown.push(path.to_string())).map_err(|e| {
        Error::bad_request(format!("PodSet in version \"{version}\" cannot be handled as a PodSet: {e}"))
    })?;
    conversion::to_hub(&mut ps, version);
    unknown_fields(unknown, fv, "PodSet", version).map(|w| (ps, w, version))
}

/// A decoded body: the PodSet as the hub holds it, the warnings it earned, the version it came in.
pub(crate) type Decoded = (PodSet, Vec<String>, Version);

/// [`decode_podset`] of a JSON body, read straight into the PodSet when it is a plain one (an object naming its
/// type, nothing unknown in it), with no JSON tree in between; anything else goes the way of `decode_podset`, so
/// errors and warnings read the same.
pub(crate) fn decode_json_podset(body: &[u8], fv: FieldValidation, asked: Option<Version>) -> Result<Decoded> {
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    // v1alpha1 has no spec.minReadySeconds, which the hub would take: such a body goes the long way.
    let plain = |v: Version| v != Version::V1alpha1 || memchr::memmem::find(body, b"\"minReadySeconds\"").is_none();
    if is_object {
        let mut de = serde_json::Deserializer::from_slice(body);
        let mut unknown = false;
        let decoded: Result<PodSet, _> = serde_ignored::deserialize(&mut de, |_| unknown = true);
        if let (Ok(mut ps), Ok(())) = (decoded, de.end()) {
            let named = Version::of_api_version(&ps.api_version);
            if let Some(v) = named.filter(|v| asked.is_none_or(|a| a == *v) && plain(*v)) {
                if !unknown && ps.kind == KIND {
                    conversion::to_hub(&mut ps, v);
                    return Ok((ps, Vec::new(), v));
                }
            }
        }
    }
    decode_podset(json_object(body)?, fv, asked)
}

fn unknown_fields(unknown: Vec<String>, fv: FieldValidation, kind: &str, version: Version) -> Result<Vec<String>> {
    let messages: Vec<String> = unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
    match fv {
        FieldValidation::Strict if !messages.is_empty() => Err(Error::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Warn => Ok(messages),
        _ => Ok(Vec::new()),
    }
}

/// The hub object `ps` as JSON in `version`.
pub(crate) fn versioned_value(ps: &PodSet, version: Version) -> Result<Value> {
    let mut ps = ps.clone();
    conversion::from_hub(&mut ps, version);
    ps.kind = KIND.into();
    serde_json::to_value(ps).map_err(|e| Error::internal(e.to_string()))
}

/// `apiVersion` and `kind`, when a body sets them, must be the ones the endpoint serves.
pub(crate) fn check_type(value: &Value, api_version: &str, kind: &str) -> Result<()> {
    if let Some(av) = value.get("apiVersion").filter(|v| !v.is_null()) {
        if av.as_str() != Some(api_version) {
            return Err(Error::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({api_version})",
                av.as_str().unwrap_or("?")
            )));
        }
    }
    if let Some(k) = value.get("kind").filter(|v| !v.is_null()) {
        if k.as_str() != Some(kind) {
            return Err(Error::bad_request(format!(
                "the kind in the data ({}) does not match the expected kind ({kind})",
                k.as_str().unwrap_or("?")
            )));
        }
    }
    Ok(())
}

/// Applies a JSON merge patch or JSON patch to a document (apply patches go through field management).
pub(crate) fn apply_patch(doc: &mut Value, patch: &[u8], patch_type: PatchType) -> Result<()> {
    match patch_type {
        PatchType::Merge => {
            let p: Value =
                serde_json::from_slice(patch).map_err(|e| Error::bad_request(format!("error decoding patch: {e}")))?;
            if !p.is_object() {
                return Err(Error::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(doc, &p);
            Ok(())
        }
        PatchType::Json => {
            let p: json_patch::Patch =
                serde_json::from_slice(patch).map_err(|e| Error::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(doc, &p).map_err(|e| {
                Error::invalid_kind(
                    "",
                    "",
                    vec![FieldError::invalid("patch", String::from_utf8_lossy(patch), e.to_string())],
                )
            })
        }
        // The write path merges an apply with field management; the HTTP layer refuses one where no field
        // management runs (`/scale`).
        PatchType::Apply => Err(Error::internal("an apply patch is merged by field management, not patched in")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_decoding_rejects_unknown_fields_and_warn_reports_them() {
        let v = serde_json::json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "bogus": true}});
        let err = decode_podset(v.clone(), FieldValidation::Strict, None).unwrap_err();
        assert!(matches!(&err, Error::BadRequest(m) if m.contains("unknown field \"spec.bogus\"")), "{err}");
        let (_, warnings, _) = decode_podset(v.clone(), FieldValidation::Warn, None).unwrap();
        assert_eq!(warnings, vec!["unknown field \"spec.bogus\"".to_owned()]);
        assert!(decode_podset(v, FieldValidation::Ignore, None).unwrap().1.is_empty());
        let wrong_kind = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}});
        assert!(matches!(decode_podset(wrong_kind, FieldValidation::Warn, None), Err(Error::BadRequest(_))));
    }

    #[test]
    fn a_json_body_decodes_as_its_tree_does() {
        let bodies = [
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"name":"a","labels":{"x":"y"}},"spec":{"replicas":2}}"#,
            r#"  {"kind":"PodSet","apiVersion":"demo.k8s.io/v1alpha1","metadata":{"name":"a"},"spec":{"template":{"spec":{"containers":[{"name":"c","image":"i"}]}}}} "#,
            r#"{"metadata":{"name":"a"}}"#,
            r#"{"apiVersion":"","kind":"PodSet"}"#,
            r#"{"apiVersion":"v1","kind":"PodSet"}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"Pod"}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","spec":{"bogus":1,"replicas":1},"zzz":2,"aaa":3}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","spec":{"replicas":1.5}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","spec":{"replicas":1},"spec":{"replicas":2}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"labels":{"a":"1","a":"2"}}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","apiVersion":null}"#,
            r#"["demo.k8s.io/v1alpha1","PodSet",{"name":"a"}]"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet"} trailing"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","spec":{"minReadySeconds":0}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"annotations":{"demo.k8s.io/v1beta1-min-ready-seconds":"7"}}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1beta1","kind":"PodSet","spec":{"minReadySeconds":5,"replicas":1}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1beta1","kind":"PodSet","spec":{"minReadySeconds":-5,"bogus":1}}"#,
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet""#,
            "",
        ];
        for body in bodies {
            for fv in [FieldValidation::Strict, FieldValidation::Warn, FieldValidation::Ignore] {
                for asked in [None, Some(Version::V1alpha1), Some(Version::V1beta1)] {
                    let direct = decode_json_podset(body.as_bytes(), fv, asked);
                    let via_tree = json_object(body.as_bytes()).and_then(|v| decode_podset(v, fv, asked));
                    match (direct, via_tree) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{body}"),
                        (Err(a), Err(b)) => {
                            assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b), "{body}");
                            assert_eq!(a.to_string(), b.to_string(), "{body}");
                        }
                        (a, b) => panic!("{body}: {a:?} but through a tree {b:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn v1alpha1_bodies_have_no_min_ready_seconds_but_its_annotation() {
        let v = serde_json::json!({"apiVersion": "demo.k8s.io/v1alpha1", "spec": {"minReadySeconds": 5}});
        let err = decode_podset(v.clone(), FieldValidation::Strict, None).unwrap_err();
        assert!(err.to_string().contains("unknown field \"spec.minReadySeconds\""), "{err}");
        let (ps, warnings, version) = decode_podset(v, FieldValidation::Warn, None).unwrap();
        assert_eq!((ps.spec.min_ready_seconds, version), (0, Version::V1alpha1));
        assert_eq!(warnings, ["unknown field \"spec.minReadySeconds\""]);
        let v = serde_json::json!({"apiVersion": "demo.k8s.io/v1alpha1",
                                   "metadata": {"annotations": {conversion::MIN_READY_SECONDS: "5"}}});
        let (ps, _, _) = decode_podset(v, FieldValidation::Strict, None).unwrap();
        assert_eq!((ps.spec.min_ready_seconds, ps.metadata.annotations), (5, None));
        let v = serde_json::json!({"apiVersion": "demo.k8s.io/v1beta1", "spec": {"minReadySeconds": 5}});
        let (ps, _, version) = decode_podset(v.clone(), FieldValidation::Strict, None).unwrap();
        assert_eq!((ps.spec.min_ready_seconds, version), (5, Version::V1beta1));
        let err = decode_podset(v, FieldValidation::Strict, Some(Version::V1alpha1)).unwrap_err();
        assert!(err.to_string().contains("does not match the expected API version (demo.k8s.io/v1alpha1)"), "{err}");
    }

    #[test]
    fn bodies_must_be_objects() {
        assert!(matches!(json_object(b"[1]"), Err(Error::BadRequest(_))));
        assert!(matches!(yaml_object(b"- 1"), Err(Error::BadRequest(_))));
        assert!(yaml_object(b"metadata: {name: a}").unwrap()["metadata"]["name"] == "a");
    }
}
