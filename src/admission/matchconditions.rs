//! `matchConditions` of webhooks and policies (k8s.io/apiserver `webhook/matchconditions`): CEL expressions that
//! must all hold for the webhook to be called or the policy to be evaluated. All are evaluated in order within one
//! budget; any `false` excludes (even when another one failed); otherwise an error counts as the failure policy
//! says: `Fail` refuses the request, `Ignore` excludes.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::MatchCondition;

use super::activation::Reads;
use crate::admission::metrics::MatchConditionLabels;
use crate::cel::{self, Activation, Budget, EvalError};

/// kube's budget for a webhook's or a binding's match conditions (`RuntimeCELCostBudgetMatchConditions`).
pub const BUDGET: u64 = 2_500_000;

#[derive(Debug)]
struct Condition {
    name: String,
    expression: String,
    program: Result<cel::Program, cel::CompileError>,
}

/// The compiled match conditions of one webhook or policy.
#[derive(Debug, Default)]
pub struct MatchConditions {
    conditions: Vec<Condition>,
    reads: Reads,
}

/// What the conditions decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched {
    Yes,
    /// This condition was false.
    No(String),
    /// No condition was false, and these failed (worded as kube words them, several as `[e1, e2]`).
    Error(String),
}

/// An expression's error as k8s.io/apiserver's `cel/activation.go` words it.
pub(crate) fn expression_error(expression: &str, e: &EvalError) -> String {
    match e {
        EvalError::OutOfBudget => e.to_string(),
        _ => format!("expression '{expression}' resulted in error: {e}"),
    }
}

pub(crate) fn compile_error(e: &cel::CompileError) -> String {
    format!("compilation error: compilation failed: {e}")
}

/// Several errors as one, as `utilerrors.NewAggregate` prints them.
pub(crate) fn aggregate(mut errors: Vec<String>) -> String {
    errors.dedup();
    match errors.len() {
        1 => errors.remove(0),
        _ => format!("[{}]", errors.join(", ")),
    }
}

impl MatchConditions {
    /// Compiles `conditions` for an environment declaring `declared`; an expression that does not compile is kept
    /// as an error that counts when it is evaluated, as kube does for stored expressions.
    pub fn compile(conditions: &[MatchCondition], declared: &[&str]) -> Self {
        let conditions = conditions
            .iter()
            .map(|c| Condition {
                name: c.name.clone(),
                expression: c.expression.clone(),
                program: cel::compile(&c.expression, declared),
            })
            .collect::<Vec<Condition>>();
        let reads = Reads::of(conditions.iter().filter_map(|c| c.program.as_ref().ok()));
        Self { conditions, reads }
    }

    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty()
    }

    /// What the conditions read.
    pub(crate) fn reads(&self) -> &Reads {
        &self.reads
    }

    /// The compiled conditions.
    pub(crate) fn programs(&self) -> impl Iterator<Item = &cel::Program> {
        self.conditions.iter().filter_map(|c| c.program.as_ref().ok())
    }

    /// The first compile error, for configurations that must compile to be accepted (manifests).
    pub fn compile_errors(&self) -> impl Iterator<Item = (&str, String)> {
        self.conditions.iter().filter_map(|c| c.program.as_ref().err().map(|e| (c.name.as_str(), compile_error(e))))
    }

    /// Evaluates every condition against `activation`.
    pub fn evaluate(&self, activation: &Activation) -> Matched {
        self.evaluate_counting(activation).0
    }

    /// The decision, and how many conditions failed to evaluate.
    fn evaluate_counting(&self, activation: &Activation) -> (Matched, u64) {
        let mut budget = Budget::new(BUDGET);
        let mut errors = Vec::new();
        for c in &self.conditions {
            let program = match &c.program {
                Ok(p) => p,
                Err(e) => {
                    errors.push(compile_error(e));
                    continue;
                }
            };
            match program.eval(activation, &mut budget) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return (Matched::No(c.name.clone()), errors.len() as u64),
                Ok(other) => errors.push(format!(
                    "expression '{}' resulted in error: must evaluate to bool but got {}",
                    c.expression,
                    cel::value::type_name(&other)
                )),
                // Out of budget ends the evaluation, whatever the later conditions would say; kube does not count
                // it as an evaluation error.
                Err(EvalError::OutOfBudget) => {
                    return (Matched::Error(EvalError::OutOfBudget.to_string()), errors.len() as u64)
                }
                Err(e) => errors.push(expression_error(&c.expression, &e)),
            }
        }
        let n = errors.len() as u64;
        if errors.is_empty() {
            (Matched::Yes, 0)
        } else {
            (Matched::Error(aggregate(errors)), n)
        }
    }
}

