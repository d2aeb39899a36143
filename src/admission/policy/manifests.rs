//! ValidatingAdmissionPolicies and bindings from `staticManifestsDir` (KEP-5793): checked as the API would check
//! them, plus the manifest rules (names ending in `.static.k8s.io`, no `paramKind`, no `paramRef`, bindings only to
//! policies of the same directory) and compiled at load: a policy that does not compile is refused here, not on
//! every request. A bad directory stops the start; a bad edit while serving keeps the last good set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use tokio_util::sync::CancellationToken;

use super::compiled::{Binding, Origin, Policy};
use super::{hooks, Hook, Policies};
use crate::admission::manifest::{self, check_name, Document, STATIC_SUFFIX};
use crate::admission::matchconditions::aggregate;
use crate::api::strict::decode_strict_value;
use crate::api::validation::qualified_name_errors;

const PLUGIN: &str = "ValidatingAdmissionPolicy";
const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";

/// A directory's policies, paired with their bindings.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub hooks: Vec<Hook>,
    pub hash: String,
    pub policies: usize,
    pub bindings: usize,
}

/// kube's REST validation of a policy, for what this server checks of it.
fn validate_policy(p: &ValidatingAdmissionPolicy, compiled: &Policy) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(spec) = &p.spec else {
        return vec!["spec.matchConstraints: Required value".into()];
    };
    match &spec.match_constraints {
        None => errors.push("spec.matchConstraints: Required value".into()),
        Some(m) if m.resource_rules.as_ref().is_none_or(Vec::is_empty) => {
            errors.push("spec.matchConstraints.resourceRules: Required value".into())
        }
        Some(_) => {}
    }
    if let Some(f) = spec.failure_policy.as_deref().filter(|f| !["Fail", "Ignore"].contains(f)) {
        errors.push(format!("spec.failurePolicy: Unsupported value: {f:?}: supported values: \"Fail\", \"Ignore\""));
    }
    if spec.validations.as_ref().is_none_or(Vec::is_empty) && spec.audit_annotations.as_ref().is_none_or(Vec::is_empty)
    {
        errors.push(
            "spec.validations: Required value: validations or auditAnnotations must contain at least one item".into(),
        );
    }
    for (i, v) in spec.validations.iter().flatten().enumerate() {
        if v.expression.trim().is_empty() {
            errors.push(format!("spec.validations[{i}].expression: Required value: expression is not specified"));
        }
        if let Some(m) = &v.message {
            if m.trim().is_empty() {
                errors.push(format!(
                    "spec.validations[{i}].message: Invalid value: {m:?}: message must be non-empty if specified"
                ));
            } else if m.contains('\n') {
                errors.push(format!(
                    "spec.validations[{i}].message: Invalid value: {m:?}: message must not contain line breaks"
                ));
            }
        }
        if let Some(r) = v.reason.as_deref().filter(|r| !["Forbidden", "Invalid", "RequestEntityTooLarge"].contains(r))
        {
            errors.push(format!(
                "spec.validations[{i}].reason: Unsupported value: {r:?}: supported values: \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\""
            ));
        }
    }
    let conditions = spec.match_conditions.as_deref().unwrap_or_default();
    if conditions.len() > 64 {
        errors.push(format!("spec.matchConditions: Too many: {}: must have at most 64 items", conditions.len()));
    }
    let mut names = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        if c.name.is_empty() {
            errors.push(format!("spec.matchConditions[{i}].name: Required value"));
        } else if names.contains(&c.name.as_str()) {
            errors.push(format!("spec.matchConditions[{i}].name: Duplicate value: {:?}", c.name));
        } else {
            for e in qualified_name_errors(&c.name) {
                errors.push(format!("spec.matchConditions[{i}].name: Invalid value: {:?}: {e}", c.name));
            }
        }
        names.push(&c.name);
    }
    for (i, v) in spec.variables.iter().flatten().enumerate() {
        let ident = v.name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && v.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            errors.push(format!(
                "spec.variables[{i}].name: Invalid value: {:?}: name is not a valid CEL identifier",
                v.name
            ));
        }
    }
    for (field, e) in compiled.compile_errors() {
        errors.push(format!("{field}: Invalid value: {e}"));
    }
    if spec.param_kind.is_some() {
        errors.push(format!(
            "ValidatingAdmissionPolicy {:?}: spec.paramKind is not supported for static manifests",
            compiled.name
        ));
    }
    errors
}

