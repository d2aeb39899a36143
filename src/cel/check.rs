//! What compilation checks and rewrites in a parsed expression, as cel-go's checker would refuse it (an
//! undeclared name, a construct the interpreter cannot evaluate) and so that evaluation can be bounded:
//! - each comprehension's loop condition becomes `@tick(<step cost>, <condition>)` (see `cost.rs`);
//! - `variables.<name>` becomes a lazy lookup, evaluated at most once per activation (`variables.rs`);
//! - `authorizer.requestResource` becomes a call, as the authorizer is an opaque value (`authz.rs`);
//! - in a mutation, an object literal becomes a call building it (`objects.rs`).

use kube_cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use kube_cel::cel::common::types::{CelInt, CelString};

use super::authz::REQUEST_RESOURCE;
use super::cost::TICK;
use super::library::{EQUALS, FUNCTIONS, NOT_EQUALS, OPT_SELECT};
use super::objects;
use super::variables::VARIABLE;

/// How deep an expression may nest: evaluation recurses once per level, on the caller's stack.
pub(crate) const MAX_DEPTH: usize = 32;

/// Function namespaces of the libraries: `sets.contains(..)` parses as a call on an identifier `sets`.
const NAMESPACES: &[&str] = &["base64", "format", "ip", "jsonpatch", "lists", "math", "optional", "sets", "strings"];

/// Why an expression does not compile, beyond what the parser says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    Undeclared(String),
    Unsupported(&'static str),
    TooDeep,
    /// A mutation's literal that kube's types refuse, in kube's words.
    Object(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Undeclared(name) => write!(f, "undeclared reference to '{name}' (in container '')"),
            Problem::Unsupported(what) => write!(f, "{what} is not supported"),
            Problem::TooDeep => write!(f, "expression nested more than {MAX_DEPTH} levels deep"),
            Problem::Object(message) => f.write_str(message),
        }
    }
}

/// What a checked expression refers to, so evaluation builds only what it reads.
#[derive(Debug, Default, Clone)]
pub(crate) struct Checked {
    /// The policy variables it reads (`variables.<name>`).
    pub(crate) variables: Vec<String>,
    /// The number of nodes: the cost charged when the expression is evaluated.
    pub(crate) size: u64,
    /// Every read of a top-level name, as the field path selected from it (see `projection.rs`).
    pub(crate) paths: Vec<(String, Vec<String>)>,
}

/// Checks `e` against the declared names and rewrites it (see the module's doc); `mutation` declares the types
/// that build objects and patches, as kube declares them for mutations only.
pub(crate) fn check(e: &mut IdedExpr, declared: &[&str], mutation: bool) -> Result<Checked, Problem> {
    let mut walk = Walk { declared, mutation, scope: Vec::new(), checked: Checked::default(), depth: 0 };
    walk.visit(e)?;
    paths(e, declared, &mut Vec::new(), &mut walk.checked.paths);
    Ok(walk.checked)
}

/// `e` as a chain of field selections from a name (`object.spec.replicas`, `object.?spec.?paused`): the name and
/// the fields.
fn chain(e: &IdedExpr) -> Option<(&str, Vec<String>)> {
    match &e.expr {
        Expr::Ident(n) => Some((n.as_str(), Vec::new())),
        Expr::Select(s) if !s.test => {
            let (root, mut path) = chain(&s.operand)?;
            path.push(s.field.clone());
            Some((root, path))
        }
        Expr::Call(c) if c.func_name == OPT_SELECT && c.target.is_none() && c.args.len() == 2 => {
            let Expr::Literal(LiteralValue::String(field)) = &c.args[1].expr else { return None };
            let (root, mut path) = chain(&c.args[0])?;
            path.push(field.inner().to_owned());
            Some((root, path))
        }
        _ => None,
    }
}

