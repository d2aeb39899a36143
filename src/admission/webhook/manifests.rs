//! Webhook configurations from `staticManifestsDir` (KEP-5793), one directory per plugin: a
//! `ValidatingWebhookConfiguration` directory for ValidatingAdmissionWebhook, a `MutatingWebhookConfiguration`
//! one for MutatingAdmissionWebhook. Checked as the API checks them plus the manifest rules (names ending in
//! `.static.k8s.io`, webhooks called by https URL, never a Service), match conditions compiled at load.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use tokio_util::sync::CancellationToken;

use super::{mutating_hooks_of, validating_hooks_of, Hook, StaticWebhooks};
use crate::admission::activation::DECLARED;
use crate::admission::manifest::{self, check_name, Loaded};
use crate::admission::matchconditions::MatchConditions;
use crate::api::strict::decode_strict_value;
use crate::api::validation::qualified_name_errors;

const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";

/// What one webhook of a configuration must be, beyond decoding.
struct WebhookFields<'a> {
    name: &'a str,
    client: &'a WebhookClientConfig,
    side_effects: &'a str,
    review_versions: &'a [String],
    conditions: &'a [MatchCondition],
}

fn check_webhook(config: &str, file: &Path, w: &WebhookFields<'_>) -> Vec<String> {
    let mut errors = Vec::new();
    let at = |what: String| format!("webhook {:?} in {config:?} (file {:?}): {what}", w.name, file.display());
    if w.client.service.is_some() {
        errors.push(at(
            "clientConfig.service is not supported for static manifests; use clientConfig.url instead".into()
        ));
    }
    match w.client.url.as_deref() {
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
    if w.conditions.len() > 64 {
        errors.push(at(format!("matchConditions: Too many: {}: must have at most 64 items", w.conditions.len())));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, c) in w.conditions.iter().enumerate() {
        if names.contains(&c.name.as_str()) {
            errors.push(at(format!("matchConditions[{i}].name: Duplicate value: {:?}", c.name)));
        }
        names.push(&c.name);
        for e in qualified_name_errors(&c.name) {
            errors.push(at(format!("matchConditions[{i}].name: Invalid value: {:?}: {e}", c.name)));
        }
    }
    let compiled = MatchConditions::compile(w.conditions, DECLARED);
    for (i, (_, e)) in compiled.compile_errors().enumerate() {
        errors.push(at(format!("matchConditions[{i}].expression: Invalid value: {e}")));
    }
    errors
}

fn decode<T: serde::de::DeserializeOwned>(d: &manifest::Document) -> Result<T, String> {
    decode_strict_value(d.value.clone()).map_err(|e| format!("error loading {}: {e}", d.file.display()))
}

fn aggregate(errors: Vec<String>) -> String {
    match errors.len() {
        1 => errors.into_iter().next().unwrap_or_default(),
        _ => format!("[{}]", errors.join(", ")),
    }
}

/// The ValidatingWebhookConfigurations of `dir`.
pub fn load_validating(dir: &Path) -> Result<Loaded<Vec<Arc<Hook>>>, String> {
    let read = manifest::read(dir)?;
    let mut seen = Vec::new();
    let mut configs = Vec::new();
    for d in &read.documents {
        if (d.api_version.as_str(), d.kind.as_str()) != (GROUP_VERSION, "ValidatingWebhookConfiguration") {
            return Err(unsupported(d));
        }
        let c: ValidatingWebhookConfiguration = decode(d)?;
        let name = c.metadata.name.clone().unwrap_or_default();
        check_name(&name, &d.file, &mut seen)?;
        let errors: Vec<String> = c
            .webhooks
            .iter()
            .flatten()
            .flat_map(|w| {
                let f = WebhookFields {
                    name: &w.name,
                    client: &w.client_config,
                    side_effects: &w.side_effects,
                    review_versions: &w.admission_review_versions,
                    conditions: w.match_conditions.as_deref().unwrap_or_default(),
                };
                check_webhook(&name, &d.file, &f)
            })
            .collect();
        if !errors.is_empty() {
            return Err(format!("ValidatingWebhookConfiguration {name:?}: {}", aggregate(errors)));
        }
        configs.push(c);
    }
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let hooks = validating_hooks_of(&configs);
    Ok(Loaded { count: configs.len(), value: hooks, hash: read.hash })
}

/// The MutatingWebhookConfigurations of `dir`.
pub fn load_mutating(dir: &Path) -> Result<Loaded<Vec<Arc<Hook>>>, String> {
    let read = manifest::read(dir)?;
    let mut seen = Vec::new();
    let mut configs = Vec::new();
    for d in &read.documents {
        if (d.api_version.as_str(), d.kind.as_str()) != (GROUP_VERSION, "MutatingWebhookConfiguration") {
            return Err(unsupported(d));
        }
        let c: MutatingWebhookConfiguration = decode(d)?;
        let name = c.metadata.name.clone().unwrap_or_default();
        check_name(&name, &d.file, &mut seen)?;
        let errors: Vec<String> = c
            .webhooks
            .iter()
            .flatten()
            .flat_map(|w| {
                let f = WebhookFields {
                    name: &w.name,
                    client: &w.client_config,
                    side_effects: &w.side_effects,
                    review_versions: &w.admission_review_versions,
                    conditions: w.match_conditions.as_deref().unwrap_or_default(),
                };
                check_webhook(&name, &d.file, &f)
            })
            .collect();
        if !errors.is_empty() {
            return Err(format!("MutatingWebhookConfiguration {name:?}: {}", aggregate(errors)));
        }
        configs.push(c);
    }
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let hooks = mutating_hooks_of(&configs);
    Ok(Loaded { count: configs.len(), value: hooks, hash: read.hash })
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
