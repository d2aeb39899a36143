//! CEL as Kubernetes evaluates it for admission (k8s.io/apiserver `pkg/cel`): cel-rust's interpreter with
//! Kubernetes' libraries (kube-cel: strings, lists, sets, regex, url, ip and cidr, quantity, semver, format,
//! jsonpatch, math, base64), the authorizer library, and kube's runtime cost limits.
//!
//! An expression is compiled once ([`compile`]: parsed, checked against the names the caller declares, rewritten
//! so evaluation can be metered) and evaluated per request against an [`Activation`]. Evaluation never panics
//! out and never runs past its cost limit: a step over [`PER_CALL_LIMIT`], or over what is left of the caller's
//! [`Budget`], stops it with kube's message.

mod authz;
mod check;
mod cost;
mod library;
mod objects;
mod projection;
pub mod value;
mod variables;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, LazyLock};

use kube_cel::cel::common::ast::IdedExpr;
use kube_cel::cel::parser::Parser;
use kube_cel::cel::{Context, ExecutionError};
use kube_cel::KubeCelExt;

pub use authz::{Authorizer, AuthorizerValue, Check, Decision, ResourceCheck};
pub use cost::{LIMIT_EXCEEDED, PER_CALL_LIMIT, RUNTIME_BUDGET};
pub use kube_cel::cel::objects::Value;
pub use objects::Returns;
pub use projection::Projection;
pub use variables::Variables;

/// cel-go's limit on an expression's length, in code points (`expressionSizeCodePointLimit`).
pub const MAX_EXPRESSION_LENGTH: usize = 100_000;

/// How deep the parser may nest (cel-go's `maxRecursionDepth`, lowered: evaluation recurses as deep).
const PARSER_RECURSION_LIMIT: u16 = 64;

/// The stack an evaluation needs at most: [`check::MAX_DEPTH`] levels of the interpreter's recursion, each a few
/// frames (tens of KiB unoptimized); with less left, evaluation moves to a stack of [`STACK_SIZE`].
const STACK_RED_ZONE: usize = if cfg!(debug_assertions) { 64 << 10 } else { 16 << 10 } * check::MAX_DEPTH;
const STACK_SIZE: usize = 2 * STACK_RED_ZONE;

/// Why an expression does not compile, worded as cel-go's errors (`ERROR: <input>:1:5: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CompileError(String);

impl CompileError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Why an evaluation produced no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The expression failed: a missing key, no such overload, a library function's error.
    #[error("{0}")]
    Runtime(String),
    /// It went over [`PER_CALL_LIMIT`].
    #[error("operation cancelled: actual cost limit exceeded")]
    CostLimit,
    /// It went over what was left of its [`Budget`].
    #[error("validation failed due to running out of cost budget, no further validation rules will be run")]
    OutOfBudget,
}

/// What a policy's expressions may still spend on one request.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    remaining: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self { remaining: RUNTIME_BUDGET }
    }
}

impl Budget {
    pub fn new(remaining: u64) -> Self {
        Self { remaining }
    }

    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

/// The root context: the standard functions, Kubernetes' libraries and this module's own, built once.
static ROOT: LazyLock<Context<'static>> = LazyLock::new(|| {
    let mut ctx = Context::default().with_all();
    ctx.add_function(cost::TICK, cost::tick);
    ctx.add_function(variables::VARIABLE, variables::variable);
    ctx.add_function(objects::OBJECT, objects::object);
    authz::register(&mut ctx);
    library::register(&mut ctx);
    ctx
});

/// A compiled expression.
#[derive(Debug)]
pub struct Program {
    source: String,
    expr: IdedExpr,
    checked: check::Checked,
}

/// Parses and checks `source` for an environment declaring `declared` (`object`, `request`, ...): an undeclared
/// name, a construct the interpreter does not have, or nesting too deep for evaluation is an error here rather
/// than on every request.
pub fn compile(source: &str, declared: &[&str]) -> Result<Program, CompileError> {
    compile_as(source, declared, None)
}

/// [`compile`] for a mutation (a MutatingAdmissionPolicy's ApplyConfiguration or JSONPatch): it may build
/// `Object{...}` and `JSONPatch{...}` values, and must evaluate to what `returns` says.
pub fn compile_mutation(source: &str, declared: &[&str], returns: Returns) -> Result<Program, CompileError> {
    compile_as(source, declared, Some(returns))
}

