//! What a ValidatingAdmissionPolicy adds to a policy's spec, compiled (`validating/plugin.go`'s
//! `compilePolicy`): its validations with their messages, and its audit annotations; and the kind's checks of a
//! policy and binding from manifests.

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};

use crate::admission::policy::manifests::{check_spec, static_binding};
use crate::admission::policy::{Binding, Body, Declared, Origin, Policy, PolicyKind, Spec};
use crate::cel::{self, CompileError, Program};

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

/// A ValidatingAdmissionPolicy's own part.
#[derive(Debug)]
pub struct Validations {
    pub(crate) validations: Vec<Validation>,
    pub(crate) audit_annotations: Vec<AuditAnnotation>,
}

/// A compiled ValidatingAdmissionPolicy.
pub type ValidatingPolicy = Policy<Validations>;

impl Body for Validations {
    fn programs(&self) -> Vec<&Program> {
        self.validations
            .iter()
            .flat_map(|v| std::iter::once(&v.program).chain(v.message_expression.as_ref().map(|(_, m)| m)))
            .chain(self.audit_annotations.iter().map(|a| &a.program))
            .filter_map(|r| r.as_ref().ok())
            .collect()
    }

    fn compile_errors(&self) -> Vec<(String, &CompileError)> {
        let mut out = Vec::new();
        for (i, v) in self.validations.iter().enumerate() {
            if let Err(e) = &v.program {
                out.push((format!("spec.validations[{i}].expression"), e));
            }
            if let Some((_, Err(e))) = &v.message_expression {
                out.push((format!("spec.validations[{i}].messageExpression"), e));
            }
        }
        for (i, a) in self.audit_annotations.iter().enumerate() {
            if let Err(e) = &a.program {
                out.push((format!("spec.auditAnnotations[{i}].valueExpression"), e));
            }
        }
        out
    }
}

/// ValidatingAdmissionPolicies and their bindings.
#[derive(Debug)]
pub struct ValidatingKind;

impl PolicyKind for ValidatingKind {
    const PLUGIN: &'static str = "ValidatingAdmissionPolicy";
    const POLICY: (&'static str, &'static str) = ("ValidatingAdmissionPolicy", "validatingadmissionpolicies");
    const BINDING: (&'static str, &'static str) =
        ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings");
    const SINCE: &'static str = "1.30";

    type Policy = ValidatingAdmissionPolicy;
    type Binding = ValidatingAdmissionPolicyBinding;
    type Body = Validations;

    fn compile(p: &ValidatingAdmissionPolicy, origin: Origin) -> ValidatingPolicy {
        let spec = p.spec.clone().unwrap_or_default();
        let common = Spec {
            failure_policy: spec.failure_policy.as_deref(),
            match_constraints: spec.match_constraints.as_ref(),
            match_conditions: spec.match_conditions.as_deref().unwrap_or_default(),
            variables: spec.variables.as_deref().unwrap_or_default(),
            param_kind: spec.param_kind.as_ref(),
        };
        Policy::compile(&p.metadata, common, origin, |names: &Declared| Validations {
            validations: spec
                .validations
                .iter()
                .flatten()
                .map(|v| Validation {
                    expression: v.expression.clone(),
                    program: cel::compile(&v.expression, &names.full),
                    message: v.message.clone(),
                    message_expression: v
                        .message_expression
                        .as_ref()
                        .map(|m| (m.clone(), cel::compile(m, &names.without_authorizer))),
                    reason: v.reason.clone(),
                })
                .collect(),
            audit_annotations: spec
                .audit_annotations
                .iter()
                .flatten()
                .map(|a| AuditAnnotation {
                    key: a.key.clone(),
                    value_expression: a.value_expression.clone(),
                    program: cel::compile(&a.value_expression, &names.full),
                })
                .collect(),
        })
    }

    fn binding(b: &ValidatingAdmissionPolicyBinding) -> Binding {
        let spec = &b.spec;
        Binding::new(
            &b.metadata,
            &spec.policy_name,
            spec.match_resources.as_ref(),
            spec.param_ref.as_ref(),
            spec.validation_actions.clone(),
        )
    }

    fn check_policy(p: &ValidatingAdmissionPolicy) -> Vec<String> {
        let Some(spec) = &p.spec else {
            return vec!["spec.matchConstraints: Required value".into()];
        };
        let common = Spec {
            failure_policy: spec.failure_policy.as_deref(),
            match_constraints: spec.match_constraints.as_ref(),
            match_conditions: spec.match_conditions.as_deref().unwrap_or_default(),
            variables: spec.variables.as_deref().unwrap_or_default(),
            param_kind: spec.param_kind.as_ref(),
        };
        let mut errors = Vec::new();
        if spec.validations.as_ref().is_none_or(Vec::is_empty)
            && spec.audit_annotations.as_ref().is_none_or(Vec::is_empty)
        {
            errors.push(
                "spec.validations: Required value: validations or auditAnnotations must contain at least one item"
                    .into(),
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
            if let Some(r) =
                v.reason.as_deref().filter(|r| !["Forbidden", "Invalid", "RequestEntityTooLarge"].contains(r))
            {
                errors.push(format!(
                    "spec.validations[{i}].reason: Unsupported value: {r:?}: supported values: \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\""
                ));
            }
        }
        check_spec(&common, errors)
    }

    fn check_binding(b: &ValidatingAdmissionPolicyBinding) -> Vec<String> {
        let spec = &b.spec;
        let mut errors = static_binding(&b.metadata, &spec.policy_name, spec.param_ref.is_some());
        let actions = &spec.validation_actions;
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
}
