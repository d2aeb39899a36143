//! The AdmissionReview a webhook gets and what its answer must hold (k8s.io/apiserver `webhook/request`).

use std::collections::BTreeMap;

use base64::Engine as _;
use kube::core::Status;
use serde_json::{json, Value};

use super::CallError;
use crate::admission::Attributes;

/// The AdmissionReview versions kube-apiserver 1.20 speaks; a webhook gets the first of its
/// `admissionReviewVersions` that is one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReviewVersion {
    V1,
    V1beta1,
}

impl ReviewVersion {
    pub(crate) fn pick(accepted: &[String]) -> Result<Self, CallError> {
        accepted
            .iter()
            .find_map(|v| match v.as_str() {
                "v1" => Some(Self::V1),
                "v1beta1" => Some(Self::V1beta1),
                _ => None,
            })
            .ok_or(CallError::NoKnownVersion)
    }

    fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "admission.k8s.io/v1",
            Self::V1beta1 => "admission.k8s.io/v1beta1",
        }
    }
}

/// The AdmissionReview for one call, as `CreateV1AdmissionReview` (v1beta1 has the same request fields).
/// `a` is the request as the webhook is sent it (in an equivalent version under `matchPolicy: Equivalent`),
/// `requested` as it was made.
pub(crate) fn request(
    version: ReviewVersion,
    uid: &str,
    a: &Attributes,
    requested: &Attributes,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Value {
    let mut r = crate::admission::activation::request_fields(a, requested);
    r.insert("uid".into(), json!(uid));
    r.insert("object".into(), object.cloned().unwrap_or(Value::Null));
    r.insert("oldObject".into(), old.cloned().unwrap_or(Value::Null));
    json!({"kind": "AdmissionReview", "apiVersion": version.api_version(), "request": r})
}

/// What a webhook answered, checked as `VerifyAdmissionResponse` checks it.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub allowed: bool,
    pub status: Option<Box<Status>>,
    /// The patch, empty when none, and its type (`JSONPatch`, the only one there is).
    pub patch: Vec<u8>,
    pub patch_type: String,
    pub audit_annotations: BTreeMap<String, String>,
    pub warnings: Vec<String>,
}

fn strings<T: serde::de::DeserializeOwned + Default>(v: Option<&Value>) -> Result<T, CallError> {
    match v {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| CallError::Decode(e.to_string())),
    }
}

/// The webhook's `status`, read leniently: a webhook's own words need not be a perfect `metav1.Status`.
fn status(v: Option<&Value>) -> Option<Box<Status>> {
    let v = v.filter(|v| v.is_object())?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let code = v.get("code").and_then(Value::as_u64).map_or(0, |c| u16::try_from(c).unwrap_or(500));
    Some(Box::new(Status {
        status: None,
        code,
        message: text("message"),
        metadata: None,
        reason: text("reason"),
        details: v.get("details").and_then(|d| serde_json::from_value(d.clone()).ok()),
    }))
}

