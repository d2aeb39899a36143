//! What a MutatingAdmissionPolicy adds to a policy's spec, compiled (`mutating/compilation.go`): its mutations, each
//! an ApplyConfiguration or a JSONPatch expression compiled with the mutation library (`Object{...}`,
//! `JSONPatch{...}`), and its reinvocation policy; and the kind's checks of a policy and binding from manifests.

use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};

use crate::admission::policy::manifests::{check_spec, static_binding};
use crate::admission::policy::{Binding, Body, Declared, Origin, Policy, PolicyKind, Spec};
use crate::cel::{self, CompileError, Program, Returns};

/// How a mutation changes the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    /// Merged into the object by its schema, as server-side apply merges (`patch/smd.go`).
    ApplyConfiguration,
    /// JSON patch operations (`patch/json_patch.go`).
    JsonPatch,
}

/// The change a mutation's expression evaluated to.
#[derive(Debug, Clone)]
pub(crate) enum Patch {
    /// An ApplyConfiguration's object.
    Apply(serde_json::Value),
    /// JSON patch operations.
    Operations(Vec<serde_json::Value>),
}

/// One of `spec.mutations`.
#[derive(Debug)]
pub(crate) struct Mutation {
    pub(crate) patch_type: PatchType,
    pub(crate) program: Result<Program, CompileError>,
    /// For an expression that reads nothing of the request (a sidecar to add), its one outcome, once evaluated.
    pub(crate) constant: Option<OnceLock<Result<Patch, String>>>,
}

/// A MutatingAdmissionPolicy's own part.
#[derive(Debug)]
pub struct Mutations {
    pub(crate) mutations: Vec<Mutation>,
    /// `reinvocationPolicy: IfNeeded`.
    pub(crate) reinvoke_if_needed: bool,
}

/// A compiled MutatingAdmissionPolicy.
pub type MutatingPolicy = Policy<Mutations>;

impl Body for Mutations {
    fn programs(&self) -> Vec<&Program> {
        self.mutations.iter().filter_map(|m| m.program.as_ref().ok()).collect()
    }

    fn compile_errors(&self) -> Vec<(String, &CompileError)> {
        let field = |i: usize, t: PatchType| match t {
            PatchType::ApplyConfiguration => format!("spec.mutations[{i}].applyConfiguration.expression"),
            PatchType::JsonPatch => format!("spec.mutations[{i}].jsonPatch.expression"),
        };
        let errors = self.mutations.iter().enumerate();
        errors.filter_map(|(i, m)| m.program.as_ref().err().map(|e| (field(i, m.patch_type), e))).collect()
    }
}

/// MutatingAdmissionPolicies and their bindings.
#[derive(Debug)]
pub struct MutatingKind;

fn spec_of(p: &MutatingAdmissionPolicy) -> Spec<'_> {
    let Some(spec) = &p.spec else { return Spec::default() };
    Spec {
        failure_policy: spec.failure_policy.as_deref(),
        match_constraints: spec.match_constraints.as_ref(),
        match_conditions: spec.match_conditions.as_deref().unwrap_or_default(),
        variables: spec.variables.as_deref().unwrap_or_default(),
        param_kind: spec.param_kind.as_ref(),
    }
}

impl PolicyKind for MutatingKind {
    const PLUGIN: &'static str = "MutatingAdmissionPolicy";
    const POLICY: (&'static str, &'static str) = ("MutatingAdmissionPolicy", "mutatingadmissionpolicies");
    const BINDING: (&'static str, &'static str) = ("MutatingAdmissionPolicyBinding", "mutatingadmissionpolicybindings");
    const SINCE: &'static str = "1.36";

    type Policy = MutatingAdmissionPolicy;
    type Binding = MutatingAdmissionPolicyBinding;
    type Body = Mutations;