/// Evaluates `conditions` (off the runtime when they ask the authorizer) and records it as kube's matcher does:
/// errors counted, the time observed unless every condition held.
pub(crate) async fn evaluate(
    conditions: &Arc<MatchConditions>,
    activation: Activation,
    labels: &MatchConditionLabels,
) -> Matched {
    let blocking = conditions.reads.authorizer;
    let c = conditions.clone();
    let started = std::time::Instant::now();
    let (matched, errors) = super::activation::evaluate(
        blocking,
        move || c.evaluate_counting(&activation),
        || (Matched::Error("the server is shutting down".into()), 0),
    )
    .await;
    let m = crate::admission::metrics::metrics();
    if errors > 0 {
        m.match_condition_errors.get_or_create(labels).inc_by(errors);
    }
    if matched != Matched::Yes {
        m.match_condition_duration.get_or_create(labels).observe(started.elapsed().as_secs_f64());
    }
    matched
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::activation::DECLARED;
    use crate::cel::value::from_json;
    use serde_json::json;

    fn conditions(exprs: &[(&str, &str)]) -> MatchConditions {
        let list: Vec<MatchCondition> =
            exprs.iter().map(|(n, e)| MatchCondition { name: n.to_string(), expression: e.to_string() }).collect();
        MatchConditions::compile(&list, DECLARED)
    }

    fn act() -> Activation {
        let mut a = Activation::new();
        a.bind("object", from_json(&json!({"metadata": {"name": "web", "labels": {"tier": "db"}}})));
        a.bind("oldObject", cel::Value::Null);
        a.bind(
            "request",
            from_json(&json!({"userInfo": {"username": "admin", "groups": ["system:masters"]}, "dryRun": false})),
        );
        a
    }

    #[test]
    fn all_must_hold_and_false_wins_over_errors() {
        let all = conditions(&[
            ("not-masters", "!('system:masters' in request.userInfo.groups)"),
            ("db", "object.metadata.labels.tier == 'db'"),
        ]);
        assert_eq!(all.evaluate(&act()), Matched::No("not-masters".into()));
        let ok = conditions(&[("db", "object.metadata.labels.tier == 'db'"), ("no-dry-run", "!request.dryRun")]);
        assert_eq!(ok.evaluate(&act()), Matched::Yes);
        let error_then_false = conditions(&[("broken", "object.spec.x == 1"), ("false", "request.dryRun")]);
        assert_eq!(error_then_false.evaluate(&act()), Matched::No("false".into()));
        let errors = conditions(&[("a", "object.spec.x == 1"), ("b", "1 / 0 == 1"), ("c", "'x'")]);
        assert_eq!(
            errors.evaluate(&act()),
            Matched::Error(
                "[expression 'object.spec.x == 1' resulted in error: no such key: spec, expression '1 / 0 == 1' \
                 resulted in error: division by zero, expression ''x'' resulted in error: must evaluate to bool but \
                 got string]"
                    .into()
            )
        );
        let uncompiled = conditions(&[("p", "params.x")]);
        let Matched::Error(e) = uncompiled.evaluate(&act()) else { panic!() };
        assert!(
            e.starts_with("compilation error: compilation failed: ERROR: <input>: undeclared reference to 'params'"),
            "{e}"
        );
        assert_eq!(uncompiled.compile_errors().count(), 1);
    }

    #[test]
    fn the_budget_is_shared_by_all_conditions() {
        let heavy = "lists.range(250).all(a, lists.range(250).all(b, a + b >= 0))";
        let c = conditions(&[("a", heavy), ("b", heavy), ("c", heavy), ("d", heavy), ("e", heavy)]);
        assert_eq!(c.evaluate(&act()), Matched::Error(EvalError::OutOfBudget.to_string()));
    }
}
