//! Webhook configurations from `staticManifestsDir` (KEP-5793), one directory per plugin: a
//! `ValidatingWebhookConfiguration` directory for ValidatingAdmissionWebhook, a `MutatingWebhookConfiguration`
//! one for MutatingAdmissionWebhook. Checked as the API checks them plus the manifest rules (names ending in
//! `.static.k8s.io`, webhooks called by https URL, never a Service), match conditions compiled at load.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use tokio_util::sync::CancellationToken;

use super::hooks::{mutating_hooks_of, mutating_spec, validating_hooks_of, validating_spec, HookSpec};
use super::{Hook, StaticWebhooks};
use crate::admission::activation::DECLARED;
use crate::admission::manifest::{self, check_name, Loaded};
use crate::admission::matchconditions::{aggregate, MatchConditions};
use crate::api::strict::decode_strict_value;
use crate::api::validation::qualified_name_errors;

const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";

/// What one webhook of a configuration must be, beyond decoding.
fn check_webhook(config: &str, file: &Path, w: &HookSpec<'_>) -> Vec<String> {
    let mut errors = Vec::new();
    let at = |what: String| format!("webhook {:?} in {config:?} (file {:?}): {what}", w.name, file.display());
    if w.client_config.service.is_some() {
        errors.push(at(
            "clientConfig.service is not supported for static manifests; use clientConfig.url instead".into()
        ));
    }
    match w.client_config.url.as_deref() {
        None | Some("") => errors.push(at("clientConfig.url is required for static manifests".into())),
        Some(u) if !u.starts_with("https://") => {
            errors.push(at(format!("clientConfig.url: Invalid value: {u:?}: 'https' is the only allowed URL scheme")))
        }
        Some(_) => {}
    }
    if !["None", "NoneOnDryRun"].contains(&w.side_effects) {
        errors.push(at(format!(
            "sideEffects: Unsupported value: {:?}: supported values: \"None\", \"NoneOnDryRun\"",
            w.side_effects
        )));
    }
    if w.review_versions.is_empty() {
        errors.push(at("admissionReviewVersions: Required value: must specify one of v1, v1beta1".into()));
    }
    let conditions = w.match_conditions.as_deref().unwrap_or_default();
    if conditions.len() > 64 {
        errors.push(at(format!("matchConditions: Too many: {}: must have at most 64 items", conditions.len())));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        if names.contains(&c.name.as_str()) {
            errors.push(at(format!("matchConditions[{i}].name: Duplicate value: {:?}", c.name)));
        }
        names.push(&c.name);
        for e in qualified_name_errors(&c.name) {
            errors.push(at(format!("matchConditions[{i}].name: Invalid value: {:?}: {e}", c.name)));
        }
    }
    let compiled = MatchConditions::compile(conditions, DECLARED);
    for (i, (_, e)) in compiled.compile_errors().enumerate() {
        errors.push(at(format!("matchConditions[{i}].expression: Invalid value: {e}")));
    }
    errors
}

fn decode<T: serde::de::DeserializeOwned>(d: &manifest::Document) -> Result<T, String> {
    decode_strict_value(d.value.clone()).map_err(|e| format!("error loading {}: {e}", d.file.display()))
}

/// The configurations of kind `kind` in `dir`, checked, as hooks in name order.
fn load<C>(
    dir: &Path,
    kind: &str,
    specs: impl Fn(&C) -> Vec<HookSpec<'_>>,
    hooks: impl Fn(&[C]) -> Vec<Arc<Hook>>,
) -> Result<Loaded<Vec<Arc<Hook>>>, String>
where
    C: kube::Resource + serde::de::DeserializeOwned,
{
    let read = manifest::read(dir)?;
    let mut seen = Vec::new();
    let mut configs = Vec::new();
    for d in &read.documents {
        if (d.api_version.as_str(), d.kind.as_str()) != (GROUP_VERSION, kind) {
            return Err(unsupported(d));
        }
        let c: C = decode(d)?;
        let name = c.meta().name.clone().unwrap_or_default();
        check_name(&name, &d.file, &mut seen)?;
        let errors: Vec<String> = specs(&c).iter().flat_map(|w| check_webhook(&name, &d.file, w)).collect();
        if !errors.is_empty() {
            return Err(format!("{kind} {name:?}: {}", aggregate(errors)));
        }
        configs.push(c);
    }
    configs.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    Ok(Loaded { count: configs.len(), value: hooks(&configs), hash: read.hash })
}

/// The ValidatingWebhookConfigurations of `dir`.
pub fn load_validating(dir: &Path) -> Result<Loaded<Vec<Arc<Hook>>>, String> {
    load(
        dir,
        "ValidatingWebhookConfiguration",
        |c: &ValidatingWebhookConfiguration| c.webhooks.iter().flatten().map(validating_spec).collect(),
        |c| validating_hooks_of(c),
    )
}

/// The MutatingWebhookConfigurations of `dir`.
pub fn load_mutating(dir: &Path) -> Result<Loaded<Vec<Arc<Hook>>>, String> {
    load(
        dir,
        "MutatingWebhookConfiguration",
        |c: &MutatingWebhookConfiguration| c.webhooks.iter().flatten().map(mutating_spec).collect(),
        |c| mutating_hooks_of(c),
    )
}

fn unsupported(d: &manifest::Document) -> String {
    format!("error loading {}: unsupported resource type {}, Kind={}", d.file.display(), d.api_version, d.kind)
}

/// Loads each configured directory into `statics` (an error stops the start) and reloads it on change.
pub fn start(
    (mutating, validating): (Option<PathBuf>, Option<PathBuf>),
    statics: &StaticWebhooks,
    apiserver_id_hash: &str,
    stop: &CancellationToken,
) -> Result<(), String> {
    if let Some(dir) = mutating {
        let s = statics.clone();
        manifest::start(
            dir,
            "MutatingAdmissionWebhook",
            apiserver_id_hash.to_owned(),
            stop.clone(),
            load_mutating,
            move |h| s.set_mutating(h),
        )?;
    }
    if let Some(dir) = validating {
        let s = statics.clone();
        manifest::start(
            dir,
            "ValidatingAdmissionWebhook",
            apiserver_id_hash.to_owned(),
            stop.clone(),
            load_validating,
            move |h| s.set_validating(h),
        )?;
    }
    Ok(())
}
