//! From request bodies to objects: JSON/YAML objects, type fields, unknown fields per `fieldValidation`, and the
//! JSON merge and JSON patches applied to a stored object.

use serde_json::Value;

use super::error::{Error, Result};
use super::options::{FieldValidation, PatchType};
use super::strategy::{typed, version_of, Strategy};
use crate::api::resource::ServedVersion;
use crate::api::validation::FieldError;

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

/// The version a body is read in: the request's (its URL's), else the one the body names, else the one objects
/// naming none are in (in-process callers that name none).
pub(crate) fn body_version<S: Strategy>(value: &Value, asked: Option<S::Version>) -> S::Version {
    asked.unwrap_or_else(|| typed::<S>(S::INFO.version_of_value(value)))
}

/// Decodes an object sent in `asked` (see [`body_version`]) into the hub, checking its type fields and, per
/// `fieldValidation`, its unknown fields (those the version lacks among them). Returns the warnings `Warn` earns,
/// and the version it was read in.
pub(crate) fn decode_object<S: Strategy>(
    mut value: Value,
    fv: FieldValidation,
    asked: Option<S::Version>,
) -> Result<Decoded<S>> {
    let version = body_version::<S>(&value, asked);
    let kind = S::INFO.kind;
    check_type(&value, S::INFO.version(version.to_index()).api_version, kind)?;
    let mut unknown = S::absent_fields(version, &mut value);
    let mut o: S::Object = serde_ignored::deserialize(value, |path| unknown.push(path.to_string())).map_err(|e| {
        Error::bad_request(format!("{kind} in version \"{version}\" cannot be handled as a {kind}: {e}"))
    })?;
    S::to_hub(&mut o, version);
    unknown_fields(unknown, fv, kind, version).map(|w| (o, w, version))
}

/// A decoded body: the object as the hub holds it, the warnings it earned, the version it came in.
pub(crate) type Decoded<S> = (<S as Strategy>::Object, Vec<String>, <S as Strategy>::Version);

/// [`decode_object`] of a JSON body, read straight into the object when it is a plain one (an object naming its
/// type, nothing unknown in it), with no JSON tree in between; anything else goes the way of `decode_object`, so
/// errors and warnings read the same.
pub(crate) fn decode_json_object<S: Strategy>(
    body: &[u8],
    fv: FieldValidation,
    asked: Option<S::Version>,
) -> Result<Decoded<S>> {
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if is_object {
        let mut de = serde_json::Deserializer::from_slice(body);
        let mut unknown = false;
        let decoded: Result<S::Object, _> = serde_ignored::deserialize(&mut de, |_| unknown = true);
        if let (Ok(mut o), Ok(())) = (decoded, de.end()) {
            let (api_version, kind) = S::type_fields(&mut o);
            let named = version_of::<S>(api_version);
            let plain = !unknown && kind == S::INFO.kind;
            if let Some(v) = named.filter(|v| asked.is_none_or(|a| a == *v) && S::decodes_directly(*v, body)) {
                if plain {
                    S::to_hub(&mut o, v);
                    return Ok((o, Vec::new(), v));
                }
            }
        }
    }
    decode_object::<S>(json_object(body)?, fv, asked)
}

fn unknown_fields(
    unknown: Vec<String>,
    fv: FieldValidation,
    kind: &str,
    version: impl std::fmt::Display,
) -> Result<Vec<String>> {
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

/// The hub object `o` as JSON in `version`.
pub(crate) fn versioned_value<S: Strategy>(o: &S::Object, version: S::Version) -> Result<Value> {
    let mut o = o.clone();
    S::from_hub(&mut o, version);
    *S::type_fields(&mut o).1 = S::INFO.kind.into();
    serde_json::to_value(o).map_err(|e| Error::internal(e.to_string()))
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
    use crate::api::{conversion, Version};
    use crate::resources::podset::PodSetStrategy;

    fn decode_podset(v: Value, fv: FieldValidation, asked: Option<Version>) -> Result<Decoded<PodSetStrategy>> {
        decode_object::<PodSetStrategy>(v, fv, asked)
    }

    fn decode_json_podset(b: &[u8], fv: FieldValidation, asked: Option<Version>) -> Result<Decoded<PodSetStrategy>> {
        decode_json_object::<PodSetStrategy>(b, fv, asked)
    }

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
