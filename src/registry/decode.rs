//! From request bodies to PodSets: JSON/YAML objects, type fields, unknown fields per `fieldValidation`, and the
//! JSON merge and JSON patches applied to a stored object.

use serde_json::Value;

use super::error::{Error, Result};
use super::options::{FieldValidation, PatchType};
use crate::api::validation::FieldError;
use crate::api::{PodSet, API_VERSION, KIND};

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

/// Decodes a PodSet, checking its type fields and, per `fieldValidation`, its unknown fields. Returns the
/// warnings `Warn` earns.
pub(crate) fn decode_podset(value: Value, fv: FieldValidation) -> Result<(PodSet, Vec<String>)> {
    check_type(&value, API_VERSION, KIND)?;
    let mut unknown = Vec::new();
    let ps: PodSet = serde_ignored::deserialize(value, |path| unknown.push(path.to_string())).map_err(|e| {
        Error::bad_request(format!("PodSet in version \"v1alpha1\" cannot be handled as a PodSet: {e}"))
    })?;
    unknown_fields(unknown, fv, "PodSet").map(|w| (ps, w))
}

/// [`decode_podset`] of a JSON body, read straight into the PodSet when it is a plain one (an object naming its
/// type, nothing unknown in it), with no JSON tree in between; anything else goes the way of `decode_podset`, so
/// errors and warnings read the same.
pub(crate) fn decode_json_podset(body: &[u8], fv: FieldValidation) -> Result<(PodSet, Vec<String>)> {
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if is_object {
        let mut de = serde_json::Deserializer::from_slice(body);
        let mut unknown = false;
        let decoded: Result<PodSet, _> = serde_ignored::deserialize(&mut de, |_| unknown = true);
        if let (Ok(ps), Ok(())) = (decoded, de.end()) {
            if !unknown && ps.api_version == API_VERSION && ps.kind == KIND {
                return Ok((ps, Vec::new()));
            }
        }
    }
    decode_podset(json_object(body)?, fv)
}

fn unknown_fields(unknown: Vec<String>, fv: FieldValidation, kind: &str) -> Result<Vec<String>> {
    let messages: Vec<String> = unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
    match fv {
        FieldValidation::Strict if !messages.is_empty() => Err(Error::bad_request(format!(
            "{kind} in version \"v1alpha1\" cannot be handled as a {kind}: strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Warn => Ok(messages),
        _ => Ok(Vec::new()),
    }
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
        let err = decode_podset(v.clone(), FieldValidation::Strict).unwrap_err();
        assert!(matches!(&err, Error::BadRequest(m) if m.contains("unknown field \"spec.bogus\"")), "{err}");
        let (_, warnings) = decode_podset(v.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(warnings, vec!["unknown field \"spec.bogus\"".to_owned()]);
        assert!(decode_podset(v, FieldValidation::Ignore).unwrap().1.is_empty());
        let wrong_kind = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}});
        assert!(matches!(decode_podset(wrong_kind, FieldValidation::Warn), Err(Error::BadRequest(_))));
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
            r#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet""#,
            "",
        ];
        for body in bodies {
            for fv in [FieldValidation::Strict, FieldValidation::Warn, FieldValidation::Ignore] {
                let direct = decode_json_podset(body.as_bytes(), fv);
                let via_tree = json_object(body.as_bytes()).and_then(|v| decode_podset(v, fv));
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

    #[test]
    fn bodies_must_be_objects() {
        assert!(matches!(json_object(b"[1]"), Err(Error::BadRequest(_))));
        assert!(matches!(yaml_object(b"- 1"), Err(Error::BadRequest(_))));
        assert!(yaml_object(b"metadata: {name: a}").unwrap()["metadata"]["name"] == "a");
    }
}