/// Collects into `out` every read of a declared name in the checked `e`, as the longest chain of selections from
/// it; `scope` holds the comprehension variables around `e`, which hide declared names.
fn paths(e: &IdedExpr, declared: &[&str], scope: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    let global = |name: &str, scope: &[String]| declared.contains(&name) && !scope.iter().any(|s| s == name);
    // `has(a.b.f)` reads whether `f` is there: the subtree at `a.b.f` answers it.
    if let Expr::Select(s) = &e.expr {
        if s.test {
            if let Some((root, mut path)) = chain(&s.operand) {
                if global(root, scope) {
                    path.push(s.field.clone());
                    out.push((root.to_owned(), path));
                }
                return;
            }
        }
    }
    if let Some((root, path)) = chain(e) {
        if global(root, scope) {
            out.push((root.to_owned(), path));
        }
        return;
    }
    match &e.expr {
        Expr::Call(c) => {
            for x in c.target.as_deref().into_iter().chain(&c.args) {
                paths(x, declared, scope, out);
            }
        }
        Expr::Select(s) => paths(&s.operand, declared, scope, out),
        Expr::List(l) => l.elements.iter().for_each(|x| paths(x, declared, scope, out)),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    paths(&me.key, declared, scope, out);
                    paths(&me.value, declared, scope, out);
                }
            }
        }
        Expr::Comprehension(c) => {
            paths(&c.iter_range, declared, scope, out);
            paths(&c.accu_init, declared, scope, out);
            let names = [Some(c.iter_var.clone()), c.iter_var2.clone(), Some(c.accu_var.clone())];
            let before = scope.len();
            scope.extend(names.into_iter().flatten());
            for x in [&c.loop_cond, &c.loop_step, &c.result] {
                paths(x, declared, scope, out);
            }
            scope.truncate(before);
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Struct(_) | Expr::Unspecified => {}
    }
}

/// The number of nodes in `e`.
pub(crate) fn size(e: &IdedExpr) -> u64 {
    let mut n = 1u64;
    match &e.expr {
        Expr::Call(c) => {
            n += c.target.as_deref().map_or(0, size);
            n += c.args.iter().map(size).sum::<u64>();
        }
        Expr::Comprehension(c) => {
            n += [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result].into_iter().map(size).sum::<u64>()
        }
        Expr::List(l) => n += l.elements.iter().map(size).sum::<u64>(),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    n += size(&me.key) + size(&me.value);
                }
            }
        }
        Expr::Select(s) => n += size(&s.operand),
        _ => {}
    }
    n
}

struct Walk<'a> {
    declared: &'a [&'a str],
    mutation: bool,
    /// Names a comprehension binds around the node being visited.
    scope: Vec<String>,
    checked: Checked,
    depth: usize,
}

fn call(name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    IdedExpr { id: 0, expr: Expr::Call(CallExpr { func_name: name.to_owned(), target: None, args }) }
}

fn string(s: &str) -> IdedExpr {
    IdedExpr { id: 0, expr: Expr::Literal(LiteralValue::String(CelString::from(s))) }
}

/// The patch library's one function, declared for mutations only.
const JSONPATCH_ESCAPE_KEY: &str = "jsonpatch.escapeKey";

