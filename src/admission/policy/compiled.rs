//! A policy and its bindings as a plugin evaluates them, whatever its kind: what every policy spec has
//! (`failurePolicy`, `matchConstraints`, `matchConditions`, `variables`, `paramKind`) compiled once per version of
//! the policy, as `policy/generic`'s compilers do, beside what its kind adds (validations, mutations: the body).
//! An expression that does not compile is kept as its error and counts when it is evaluated, as kube does for
//! stored policies; manifests refuse such a policy when they are loaded.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, MatchResources, ParamKind, ParamRef, Variable};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::matching::Matcher;
use crate::admission::activation::Reads;
use crate::admission::matchconditions::MatchConditions;
use crate::cel::{self, CompileError, Program, Variables};

/// The names policy expressions may use (`compile.go`'s declarations), with `params` when the policy has a
/// `paramKind`.
pub(crate) fn declared(params: bool, authorizer: bool) -> Vec<&'static str> {
    let mut d = vec!["object", "oldObject", "request", "namespaceObject", "variables"];
    if params {
        d.push("params");
    }
    if authorizer {
        d.push("authorizer");
    }
    d
}

/// Where a policy or binding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A file of `staticManifestsDir`: in force from the start, not an API object.
    Manifest,
    /// The main API server's `admissionregistration.k8s.io/v1`.
    Cluster,
}

/// What a kind of policy adds to the spec every policy has, compiled.
pub trait Body: std::fmt::Debug + Send + Sync + 'static {
    /// Its compiled expressions, for what the policy reads of a request.
    fn programs(&self) -> Vec<&Program>;

    /// Its expressions' compile errors, with their fields (`spec.validations[0].expression`).
    fn compile_errors(&self) -> Vec<(String, &CompileError)>;
}

/// The part of a policy's spec every kind has.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spec<'a> {
    pub failure_policy: Option<&'a str>,
    pub match_constraints: Option<&'a MatchResources>,
    pub match_conditions: &'a [MatchCondition],
    pub variables: &'a [Variable],
    pub param_kind: Option<&'a ParamKind>,
}

/// The names a policy's own expressions may use: all of them, and those of messages (no authorizer).
pub struct Declared {
    pub full: Vec<&'static str>,
    pub without_authorizer: Vec<&'static str>,
}

/// A compiled policy of any kind.
#[derive(Debug)]
pub struct Policy<B> {
    pub name: String,
    pub origin: Origin,
    /// The version compiled (its resourceVersion), so an unchanged policy is not compiled again.
    pub resource_version: String,
    pub(crate) fail_open: bool,
    pub(crate) matcher: Option<Matcher>,
    pub(crate) match_conditions: Arc<MatchConditions>,
    pub(crate) variables: Arc<Variables>,
    pub(crate) param_kind: Option<ParamKind>,
    /// What its expressions read of the request, so nothing else is built for them.
    pub(crate) reads: Reads,
    pub(crate) body: B,
}

impl<B: Body> Policy<B> {
    /// Compiles `spec`, and the body `body` builds with the names its expressions may use.
    pub fn compile(meta: &ObjectMeta, spec: Spec<'_>, origin: Origin, body: impl FnOnce(&Declared) -> B) -> Self {
        let params = spec.param_kind.is_some();
        let names = Declared { full: declared(params, true), without_authorizer: declared(params, false) };
        // A variable sees the ones declared before it only; `variables.<later>` fails when evaluated.
        let mut defs = Vec::new();
        for v in spec.variables {
            let earlier: Vec<String> = defs.iter().map(|(n, _): &(String, _)| n.clone()).collect();
            let program = cel::compile(&v.expression, &names.full).and_then(|p| {
                match p.variables_read().iter().find(|r| !earlier.contains(r)) {
                    Some(later) => Err(CompileError::new(format!(
                        "ERROR: <input>: undefined field '{later}': a variable may only use those declared before it"
                    ))),
                    None => Ok(Arc::new(p)),
                }
            });
            defs.push((v.name.clone(), program));
        }
        let body = body(&names);
        let match_conditions = MatchConditions::compile(spec.match_conditions, &names.full);
        let programs = body
            .programs()
            .into_iter()
            .chain(defs.iter().filter_map(|(_, r)| r.as_deref().ok()))
            .chain(match_conditions.programs());
        let reads = Reads::of(programs);
        Self {
            name: meta.name.clone().unwrap_or_default(),
            origin,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            fail_open: spec.failure_policy == Some("Ignore"),
            matcher: spec.match_constraints.map(Matcher::new),
            match_conditions: Arc::new(match_conditions),
            variables: Arc::new(Variables::new(defs)),
            param_kind: spec.param_kind.cloned(),
            reads,
            body,
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
        for (field, e) in self.body.compile_errors() {
            add(field, e);
        }
        for (i, (_, e)) in self.match_conditions.compile_errors().enumerate() {
            out.push((format!("spec.matchConditions[{i}].expression"), e));
        }
        out
    }
}

/// A compiled binding of any kind.
#[derive(Debug)]
pub struct Binding {
    pub name: String,
    pub policy_name: String,
    pub resource_version: String,
    pub(crate) matcher: Option<Matcher>,
    pub(crate) param_ref: Option<ParamRef>,
    /// `validationActions`, in their order (none for a kind without them).
    pub(crate) actions: Vec<String>,
}

impl Binding {
    pub fn new(
        meta: &ObjectMeta,
        policy_name: &str,
        match_resources: Option<&MatchResources>,
        param_ref: Option<&ParamRef>,
        actions: Vec<String>,
    ) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            policy_name: policy_name.to_owned(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            matcher: match_resources.map(Matcher::new),
            param_ref: param_ref.cloned(),
            actions,
        }
    }
}
