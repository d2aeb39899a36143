//! A policy's `variables`, as k8s.io/apiserver composes them: `variables.<name>` is evaluated the first time an
//! expression reads it and then kept for the rest of the activation, so a variable no expression reads costs
//! nothing and one read by many is evaluated once. A variable may read those declared before it.

use std::sync::{Arc, OnceLock};

use kube_cel::cel::objects::{Opaque, Value};
use kube_cel::cel::{Context, ExecutionError, FunctionContext};

use super::{CompileError, Program};

/// The call `variables.<name>` is rewritten into: `@variable(variables, '<name>')`.
pub(crate) const VARIABLE: &str = "@podset.variable";

/// The compiled variables of a policy, in declaration order.
#[derive(Debug, Default)]
pub struct Variables {
    defs: Vec<(String, Result<Arc<Program>, CompileError>)>,
}

impl Variables {
    pub fn new(defs: Vec<(String, Result<Arc<Program>, CompileError>)>) -> Self {
        Self { defs }
    }

    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.defs.iter().map(|(n, _)| n.as_str())
    }

    /// Each variable's name and compiled expression (or why it did not compile).
    pub fn definitions(&self) -> impl Iterator<Item = (&str, &Result<Arc<Program>, CompileError>)> {
        self.defs.iter().map(|(n, p)| (n.as_str(), p))
    }
}

/// The `variables` value of one activation: each variable's value once it has been read.
pub(crate) struct Lazy {
    variables: Arc<Variables>,
    values: Vec<OnceLock<Result<Value, ExecutionError>>>,
}

impl Lazy {
    pub(crate) fn new(variables: Arc<Variables>) -> Self {
        let values = variables.defs.iter().map(|_| OnceLock::new()).collect();
        Self { variables, values }
    }
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.variables.names()).finish()
    }
}

impl PartialEq for Lazy {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Lazy {}

impl Opaque for Lazy {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.variables"
    }
}

/// The activation's own scope: the child of the root context that holds `object`, `variables` and the rest, so a
/// variable never sees a comprehension's names.
fn activation_scope<'a>(mut ctx: &'a Context<'a>) -> &'a Context<'a> {
    while let Context::Child { parent, .. } = ctx {
        if matches!(parent, Context::Root { .. }) {
            break;
        }
        ctx = parent;
    }
    ctx
}

/// `@variable(variables, name)`.
pub(crate) fn variable(ftx: &FunctionContext, variables: Value, name: Arc<String>) -> Result<Value, ExecutionError> {
    let Value::Opaque(o) = &variables else { return Err(ExecutionError::NoSuchOverload) };
    let Some(lazy) = o.downcast_ref::<Lazy>() else { return Err(ExecutionError::NoSuchOverload) };
    let Some(i) = lazy.variables.defs.iter().position(|(n, _)| **n == *name) else {
        return Err(ExecutionError::NoSuchKey(name));
    };
    let (_, program) = &lazy.variables.defs[i];
    lazy.values[i]
        .get_or_init(|| match program {
            Ok(p) => p.resolve_within(activation_scope(ftx.ptx)),
            Err(e) => Err(ExecutionError::function_error(VARIABLE, e.to_string())),
        })
        .clone()
}
