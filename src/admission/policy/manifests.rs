//! Policies and bindings of a kind from its plugin's `staticManifestsDir` (KEP-5793): checked as the API would
//! check them, plus the manifest rules (names ending in `.static.k8s.io`, no `paramKind`, no `paramRef`, bindings only to
//! policies of the same directory) and compiled at load: a policy that does not compile is refused here, not on
//! every request. A bad directory stops the start; a bad edit while serving keeps the last good set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use tokio_util::sync::CancellationToken;

use super::{hooks, Binding, Hook, Origin, PolicyKind, PolicySet, Spec};
use crate::admission::manifest::{self, check_name, Document, STATIC_SUFFIX};
use crate::admission::matchconditions::aggregate;
use crate::api::strict::decode_strict_value;
use crate::api::validation::qualified_name_errors;

const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";

/// A directory's policies, paired with their bindings.
#[derive(Debug)]
pub struct Loaded<K: PolicyKind> {
    pub hooks: Vec<Hook<K>>,
    pub hash: String,
    pub policies: usize,
    pub bindings: usize,
}

/// kube's REST validation of what every policy's spec has, around what its kind checks (`body`): in kube's order.
pub(crate) fn check_spec(spec: &Spec<'_>, body: Vec<String>) -> Vec<String> {
    let mut errors = Vec::new();
    match spec.match_constraints {
        None => errors.push("spec.matchConstraints: Required value".into()),
        Some(m) if m.resource_rules.as_ref().is_none_or(Vec::is_empty) => {
            errors.push("spec.matchConstraints.resourceRules: Required value".into())
        }
        Some(_) => {}
    }
    if let Some(f) = spec.failure_policy.filter(|f| !["Fail", "Ignore"].contains(f)) {
        errors.push(format!("spec.failurePolicy: Unsupported value: {f:?}: supported values: \"Fail\", \"Ignore\""));
    }
    errors.extend(body);
    let conditions = spec.match_conditions;
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
    for (i, v) in spec.variables.iter().enumerate() {
        let ident = v.name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && v.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            errors.push(format!(
                "spec.variables[{i}].name: Invalid value: {:?}: name is not a valid CEL identifier",
                v.name
            ));
        }
    }
    errors
}

/// The manifest rules for any binding: it names a policy of the directory, and no params.
pub(crate) fn static_binding(meta: &ObjectMeta, policy: &str, param_ref: bool) -> Vec<String> {
    let name = meta.name.clone().unwrap_or_default();
    let mut errors = Vec::new();
    if policy.is_empty() {
        errors.push(format!("binding {name:?} must reference a policy (spec.policyName)"));
    } else if !policy.ends_with(STATIC_SUFFIX) {
        errors.push(format!("binding {name:?}: spec.policyName {policy:?} must end with {STATIC_SUFFIX:?}"));
    }
    if param_ref {
        errors.push(format!("binding {name:?}: spec.paramRef is not supported for static manifests"));
    }
    errors
}

fn decode<T: serde::de::DeserializeOwned>(d: &Document) -> Result<T, String> {
    decode_strict_value(d.value.clone()).map_err(|e| format!("error loading {}: {e}", d.file.display()))
}

/// Reads, checks and compiles the policies and bindings of `dir`.
pub fn load<K: PolicyKind>(dir: &Path) -> Result<Loaded<K>, String> {
    let read = manifest::read(dir)?;
    let mut policies = Vec::new();
    let mut bindings: Vec<Binding> = Vec::new();
    let (mut seen_policies, mut seen_bindings) = (Vec::new(), Vec::new());
    let (policy_kind, binding_kind) = (K::POLICY.0, K::BINDING.0);
    for d in &read.documents {
        match (d.api_version.as_str(), d.kind.as_str()) {
            (GROUP_VERSION, k) if k == policy_kind => {
                let p: K::Policy = decode(d)?;
                let name = p.meta().name.clone().unwrap_or_default();
                check_name(&name, &d.file, &mut seen_policies)?;
                let compiled = K::compile(&p, Origin::Manifest);
                let mut errors = K::check_policy(&p);
                for (field, e) in compiled.compile_errors() {
                    errors.push(format!("{field}: Invalid value: {e}"));
                }
                if compiled.param_kind.is_some() {
                    errors.push(format!(
                        "{policy_kind} {:?}: spec.paramKind is not supported for static manifests",
                        compiled.name
                    ));
                }
                if !errors.is_empty() {
                    return Err(format!("{policy_kind} {name:?}: {}", aggregate(errors)));
                }
                policies.push(Arc::new(compiled));
            }
            (GROUP_VERSION, k) if k == binding_kind => {
                let b: K::Binding = decode(d)?;
                let name = b.meta().name.clone().unwrap_or_default();
                check_name(&name, &d.file, &mut seen_bindings)?;
                let errors = K::check_binding(&b);
                if !errors.is_empty() {
                    return Err(format!("{binding_kind} {name:?}: {}", aggregate(errors)));
                }
                bindings.push(K::binding(&b));
            }
            (v, k) => {
                return Err(format!(
                    "error loading {}: unsupported resource type {v}, Kind={k} (this directory holds {GROUP_VERSION} \
                     {policy_kind} and {binding_kind})",
                    d.file.display()
                ))
            }
        }
    }
    for b in &bindings {
        if !policies.iter().any(|p| p.name == b.policy_name) {
            return Err(format!(
                "binding {:?} references policy {:?} which does not exist in the manifest directory",
                b.name, b.policy_name
            ));
        }
    }
    let (n_policies, n_bindings) = (policies.len(), bindings.len());
    let compiled = bindings.into_iter().map(Arc::new).collect();
    Ok(Loaded { hooks: hooks::<K>(policies, compiled), hash: read.hash, policies: n_policies, bindings: n_bindings })
}

/// Loads `dir` into `policies` now (an error stops the start), then reloads it on every change until `stop`.
pub fn start<K: PolicyKind>(
    dir: PathBuf,
    policies: &PolicySet<K>,
    apiserver_id_hash: String,
    stop: CancellationToken,
) -> Result<(), String> {
    let policies = policies.clone();
    manifest::start(dir, K::PLUGIN, apiserver_id_hash, stop, load_for_start::<K>, move |hooks| {
        policies.set_manifests(hooks)
    })
}

fn load_for_start<K: PolicyKind>(dir: &Path) -> Result<manifest::Loaded<Vec<Hook<K>>>, String> {
    let l = load::<K>(dir)?;
    Ok(manifest::Loaded { value: l.hooks, hash: l.hash, count: l.policies + l.bindings })
}