fn validate_binding(b: &ValidatingAdmissionPolicyBinding) -> Vec<String> {
    let name = b.metadata.name.clone().unwrap_or_default();
    let mut errors = Vec::new();
    let spec = b.spec.clone();
    let policy = spec.policy_name;
    if policy.is_empty() {
        errors.push(format!("binding {name:?} must reference a policy (spec.policyName)"));
    } else if !policy.ends_with(STATIC_SUFFIX) {
        errors.push(format!("binding {name:?}: spec.policyName {policy:?} must end with {STATIC_SUFFIX:?}"));
    }
    if spec.param_ref.is_some() {
        errors.push(format!("binding {name:?}: spec.paramRef is not supported for static manifests"));
    }
    let actions = spec.validation_actions;
    if actions.is_empty() {
        errors.push("spec.validationActions: Required value: at least one validation action is required".into());
    }
    for (i, a) in actions.iter().enumerate() {
        if !["Deny", "Warn", "Audit"].contains(&a.as_str()) {
            errors.push(format!(
                "spec.validationActions[{i}]: Unsupported value: {a:?}: supported values: \"Audit\", \"Deny\", \"Warn\""
            ));
        } else if actions[..i].contains(a) {
            errors.push(format!("spec.validationActions[{i}]: Duplicate value: {a:?}"));
        }
    }
    if actions.iter().any(|a| a == "Deny") && actions.iter().any(|a| a == "Warn") {
        errors.push(
            "spec.validationActions: Invalid value: [\"Deny\", \"Warn\"]: must not contain both Deny and Warn \
             (repeating the same validation failure information in the API response and headers serves no purpose)"
                .into(),
        );
    }
    errors
}

fn decode<T: serde::de::DeserializeOwned>(d: &Document) -> Result<T, String> {
    decode_strict_value(d.value.clone()).map_err(|e| format!("error loading {}: {e}", d.file.display()))
}

/// Reads, checks and compiles the policies and bindings of `dir`.
pub fn load(dir: &Path) -> Result<Loaded, String> {
    let read = manifest::read(dir)?;
    let mut policies = Vec::new();
    let mut bindings: Vec<(PathBuf, ValidatingAdmissionPolicyBinding)> = Vec::new();
    let (mut seen_policies, mut seen_bindings) = (Vec::new(), Vec::new());
    for d in &read.documents {
        match (d.api_version.as_str(), d.kind.as_str()) {
            (GROUP_VERSION, "ValidatingAdmissionPolicy") => {
                let p: ValidatingAdmissionPolicy = decode(d)?;
                let name = p.metadata.name.clone().unwrap_or_default();
                check_name(&name, &d.file, &mut seen_policies)?;
                let compiled = Policy::compile(&p, Origin::Manifest);
                let errors = validate_policy(&p, &compiled);
                if !errors.is_empty() {
                    return Err(format!("ValidatingAdmissionPolicy {name:?}: {}", aggregate(errors)));
                }
                policies.push(Arc::new(compiled));
            }
            (GROUP_VERSION, "ValidatingAdmissionPolicyBinding") => {
                let b: ValidatingAdmissionPolicyBinding = decode(d)?;
                let name = b.metadata.name.clone().unwrap_or_default();
                check_name(&name, &d.file, &mut seen_bindings)?;
                let errors = validate_binding(&b);
                if !errors.is_empty() {
                    return Err(format!("ValidatingAdmissionPolicyBinding {name:?}: {}", aggregate(errors)));
                }
                bindings.push((d.file.clone(), b));
            }
            (v, k) => {
                return Err(format!(
                    "error loading {}: unsupported resource type {v}, Kind={k} (this directory holds {GROUP_VERSION} \
                     ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding)",
                    d.file.display()
                ))
            }
        }
    }
    for (_, b) in &bindings {
        let policy = b.spec.policy_name.clone();
        if !policies.iter().any(|p| p.name == policy) {
            return Err(format!(
                "binding {:?} references policy {policy:?} which does not exist in the manifest directory",
                b.metadata.name.clone().unwrap_or_default()
            ));
        }
    }
    let (n_policies, n_bindings) = (policies.len(), bindings.len());
    let compiled = bindings.iter().map(|(_, b)| Arc::new(Binding::compile(b))).collect();
    Ok(Loaded { hooks: hooks(policies, compiled), hash: read.hash, policies: n_policies, bindings: n_bindings })
}

/// Loads `dir` into `policies` now (an error stops the start), then reloads it on every change until `stop`.
pub fn start(
    dir: PathBuf,
    policies: &Policies,
    apiserver_id_hash: String,
    stop: CancellationToken,
) -> Result<(), String> {
    let policies = policies.clone();
    manifest::start(dir, PLUGIN, apiserver_id_hash, stop, load_for_start, move |hooks| policies.set_manifests(hooks))
}

fn load_for_start(dir: &Path) -> Result<manifest::Loaded<Vec<Hook>>, String> {
    let l = load(dir)?;
    Ok(manifest::Loaded { value: l.hooks, hash: l.hash, count: l.policies + l.bindings })
}
