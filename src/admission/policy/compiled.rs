//! A ValidatingAdmissionPolicy and its bindings as the plugin evaluates them: expressions compiled once per
//! version of the policy (`validating/plugin.go`'s `compilePolicy`), selectors parsed once. An expression that
//! does not compile is kept as its error and counts when it is evaluated, as kube does for stored policies;
//! manifests refuse such a policy when they are loaded.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ParamKind, ParamRef, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

use super::matching::Matcher;
use crate::admission::activation::Reads;
use crate::admission::matchconditions::MatchConditions;
use crate::cel::{self, CompileError, Program, Variables};

/// The names policy expressions may use (`compile.go`'s declarations), with `params` when the policy has a
/// `paramKind`.
fn declared(params: bool, authorizer: bool) -> Vec<&'static str> {
    let mut d = vec!["object", "oldObject", "request", "namespaceObject", "variables"];
    if params {
        d.push("params");
    }
    if authorizer {
        d.push("authorizer");
    }
    d
}

/// One of `spec.validations`.
#[derive(Debug)]
pub(crate) struct Validation {
    pub(crate) expression: String,
    pub(crate) program: Result<Program, CompileError>,
    pub(crate) message: Option<String>,
    pub(crate) message_expression: Option<(String, Result<Program, CompileError>)>,
    pub(crate) reason: Option<String>,
}

/// One of `spec.auditAnnotations`.
#[derive(Debug)]
pub(crate) struct AuditAnnotation {
    pub(crate) key: String,
    pub(crate) value_expression: String,
    pub(crate) program: Result<Program, CompileError>,
}

/// Where a policy or binding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A file of `staticManifestsDir`: in force from the start, not an API object.
    Manifest,
    /// The main API server's `admissionregistration.k8s.io/v1`.
    Cluster,
}

/// A compiled ValidatingAdmissionPolicy.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    pub origin: Origin,
    /// The version compiled (its resourceVersion), so an unchanged policy is not compiled again.
    pub resource_version: String,
    pub(crate) fail_open: bool,
    pub(crate) matcher: Option<Matcher>,
    pub(crate) match_conditions: Arc<MatchConditions>,
    pub(crate) variables: Arc<Variables>,
    pub(crate) validations: Vec<Validation>,
    pub(crate) audit_annotations: Vec<AuditAnnotation>,
    pub(crate) param_kind: Option<ParamKind>,
    /// What its expressions read of the request, so nothing else is built for them.
    pub(crate) reads: Reads,
}

/// A compiled ValidatingAdmissionPolicyBinding.
#[derive(Debug)]
pub struct Binding {
    pub name: String,
    pub policy_name: String,
    pub resource_version: String,
    pub(crate) matcher: Option<Matcher>,
    pub(crate) param_ref: Option<ParamRef>,
    /// `validationActions`, in their order.
    pub(crate) actions: Vec<String>,
}

fn compile_all(expr: &str, declared: &[&str]) -> Result<Program, CompileError> {
    cel::compile(expr, declared)
}

impl Policy {
    pub fn compile(p: &ValidatingAdmissionPolicy, origin: Origin) -> Self {
        let spec = p.spec.clone().unwrap_or_default();
        let params = spec.param_kind.is_some();
        let full = declared(params, true);
        let without_authorizer = declared(params, false);
        // A variable sees the ones declared before it only; `variables.<later>` fails when evaluated.
        let mut defs = Vec::new();
        for v in spec.variables.iter().flatten() {
            let earlier: Vec<String> = defs.iter().map(|(n, _): &(String, _)| n.clone()).collect();
            let program = compile_all(&v.expression, &full).and_then(|p| {
                match p.variables_read().iter().find(|r| !earlier.contains(r)) {
                    Some(later) => Err(CompileError::new(format!(
                        "ERROR: <input>: undefined field '{later}': a variable may only use those declared before it"
                    ))),
                    None => Ok(Arc::new(p)),
                }
            });
            defs.push((v.name.clone(), program));
        }
        let validations: Vec<Validation> = spec
            .validations
            .iter()
            .flatten()
            .map(|v| Validation {
                expression: v.expression.clone(),
                program: compile_all(&v.expression, &full),
                message: v.message.clone(),
                message_expression: v
                    .message_expression
                    .as_ref()
                    .map(|m| (m.clone(), compile_all(m, &without_authorizer))),
                reason: v.reason.clone(),
            })
            .collect();
        let audit_annotations: Vec<AuditAnnotation> = spec
            .audit_annotations
            .iter()
            .flatten()
            .map(|a| AuditAnnotation {
                key: a.key.clone(),
                value_expression: a.value_expression.clone(),
                program: compile_all(&a.value_expression, &full),
            })
            .collect();
        let match_conditions = MatchConditions::compile(spec.match_conditions.as_deref().unwrap_or_default(), &full);
        let programs = validations
            .iter()
            .flat_map(|v| std::iter::once(&v.program).chain(v.message_expression.as_ref().map(|(_, m)| m)))
            .chain(audit_annotations.iter().map(|a| &a.program))
            .filter_map(|r| r.as_ref().ok())
            .chain(defs.iter().filter_map(|(_, r)| r.as_deref().ok()))
            .chain(match_conditions.programs());
        let reads = Reads::of(programs);
        Self {
            name: p.metadata.name.clone().unwrap_or_default(),
            origin,
            resource_version: p.metadata.resource_version.clone().unwrap_or_default(),
            fail_open: spec.failure_policy.as_deref() == Some("Ignore"),
            matcher: spec.match_constraints.as_ref().map(Matcher::new),
            match_conditions: Arc::new(match_conditions),
            variables: Arc::new(Variables::new(defs)),
            validations,
            audit_annotations,
            param_kind: spec.param_kind,
            reads,
        }
    }

    /// Every expression's compile error, worded as kube's validation words them, with the field.
    pub fn compile_errors(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut add = |field: String, e: &CompileError| out.push((field, format!("compilation failed: {e}")));
        for (i, (_, p)) in self.variables.definitions().enumerate() {
            if let Err(e) = p {
                add(format!("spec.variables[{i}].expression"), e);
            }
        }
        for (i, v) in self.validations.iter().enumerate() {
            if let Err(e) = &v.program {
                add(format!("spec.validations[{i}].expression"), e);
            }
            if let Some((_, Err(e))) = &v.message_expression {
                add(format!("spec.validations[{i}].messageExpression"), e);
            }
        }
        for (i, a) in self.audit_annotations.iter().enumerate() {
            if let Err(e) = &a.program {
                add(format!("spec.auditAnnotations[{i}].valueExpression"), e);
            }
        }
        for (i, (_, e)) in self.match_conditions.compile_errors().enumerate() {
            out.push((format!("spec.matchConditions[{i}].expression"), e));
        }
        out
    }
}

impl Binding {
    pub fn compile(b: &ValidatingAdmissionPolicyBinding) -> Self {
        let spec = b.spec.clone();
        let actions = spec.validation_actions;
        Self {
            name: b.metadata.name.clone().unwrap_or_default(),
            policy_name: spec.policy_name,
            resource_version: b.metadata.resource_version.clone().unwrap_or_default(),
            matcher: spec.match_resources.as_ref().map(Matcher::new),
            param_ref: spec.param_ref,
            actions,
        }
    }
}