/// Reads and checks a webhook's answer to the review `uid` sent as `version`.
pub(crate) fn answer(version: ReviewVersion, uid: &str, mutating: bool, body: &[u8]) -> Result<Answer, CallError> {
    let review: Value = serde_json::from_slice(body).map_err(|e| CallError::Decode(e.to_string()))?;
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err(CallError::Response("webhook response was absent".into()));
    };
    let patch = match response.get("patch") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| CallError::Decode(format!("response.patch: {e}")))?,
        Some(other) => return Err(CallError::Decode(format!("response.patch is not base64 text: {other}"))),
    };
    let patch_type = match response.get("patchType") {
        None | Some(Value::Null) => None,
        Some(t) => Some(t.as_str().unwrap_or_default().to_owned()),
    };
    let mut out = Answer {
        allowed: response.get("allowed").and_then(Value::as_bool).unwrap_or(false),
        status: status(response.get("status")),
        patch: Vec::new(),
        patch_type: String::new(),
        audit_annotations: strings(response.get("auditAnnotations"))?,
        warnings: strings(response.get("warnings"))?,
    };
    match version {
        ReviewVersion::V1 => {
            let got = response.get("uid").and_then(Value::as_str).unwrap_or_default();
            if got != uid {
                return Err(CallError::Response(format!("expected response.uid={uid:?}, got {got:?}")));
            }
            let api_version = review.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let kind = review.get("kind").and_then(Value::as_str).unwrap_or_default();
            if (api_version, kind) != ("admission.k8s.io/v1", "AdmissionReview") {
                let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
                return Err(CallError::Response(format!(
                    "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {group}/{version}, Kind={kind}"
                )));
            }
            if mutating {
                match (&patch_type, patch.is_empty()) {
                    (None, false) => {
                        return Err(CallError::Response(
                            "webhook returned response.patch but not response.patchType".into(),
                        ))
                    }
                    (Some(_), true) => {
                        return Err(CallError::Response(
                            "webhook returned response.patchType but not response.patch".into(),
                        ))
                    }
                    (Some(t), false) if t.is_empty() => {
                        return Err(CallError::Response(format!(
                            "webhook returned invalid response.patchType of {t:?}"
                        )))
                    }
                    (t, _) => {
                        out.patch = patch;
                        out.patch_type = t.clone().unwrap_or_default();
                    }
                }
            } else if !patch.is_empty() {
                return Err(CallError::Response("validating webhook may not return response.patch".into()));
            } else if patch_type.is_some() {
                return Err(CallError::Response("validating webhook may not return response.patchType".into()));
            }
        }
        // v1beta1 answers were never checked for uid, kind or patchType; a patch is a JSON patch.
        ReviewVersion::V1beta1 => {
            if mutating && !patch.is_empty() {
                out.patch = patch;
                out.patch_type = "JSONPatch".into();
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::webhook::tests::attrs;
    use crate::admission::{RequestOptions, WriteKind};
    use crate::api::{Operation, Subresource, UserInfo};

    #[test]
    fn the_review_carries_what_kube_apiserver_sends() {
        let mut a = attrs(Operation::Update, Subresource::Scale);
        a.user = UserInfo {
            name: "jane".into(),
            uid: "42".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra: [("scopes".to_owned(), vec!["a".to_owned()])].into(),
        };
        a.dry_run = true;
        a.options = RequestOptions::write(WriteKind::Update, true, None);
        let new = json!({"kind": "Scale", "spec": {"replicas": 3}});
        let old = json!({"kind": "Scale", "spec": {"replicas": 1}});
        let r = request(ReviewVersion::V1, "u-1", &a, &a, Some(&new), Some(&old));
        assert_eq!(
            r,
            json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {
                "uid": "u-1",
                "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "resource": {"group": "demo.k8s.io", "version": "v1alpha1", "resource": "podsets"},
                "subResource": "scale",
                "requestKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "requestResource": {"group": "demo.k8s.io", "version": "v1alpha1", "resource": "podsets"},
                "requestSubResource": "scale",
                "name": "web", "namespace": "default", "operation": "UPDATE",
                "userInfo": {"username": "jane", "uid": "42", "groups": ["dev", "system:authenticated"], "extra": {"scopes": ["a"]}},
                "object": new, "oldObject": old, "dryRun": true,
                "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]}}})
        );

        let create = attrs(Operation::Create, Subresource::Main);
        let r = request(ReviewVersion::V1beta1, "u-2", &create, &create, Some(&new), None);
        assert_eq!(r["apiVersion"], "admission.k8s.io/v1beta1");
        let req = r["request"].as_object().unwrap();
        assert!(!req.contains_key("subResource") && !req.contains_key("requestSubResource"));
        assert_eq!((&req["oldObject"], &req["userInfo"]), (&Value::Null, &json!({"username": "jane"})));
        assert_eq!(req["kind"], json!({"group": "demo.k8s.io", "version": "v1alpha1", "kind": "PodSet"}));
    }

    #[test]
    fn options_are_as_kube_apiserver_sends_them() {
        // As kube-apiserver 1.20 sent them for ConfigMaps in tests/admission.rs.
        assert_eq!(
            RequestOptions::write(WriteKind::Create, false, None).to_value(),
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"})
        );
        assert_eq!(
            RequestOptions::write(WriteKind::Create, true, Some("admission-test")).to_value(),
            json!({"apiVersion": "meta.k8s.io/v1", "dryRun": ["All"], "fieldManager": "admission-test", "kind": "CreateOptions"})
        );
    }

    #[test]
    fn the_first_known_review_version_is_picked() {
        let v = |s: &[&str]| ReviewVersion::pick(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(v(&["v2", "v1beta1", "v1"]).unwrap(), ReviewVersion::V1beta1);
        assert_eq!(v(&["v1", "v1beta1"]).unwrap(), ReviewVersion::V1);
        assert_eq!(
            v(&["v2"]).unwrap_err().to_string(),
            "webhook does not accept known AdmissionReview versions (v1, v1beta1)"
        );
    }

    #[test]
    fn answers_are_checked_as_kube_apiserver_checks_them() {
        let v1 = |response: Value| json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
        let check = |version, mutating, body: Value| answer(version, "u-1", mutating, body.to_string().as_bytes());
        let err = |version, mutating, body: Value| check(version, mutating, body).unwrap_err().to_string();

        let ok = check(
            ReviewVersion::V1,
            false,
            v1(json!({"uid": "u-1", "allowed": true,
            "warnings": ["careful"], "auditAnnotations": {"k": "v"}})),
        )
        .unwrap();
        assert!(ok.allowed && ok.status.is_none());
        assert_eq!(
            (ok.warnings, ok.audit_annotations),
            (vec!["careful".to_owned()], [("k".into(), "v".into())].into())
        );

        let no = check(
            ReviewVersion::V1,
            false,
            v1(json!({"uid": "u-1", "allowed": false,
            "status": {"code": 403, "message": "no", "status": "Failed"}})),
        )
        .unwrap();
        let s = no.status.unwrap();
        assert_eq!((no.allowed, s.code, s.message.as_str()), (false, 403, "no"));

        assert_eq!(
            err(ReviewVersion::V1, false, json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})),
            "webhook response was absent"
        );
        assert_eq!(
            err(ReviewVersion::V1, false, v1(json!({"uid": "other", "allowed": true}))),
            "expected response.uid=\"u-1\", got \"other\""
        );
        assert_eq!(
            err(ReviewVersion::V1, false, json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": {"uid": "u-1"}})),
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got admission.k8s.io/v1beta1, Kind=AdmissionReview"
        );
        assert!(err(ReviewVersion::V1, false, json!("garbage")).contains("webhook response was absent"));
        assert!(answer(ReviewVersion::V1, "u-1", false, b"<html>")
            .unwrap_err()
            .to_string()
            .starts_with("expected value"));

        let patch = base64::engine::general_purpose::STANDARD.encode(br#"[{"op":"add","path":"/x","value":1}]"#);
        let m = check(
            ReviewVersion::V1,
            true,
            v1(json!({"uid": "u-1", "allowed": true, "patch": patch, "patchType": "JSONPatch"})),
        )
        .unwrap();
        assert!(!m.patch.is_empty());
        assert_eq!(
            err(ReviewVersion::V1, true, v1(json!({"uid": "u-1", "allowed": true, "patch": patch}))),
            "webhook returned response.patch but not response.patchType"
        );
        assert_eq!(
            err(ReviewVersion::V1, true, v1(json!({"uid": "u-1", "allowed": true, "patchType": "JSONPatch"}))),
            "webhook returned response.patchType but not response.patch"
        );
        let other = check(
            ReviewVersion::V1,
            true,
            v1(json!({"uid": "u-1", "allowed": true, "patch": patch, "patchType": "MergePatch"})),
        );
        assert_eq!(other.unwrap().patch_type, "MergePatch", "refused later, after a denial would have counted");
        assert_eq!(
            err(ReviewVersion::V1, false, v1(json!({"uid": "u-1", "allowed": true, "patch": patch}))),
            "validating webhook may not return response.patch"
        );
        assert_eq!(
            err(ReviewVersion::V1, false, v1(json!({"uid": "u-1", "allowed": true, "patchType": "JSONPatch"}))),
            "validating webhook may not return response.patchType"
        );

        // v1beta1: no uid, kind or patchType checks.
        let b = check(ReviewVersion::V1beta1, true, json!({"response": {"uid": "x", "allowed": true, "patch": patch}}))
            .unwrap();
        assert!(b.allowed && !b.patch.is_empty() && b.patch_type == "JSONPatch");
    }
}
