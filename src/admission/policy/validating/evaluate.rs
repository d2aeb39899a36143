//! One policy × binding × param against one request, as k8s.io/apiserver's `validating/validator.go`: match
//! conditions (their own budget, no namespace object), then every validation and its messageExpression (one
//! budget), then the audit annotations (a fresh budget). Synchronous, so an evaluation that asks the authorizer
//! runs on a blocking thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::compiled::ValidatingPolicy as Policy;
use crate::admission::matchconditions::{compile_error, expression_error, Matched};
use crate::cel::{self, Activation, Budget, EvalError, RUNTIME_BUDGET};

/// A messageExpression's result longer than this is not used (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// What the policy says of the request, by validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Admit,
    Deny,
}

/// How the decision came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evaluation {
    Admit,
    Deny,
    Error,
}

#[derive(Debug, Clone)]
pub(crate) struct Decision {
    pub(crate) action: Action,
    pub(crate) evaluation: Evaluation,
    pub(crate) message: String,
    /// The validation's reason (empty: `Invalid`).
    pub(crate) reason: String,
    /// The validation's index in `spec.validations` (0 for an error of the whole evaluation).
    pub(crate) index: usize,
    pub(crate) elapsed: Duration,
}

/// An audit annotation's outcome: a value to publish, or an error that refuses the request whatever the
/// binding's actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Annotation {
    Publish { key: String, value: String },
    Error(String),
}

#[derive(Debug, Default)]
pub(crate) struct Result {
    pub(crate) decisions: Vec<Decision>,
    pub(crate) annotations: Vec<Annotation>,
}

/// What the expressions see: `object`, `oldObject`, `request`, `namespaceObject`, `params`, `authorizer`.
#[derive(Clone)]
pub(crate) struct Input {
    pub(crate) object: cel::Value,
    pub(crate) old: cel::Value,
    pub(crate) request: cel::Value,
    pub(crate) namespace: cel::Value,
    pub(crate) params: Option<cel::Value>,
    pub(crate) authorizer: cel::Value,
}

impl Input {
    /// One activation for every phase: the values are converted for the interpreter once.
    fn activation(&self) -> Activation {
        let mut a = Activation::new();
        a.bind("object", self.object.clone())
            .bind("oldObject", self.old.clone())
            .bind("request", self.request.clone())
            .bind("namespaceObject", self.namespace.clone())
            .bind("authorizer", self.authorizer.clone());
        if let Some(p) = &self.params {
            a.bind("params", p.clone());
        }
        a
    }
}

fn error_decision(policy: &Policy, message: String, index: usize, elapsed: Duration) -> Decision {
    let action = if policy.fail_open { Action::Admit } else { Action::Deny };
    Decision { action, evaluation: Evaluation::Error, message, reason: String::new(), index, elapsed }
}

/// A messageExpression's value as the message, when it is one kube would show.
fn usable_message(v: &cel::Value) -> Option<String> {
    let cel::Value::String(s) = v else { return None };
    let s = s.trim();
    (!s.is_empty() && s.len() <= MAX_MESSAGE_BYTES && !s.contains('\n')).then(|| s.to_owned())
}