impl Walk<'_> {
    /// A mutation's object literal: a declared type, and each object within it named after its field's path.
    fn object(&self, s: &kube_cel::cel::common::ast::StructExpr) -> Result<(), Problem> {
        let name = objects::type_name(&s.type_name);
        if !objects::declared(name) {
            return Err(Problem::Undeclared(name.to_owned()));
        }
        if name == "JSONPatch" {
            // A patch's value is an object of its own.
            return Ok(());
        }
        for entry in &s.entries {
            if let EntryExpr::StructField(f) = &entry.expr {
                if let Some((got, want)) = objects::misnamed(&f.value, &format!("{name}.{}", f.field)) {
                    return Err(Problem::Object(objects::mismatch(&got, &want)));
                }
            }
        }
        Ok(())
    }

    fn bound(&self, name: &str) -> bool {
        self.scope.iter().any(|s| s == name)
    }

    /// A top-level name of the environment, not hidden by a comprehension's variable.
    fn global(&self, e: &IdedExpr, name: &str) -> bool {
        matches!(&e.expr, Expr::Ident(n) if n == name) && !self.bound(name) && self.declared.contains(&name)
    }

    fn visit(&mut self, e: &mut IdedExpr) -> Result<(), Problem> {
        if self.depth >= MAX_DEPTH {
            return Err(Problem::TooDeep);
        }
        self.depth += 1;
        let result = self.visit_node(e);
        self.depth -= 1;
        result
    }

    fn visit_node(&mut self, e: &mut IdedExpr) -> Result<(), Problem> {
        self.checked.size += 1;
        balance(e);
        // Rewrites first: the rewritten node is visited as what it became.
        if let Expr::Select(s) = &e.expr {
            if !s.test && self.global(&s.operand, "variables") {
                let field = s.field.clone();
                self.checked.variables.push(field.clone());
                *e = call(VARIABLE, vec![(*s.operand).clone(), string(&field)]);
            } else if s.field == "requestResource" && self.global(&s.operand, "authorizer") {
                *e = call(REQUEST_RESOURCE, vec![(*s.operand).clone()]);
            }
        }
        if let Expr::Struct(s) = &e.expr {
            if self.mutation {
                self.object(s)?;
                objects::rewrite(e);
            }
        }
        if let Expr::Call(c) = &mut e.expr {
            match c.func_name.as_str() {
                "_==_" => c.func_name = EQUALS.to_owned(),
                "_!=_" => c.func_name = NOT_EQUALS.to_owned(),
                "_?._" => c.func_name = OPT_SELECT.to_owned(),
                _ => {}
            }
        }
        match &mut e.expr {
            Expr::Ident(name) => {
                if !self.bound(name) && !self.declared.contains(&name.as_str()) {
                    return Err(Problem::Undeclared(name.clone()));
                }
            }
            Expr::Call(c) => {
                let mut qualified = None;
                if let Some(target) = c.target.as_deref_mut() {
                    let namespace = match &target.expr {
                        Expr::Ident(n)
                            if NAMESPACES.contains(&n.as_str())
                                && !self.bound(n)
                                && !self.declared.contains(&n.as_str()) =>
                        {
                            Some(n.clone())
                        }
                        _ => None,
                    };
                    match namespace {
                        Some(n) => qualified = Some(format!("{n}.{}", c.func_name)),
                        None => self.visit(target)?,
                    }
                }
                let operator = c.func_name.starts_with(['_', '@', '!', '-']);
                let name = qualified.as_deref().unwrap_or(&c.func_name);
                let patch_only = name == JSONPATCH_ESCAPE_KEY && !self.mutation;
                if !operator && (!FUNCTIONS.contains(&name) || patch_only) {
                    return Err(Problem::Undeclared(name.to_owned()));
                }
                for a in &mut c.args {
                    self.visit(a)?;
                }
            }
            Expr::Select(s) => self.visit(&mut s.operand)?,
            Expr::List(l) => {
                for x in &mut l.elements {
                    self.visit(x)?;
                }
            }
            Expr::Map(m) => {
                for entry in &mut m.entries {
                    match &mut entry.expr {
                        EntryExpr::MapEntry(me) => {
                            self.visit(&mut me.key)?;
                            self.visit(&mut me.value)?;
                        }
                        EntryExpr::StructField(_) => return Err(Problem::Unsupported("a message field")),
                    }
                }
            }
            Expr::Comprehension(c) => {
                self.visit(&mut c.iter_range)?;
                self.visit(&mut c.accu_init)?;
                let names = [Some(c.iter_var.clone()), c.iter_var2.clone(), Some(c.accu_var.clone())];
                let pushed = names.iter().flatten().count();
                self.scope.extend(names.into_iter().flatten());
                let inner =
                    [&mut c.loop_cond, &mut c.loop_step, &mut c.result].into_iter().try_for_each(|x| self.visit(x));
                self.scope.truncate(self.scope.len() - pushed);
                inner?;
                // Sized once checked: nothing in them is deeper than the limit.
                let step = 1 + size(&c.loop_cond) + size(&c.loop_step);
                let condition = std::mem::take(&mut c.loop_cond);
                let cost = IdedExpr {
                    id: 0,
                    expr: Expr::Literal(LiteralValue::Int(CelInt::from(i64::try_from(step).unwrap_or(i64::MAX)))),
                };
                c.loop_cond = call(TICK, vec![cost, condition]);
            }
            Expr::Literal(_) => {}
            Expr::Struct(_) => return Err(Problem::Unsupported("object construction (Type{...})")),
            Expr::Unspecified => return Err(Problem::Unsupported("an empty expression")),
        }
        Ok(())
    }
}

/// A chain of `&&` (or `||`) rebuilt as a balanced tree, as cel-go's parser builds it: the same result and
/// short-circuiting, but a chain of n terms nests log2(n) deep instead of n.
fn balance(e: &mut IdedExpr) {
    let op = match &e.expr {
        Expr::Call(c)
            if c.target.is_none() && c.args.len() == 2 && (c.func_name == "_&&_" || c.func_name == "_||_") =>
        {
            c.func_name.clone()
        }
        _ => return,
    };
    let mut terms = Vec::new();
    let mut stack = vec![std::mem::take(e)];
    while let Some(x) = stack.pop() {
        match x.expr {
            Expr::Call(c) if c.target.is_none() && c.args.len() == 2 && c.func_name == op => {
                // Right first, so terms come off in source order.
                stack.extend(c.args.into_iter().rev());
            }
            other => terms.push(IdedExpr { id: x.id, expr: other }),
        }
    }
    *e = build(&op, terms);
}

fn build(op: &str, mut terms: Vec<IdedExpr>) -> IdedExpr {
    if terms.len() == 1 {
        return terms.remove(0);
    }
    let right = terms.split_off(terms.len() / 2);
    call(op, vec![build(op, terms), build(op, right)])
}