    fn compile(p: &MutatingAdmissionPolicy, origin: Origin) -> MutatingPolicy {
        let spec = p.spec.as_ref();
        Policy::compile(&p.metadata, spec_of(p), origin, |names: &Declared| {
            // A mutation of an unknown patch type has no patcher in kube either; validation refuses it.
            let mutations = spec.and_then(|s| s.mutations.as_ref()).into_iter().flatten().filter_map(|m| {
                let (patch_type, expression, returns) = match m.patch_type.as_str() {
                    "ApplyConfiguration" => {
                        let e = m.apply_configuration.as_ref().and_then(|a| a.expression.as_deref());
                        (PatchType::ApplyConfiguration, e, Returns::Object)
                    }
                    "JSONPatch" => (
                        PatchType::JsonPatch,
                        m.json_patch.as_ref().and_then(|j| j.expression.as_deref()),
                        Returns::JsonPatches,
                    ),
                    _ => return None,
                };
                let program = cel::compile_mutation(expression.unwrap_or_default(), &names.full, returns);
                let constant = program.as_ref().is_ok_and(Program::reads_nothing).then(OnceLock::new);
                Some(Mutation { patch_type, program, constant })
            });
            Mutations {
                mutations: mutations.collect(),
                reinvoke_if_needed: spec.and_then(|s| s.reinvocation_policy.as_deref()) == Some("IfNeeded"),
            }
        })
    }

    fn binding(b: &MutatingAdmissionPolicyBinding) -> Binding {
        let spec = b.spec.clone().unwrap_or_default();
        let policy = spec.policy_name.as_deref().unwrap_or_default();
        Binding::new(&b.metadata, policy, spec.match_resources.as_ref(), spec.param_ref.as_ref(), Vec::new())
    }

    fn check_policy(p: &MutatingAdmissionPolicy) -> Vec<String> {
        let Some(spec) = &p.spec else {
            return vec!["spec.matchConstraints: Required value".into()];
        };
        let mut errors = Vec::new();
        let mutations = spec.mutations.as_deref().unwrap_or_default();
        if mutations.is_empty() {
            errors.push("spec.mutations: Required value: mutations must contain at least one item".into());
        }
        for (i, m) in mutations.iter().enumerate() {
            let (field, expression) = match m.patch_type.as_str() {
                "ApplyConfiguration" => {
                    ("applyConfiguration", m.apply_configuration.as_ref().map(|a| a.expression.as_deref()))
                }
                "JSONPatch" => ("jsonPatch", m.json_patch.as_ref().map(|j| j.expression.as_deref())),
                "" => {
                    errors.push(format!("spec.mutations[{i}].patchType: Required value"));
                    continue;
                }
                other => {
                    errors.push(format!(
                        "spec.mutations[{i}].patchType: Unsupported value: {other:?}: supported values: \
                         \"ApplyConfiguration\", \"JSONPatch\""
                    ));
                    continue;
                }
            };
            match expression {
                None => errors.push(format!(
                    "spec.mutations[{i}].{field}: Required value: must be specified when patchType is {}",
                    m.patch_type
                )),
                Some(e) if e.is_none_or(|e| e.trim().is_empty()) => {
                    errors.push(format!("spec.mutations[{i}].{field}.expression: Required value"))
                }
                Some(_) => {}
            }
        }
        match spec.reinvocation_policy.as_deref() {
            None | Some("") => errors.push("spec.reinvocationPolicy: Required value".into()),
            Some("Never" | "IfNeeded") => {}
            Some(other) => errors.push(format!(
                "spec.reinvocationPolicy: Unsupported value: {other:?}: supported values: \"IfNeeded\", \"Never\""
            )),
        }
        check_spec(&spec_of(p), errors)
    }

    fn check_binding(b: &MutatingAdmissionPolicyBinding) -> Vec<String> {
        let spec = b.spec.clone().unwrap_or_default();
        static_binding(&b.metadata, spec.policy_name.as_deref().unwrap_or_default(), spec.param_ref.is_some())
    }
}