/// Evaluates `policy` for one binding and param.
pub(crate) fn evaluate(policy: &Arc<Policy>, input: &Input) -> Result {
    let started = Instant::now();
    let mut activation = input.activation();
    if !policy.match_conditions.is_empty() {
        // Match conditions see no namespace object (kube passes none).
        activation.bind("namespaceObject", cel::Value::Null).bind_variables(policy.variables.clone());
        let matched = policy.match_conditions.evaluate(&activation);
        activation.bind("namespaceObject", input.namespace.clone());
        match matched {
            Matched::Yes => {}
            Matched::No(_) => return Result::default(),
            Matched::Error(message) => {
                return Result {
                    decisions: vec![error_decision(policy, message, 0, started.elapsed())],
                    annotations: Vec::new(),
                }
            }
        }
    }

    // Validations and their messages share one budget; each phase evaluates the variables afresh, as kube's.
    activation.bind_variables(policy.variables.clone());
    let mut budget = Budget::default();
    let mut decisions = Vec::with_capacity(policy.body.validations.len());
    for (i, v) in policy.body.validations.iter().enumerate() {
        let began = Instant::now();
        let program = match &v.program {
            Ok(p) => p,
            Err(e) => {
                decisions.push(error_decision(policy, compile_error(e), i, began.elapsed()));
                continue;
            }
        };
        let decision = match program.eval(&activation, &mut budget) {
            Ok(cel::Value::Bool(true)) => Decision {
                action: Action::Admit,
                evaluation: Evaluation::Admit,
                message: String::new(),
                reason: String::new(),
                index: i,
                elapsed: began.elapsed(),
            },
            Ok(cel::Value::Bool(false)) => Decision {
                action: Action::Deny,
                evaluation: Evaluation::Deny,
                message: String::new(),
                reason: v.reason.clone().unwrap_or_default(),
                index: i,
                elapsed: began.elapsed(),
            },
            Ok(other) => error_decision(
                policy,
                format!(
                    "expression '{}' resulted in error: must evaluate to bool but got {}",
                    v.expression,
                    cel::value::type_name(&other)
                ),
                i,
                began.elapsed(),
            ),
            // The budget is spent: nothing more is evaluated, and the whole evaluation is this one error.
            Err(EvalError::OutOfBudget) => {
                let message = EvalError::OutOfBudget.to_string();
                return Result {
                    decisions: vec![error_decision(policy, message, 0, started.elapsed())],
                    annotations: Vec::new(),
                };
            }
            Err(e) => error_decision(policy, expression_error(&v.expression, &e), i, began.elapsed()),
        };
        decisions.push(decision);
    }

    // Messages: every messageExpression, on what is left of the budget (compiled without the authorizer).
    activation.bind_variables(policy.variables.clone());
    let messages = &activation;
    for i in 0..decisions.len() {
        let v = &policy.body.validations[i];
        let from_expression = match &v.message_expression {
            Some((_, Ok(p))) => match p.eval(messages, &mut budget) {
                Ok(value) => usable_message(&value),
                // Out of budget: every decision not already an error becomes this one.
                Err(EvalError::OutOfBudget) => {
                    let failed = format!("failed messageExpression: {}", EvalError::OutOfBudget);
                    for d in decisions.iter_mut().filter(|d| d.evaluation != Evaluation::Error) {
                        *d = error_decision(policy, failed.clone(), d.index, d.elapsed);
                    }
                    return Result { decisions, annotations: annotations(policy, activation) };
                }
                Err(e) => {
                    tracing::debug!(policy = %policy.name, error = %e, "messageExpression failed");
                    None
                }
            },
            _ => None,
        };
        let d = &mut decisions[i];
        if d.evaluation == Evaluation::Deny {
            d.message = from_expression
                .or_else(|| v.message.as_deref().map(str::trim).filter(|m| !m.is_empty()).map(str::to_owned))
                .unwrap_or_else(|| format!("failed expression: {}", v.expression.trim()));
        }
    }

    Result { decisions, annotations: annotations(policy, activation) }
}

/// The audit annotations, on a fresh budget; the authorizer is declared for them but not bound, as in kube.
fn annotations(policy: &Policy, mut activation: Activation) -> Vec<Annotation> {
    if policy.body.audit_annotations.is_empty() {
        return Vec::new();
    }
    activation.bind("authorizer", cel::Value::Null).bind_variables(policy.variables.clone());
    let mut budget = Budget::new(RUNTIME_BUDGET);
    let mut out = Vec::new();
    for a in &policy.body.audit_annotations {
        let program = match &a.program {
            Ok(p) => p,
            Err(e) if !policy.fail_open => {
                out.push(Annotation::Error(compile_error(e)));
                continue;
            }
            Err(_) => continue,
        };
        match program.eval(&activation, &mut budget) {
            Ok(cel::Value::String(s)) if !s.trim().is_empty() => {
                out.push(Annotation::Publish { key: a.key.clone(), value: s.trim().to_owned() })
            }
            Ok(cel::Value::String(_) | cel::Value::Null) => {}
            Ok(other) => out.push(Annotation::Error(format!(
                "valueExpression '{}' resulted in unsupported return type: {}. Return type must be either string or null.",
                a.value_expression,
                cel::value::type_name(&other)
            ))),
            Err(EvalError::OutOfBudget) if !policy.fail_open => {
                out.push(Annotation::Error(EvalError::OutOfBudget.to_string()));
                break;
            }
            Err(EvalError::OutOfBudget) => break,
            Err(e) if !policy.fail_open => out.push(Annotation::Error(expression_error(&a.value_expression, &e))),
            Err(_) => {}
        }
    }
    out
}
