//! `request.options` of an admission review, typed: the options kube-apiserver 1.20 tells webhooks a write or a
//! delete was made with.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;
use serde::Serialize;

/// The options of a request, as AdmissionReview's `request.options` carries them (`meta.k8s.io/v1`).
#[derive(Debug, Clone, PartialEq)]
pub enum RequestOptions {
    /// CreateOptions, UpdateOptions or PatchOptions.
    Write(WriteOptions),
    /// DeleteOptions as the client sent them (`apiVersion`, `kind` and `dryRun` filled in).
    Delete(Box<DeleteOptions>),
}

/// Which options a write had. An apply that creates the object is a create: kube-apiserver sends it
/// `CreateOptions` with the apply's field manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WriteKind {
    #[serde(rename = "CreateOptions")]
    Create,
    #[serde(rename = "UpdateOptions")]
    Update,
    #[serde(rename = "PatchOptions")]
    Patch,
}

/// CreateOptions, UpdateOptions or PatchOptions as kube-apiserver 1.20 fills them: `dryRun: ["All"]` on a dry
/// run, and the `fieldManager` only when the client named one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteOptions {
    pub kind: WriteKind,
    pub api_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<[&'static str; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field_manager: Option<String>,
}

const META_V1: &str = "meta.k8s.io/v1";
const DRY_RUN_ALL: [&str; 1] = ["All"];

impl RequestOptions {
    /// The options of a create, update or patch.
    pub fn write(kind: WriteKind, dry_run: bool, field_manager: Option<&str>) -> Self {
        RequestOptions::Write(WriteOptions {
            kind,
            api_version: META_V1,
            dry_run: dry_run.then_some(DRY_RUN_ALL),
            field_manager: field_manager.filter(|m| !m.is_empty()).map(str::to_owned),
        })
    }

    /// The options of a delete: what the client set.
    pub fn delete(mut options: DeleteOptions, dry_run: bool) -> Self {
        options.api_version = Some(META_V1.into());
        options.kind = Some("DeleteOptions".into());
        options.dry_run = dry_run.then(|| DRY_RUN_ALL.map(str::to_owned).to_vec());
        RequestOptions::Delete(Box::new(options))
    }

    /// As JSON, for the review.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            RequestOptions::Write(o) => serde_json::to_value(o),
            RequestOptions::Delete(o) => serde_json::to_value(o),
        }
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Preconditions;
    use serde_json::json;

    #[test]
    fn options_read_as_kube_apiservers() {
        let o = RequestOptions::write(WriteKind::Create, false, None);
        assert_eq!(o.to_value(), json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}));
        let o = RequestOptions::write(WriteKind::Patch, true, Some("kubectl"));
        assert_eq!(
            o.to_value(),
            json!({"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"], "fieldManager": "kubectl"})
        );
        assert_eq!(RequestOptions::write(WriteKind::Update, false, Some("")).to_value()["fieldManager"], json!(null));
        let d = DeleteOptions {
            propagation_policy: Some("Foreground".into()),
            preconditions: Some(Preconditions { uid: Some("u".into()), resource_version: None }),
            ..Default::default()
        };
        assert_eq!(
            RequestOptions::delete(d, true).to_value(),
            json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"],
                   "propagationPolicy": "Foreground", "preconditions": {"uid": "u"}})
        );
    }
}