fn compile_as(source: &str, declared: &[&str], mutation: Option<Returns>) -> Result<Program, CompileError> {
    if source.chars().count() > MAX_EXPRESSION_LENGTH {
        return Err(CompileError(format!(
            "expression code point size exceeds limit: size: {}, limit {MAX_EXPRESSION_LENGTH}",
            source.chars().count()
        )));
    }
    // The parser recurses by the input's nesting, and so does dropping what it built: a thread with a stack of
    // its own bears it, whatever the caller's stack is.
    let source = source.to_owned();
    let declared: Vec<String> = declared.iter().map(|s| s.to_string()).collect();
    let work = move || {
        let mut expr = Parser::default()
            .max_recursion_depth(PARSER_RECURSION_LIMIT)
            .enable_optional_syntax(true)
            .parse(&source)
            .map_err(|e| CompileError(e.to_string()))?;
        if let Some(reason) = mutation.and_then(|returns| objects::wrong_result(&expr, returns)) {
            return Err(CompileError(reason));
        }
        let names: Vec<&str> = declared.iter().map(String::as_str).collect();
        let checked = check::check(&mut expr, &names, mutation.is_some())
            .map_err(|p| CompileError(format!("ERROR: <input>: {p}")))?;
        Ok(Program { source, expr, checked })
    };
    let thread = std::thread::Builder::new().name("cel-compile".into()).stack_size(256 << 20).spawn(move || {
        std::panic::catch_unwind(AssertUnwindSafe(work))
            .unwrap_or_else(|_| Err(CompileError("ERROR: <input>: the expression could not be parsed".into())))
    });
    match thread {
        Ok(t) => t.join().unwrap_or_else(|_| Err(CompileError("ERROR: <input>: the parser failed".into()))),
        Err(e) => Err(CompileError(format!("ERROR: <input>: no thread to parse on: {e}"))),
    }
}

/// The values expressions are evaluated against: a scope of the root context holding them, converted into the
/// interpreter's values once, whatever number of expressions then read them.
pub struct Activation {
    scope: Context<'static>,
}

impl Default for Activation {
    fn default() -> Self {
        Self { scope: ROOT.new_inner_scope() }
    }
}

impl Activation {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `name` to `value` (a later binding of the same name replaces it).
    pub fn bind(&mut self, name: &'static str, value: Value) -> &mut Self {
        self.scope.add_variable_from_value(name, value);
        self
    }

    /// Binds `variables` to the lazily evaluated variables of a policy; each is evaluated at most once for this
    /// binding.
    pub fn bind_variables(&mut self, variables: Arc<Variables>) -> &mut Self {
        self.bind("variables", Value::Opaque(Arc::new(variables::Lazy::new(variables))))
    }
}

impl Program {
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression reads the top-level name `name` (a caller builds only what is read).
    pub fn uses(&self, name: &str) -> bool {
        self.checked.paths.iter().any(|(root, _)| root == name)
    }

    /// What it can read of the top-level name `name` (see [`Projection`]).
    pub fn projection(&self, name: &str) -> Projection {
        let mut p = Projection::nothing();
        for (_, path) in self.checked.paths.iter().filter(|(root, _)| root == name) {
            p.add(path);
        }
        p
    }

    /// Whether it reads no name of its environment (nor any variable): its value is the same on every
    /// evaluation.
    pub fn reads_nothing(&self) -> bool {
        self.checked.paths.is_empty() && self.checked.variables.is_empty()
    }

    /// The policy variables it reads.
    pub fn variables_read(&self) -> &[String] {
        &self.checked.variables
    }

    /// Evaluates the expression, charging what it costs to `budget`.
    pub fn eval(&self, activation: &Activation, budget: &mut Budget) -> Result<Value, EvalError> {
        let limit = PER_CALL_LIMIT.min(budget.remaining);
        let ctx = &activation.scope;
        let run = || {
            stacker::maybe_grow(STACK_RED_ZONE, STACK_SIZE, || {
                std::panic::catch_unwind(AssertUnwindSafe(|| self.resolve_within(ctx)))
            })
        };
        let (result, used, exceeded) = cost::metered(limit, run);
        budget.remaining = budget.remaining.saturating_sub(used);
        if exceeded {
            return Err(if limit < PER_CALL_LIMIT { EvalError::OutOfBudget } else { EvalError::CostLimit });
        }
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(EvalError::Runtime(runtime_message(&e))),
            Err(_) => Err(EvalError::Runtime("internal error: the expression's evaluation failed".into())),
        }
    }

    /// Evaluates within `ctx` (an activation's scope), charging the expression's size to the running meter.
    pub(crate) fn resolve_within(&self, ctx: &Context) -> Result<Value, ExecutionError> {
        cost::charge(self.checked.size)?;
        kube_cel::cel::Value::resolve(&self.expr, ctx)
    }
}

/// An interpreter's error worded as cel-go words it.
fn runtime_message(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::NoSuchOverload => "no such overload".into(),
        ExecutionError::UndeclaredReference(name) => format!("undeclared reference to '{name}'"),
        ExecutionError::DivisionByZero(_) => "division by zero".into(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".into(),
        ExecutionError::IndexOutOfBounds(i) => format!("index out of range: {}", value_text(i)),
        ExecutionError::Overflow(..) => "integer overflow".into(),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        ExecutionError::UnexpectedType { got, want } => format!("unexpected type: got '{got}', want '{want}'"),
        other => other.to_string(),
    }
}

fn value_text(v: &Value) -> String {
    match value::to_json(v) {
        Some(j) => j.to_string(),
        None => format!("{v:?}"),
    }
}

#[cfg(test)]
mod tests;
