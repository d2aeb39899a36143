//! MutatingAdmissionPolicy, as k8s.io/apiserver's `admission/plugin/policy/mutating` runs it for its own resources
//! (`dispatcher.go`): the policies, bindings and params that select the request are found first, on the object as
//! it came (`policy/generic`'s dispatcher); then for each, in the version the policy matched: its matchConditions,
//! then each mutation in order on a fresh cost budget and fresh variables, the object patched (an
//! ApplyConfiguration merged by the object's schema, or a JSON patch) and defaulted after each.
//!
//! - A policy that fails (a CEL error, a patch that does not apply) does not stop the others; under
//!   `failurePolicy: Fail` the request is refused after all ran, 403 with the first failure's message and every
//!   failure as a cause. A patched object that no longer decodes is a 500, as kube's is.
//! - `reinvocationPolicy: IfNeeded`: when a later plugin (a mutating webhook, another policy) changes the object,
//!   or any mutation applied (kube's `Dirty`), the chain's second round runs the policies that saw it before, once.
//!   A policy its matchConditions left out in the first round is not run for the first time in the second.
//! - The registry decodes, defaults and validates the object admission returns, as for any write: a mutation that
//!   makes it invalid is refused with the validation's 422, and validating policies and webhooks see the result.
//!
//! Runs in the mutating phase after NamespaceLifecycle and before the mutating webhooks, for creates and updates
//! (status and scale included) and dry runs.

mod compiled;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::core::response::{StatusCause, StatusDetails};
use kube::core::Status;
use serde_json::Value;

pub use compiled::{MutatingKind, MutatingPolicy, Mutations};
use compiled::{Mutation, Patch, PatchType};

use super::{binding_params, binding_selects, namespace_object, Binding, Hook, Params, PolicySet};
use crate::admission::activation::{self, ExpressionAuthorizer, Invocation, Reads};
use crate::admission::matchconditions::{compile_error, expression_error, Matched};
use crate::admission::metrics::MutatingPolicyCheckLabels;
use crate::admission::mutation::{self, ApplyConfigurationError};
use crate::admission::namespace::resource_name;
use crate::admission::{
    manifest, Attributes, Error, Handler, Mutating, Namespaces, ObjectInterfaces, Outcome, PluginContext, PluginRound,
    Reinvocation,
};
use crate::api::Operation;
use crate::cel::{self, Activation, Budget, EvalError};

/// The MutatingAdmissionPolicies in force.
pub type MutatingPolicies = PolicySet<MutatingKind>;

/// The MutatingAdmissionPolicy plugin.
pub struct MutatingAdmissionPolicyPlugin {
    policies: MutatingPolicies,
    params: Params,
    namespaces: Namespaces,
    authorizer: ExpressionAuthorizer,
}

impl MutatingAdmissionPolicyPlugin {
    pub const NAME: &'static str = "MutatingAdmissionPolicy";

    pub fn new(
        policies: MutatingPolicies,
        params: Params,
        namespaces: Namespaces,
        authorizer: ExpressionAuthorizer,
    ) -> Self {
        Self { policies, params, namespaces, authorizer }
    }

    pub(crate) fn factory(ctx: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
        let Some((policies, params)) = ctx.mutating_policies() else { return Ok(None) };
        let authorizer = ctx.config().authorizer.clone();
        Ok(Some(Arc::new(Self::new(policies, params, ctx.namespaces().clone(), authorizer))))
    }
}

impl Handler for MutatingAdmissionPolicyPlugin {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }

    fn mutating(&self) -> Option<&dyn Mutating> {
        Some(self)
    }

    fn reads_objects(&self, a: &Attributes) -> bool {
        self.policies.may_select(a)
    }

    fn has_synced(&self) -> bool {
        self.policies.has_synced()
    }
}

/// Why one mutation did not apply.
enum Failure {
    /// A configuration error of the policy (`addConfigError`): counted under its failure policy.
    Policy(String),
    /// The request fails as this, whatever the failure policy (a Status error in kube).
    Request(Error),
}

/// What one mutation came to, for the metrics.
struct Observed {
    error_type: &'static str,
    elapsed: Duration,
}

/// `ErrorType` of `mutating/errors.go`.
fn error_type(message: &str) -> &'static str {
    if message.starts_with("compilation") {
        "compile_error"
    } else if message.starts_with("validation failed due to running out of cost budget") {
        "out_of_budget"
    } else {
        "invalid_error"
    }
}

/// What a policy's expressions see for one binding and param, in the version its rules matched.
struct Input {
    object: Option<Value>,
    old: Option<Value>,
    request: Option<Value>,
    namespace: Option<Value>,
    params: Option<cel::Value>,
    authorizer: cel::Value,
}

/// One invocation's result: the object as the policy left it, and each mutation's outcome.
struct Invoked {
    /// Whether it ran: its conditions held and the round did not skip it.
    matched: bool,
    /// Whether a mutation applied (kube's `Dirty`, even when it changed nothing).
    applied: bool,
    /// Whether a mutation changed the object.
    changed: bool,
    object: Option<Value>,
    failures: Vec<Failure>,
    observed: Vec<Observed>,
}

impl Invoked {
    fn failed(failure: Failure) -> Self {
        Self { matched: false, applied: false, changed: false, object: None, failures: vec![failure], observed: vec![] }
    }
}

/// One policy × binding × param that selects the request, found before any of them runs (`policy/generic`'s
/// dispatcher): each is matched on the object as it came to the plugin.
struct Call<'h> {
    hook: &'h Hook<MutatingKind>,
    binding: &'h Binding,
    version: String,
    params: Option<cel::Value>,
}

#[async_trait::async_trait]
impl Mutating for MutatingAdmissionPolicyPlugin {
    async fn admit(
        &self,
        a: &Attributes,
        mut object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        reinvocation: &mut Reinvocation,
    ) -> Result<(), Error> {
        let Some((manifest, cluster)) = self.policies.in_force(&self.namespaces, a, object.as_deref()).await? else {
            return Ok(());
        };
        let mut state = Dispatch::default();
        let mut calls = Vec::new();
        for hook in manifest.iter().chain(cluster.iter()) {
            self.collect(hook, (a, object.as_deref(), old), &mut calls, &mut state, out).await;
        }
        let mut round = reinvocation.plugin(Self::NAME);
        round.begin(object.as_deref());
        let mut result = Ok(());
        let mut applied = false;
        for call in calls {
            match self.call(call, (a, &mut object, old), &mut round, &mut state).await {
                Ok(a) => applied |= a,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Any mutation applied: the IfNeeded policies that ran run again in a second round (kube's `Dirty`).
        if applied && result.is_ok() {
            round.mutated();
        }
        round.end(object.as_deref());
        result?;
        state.refusal(a, object.as_deref()).map_or(Ok(()), Err)
    }
}

/// A policy's failure, worded as `generic.PolicyError`.
struct PolicyError {
    message: String,
    /// The Status reason it gives the refusal when it is the first; none for a configuration error.
    reason: &'static str,
}

/// What a request's policies came to so far.
#[derive(Default)]
struct Dispatch {
    /// The failures of policies that fail closed: those found while matching first, as kube lists them.
    configuration: Vec<PolicyError>,
    failures: Vec<PolicyError>,
    /// `namespaceObject`, read the first time a policy reads it.
    namespace: Option<Value>,
}

fn denied(policy: &MutatingPolicy, binding: Option<&Binding>, message: &str) -> String {
    match binding {
        Some(b) => format!("policy '{}' with binding '{}' denied request: {message}", policy.name, b.name),
        None => format!("policy {:?} denied request: {message}", policy.name),
    }
}

impl Dispatch {
    /// A policy or binding that cannot be applied (the generic dispatcher's `addConfigError`).
    fn config_error(&mut self, policy: &MutatingPolicy, binding: Option<&Binding>, e: &str) {
        if policy.fail_open {
            return;
        }
        let what = if binding.is_some() { "binding" } else { "policy" };
        let message = denied(policy, binding, &format!("failed to configure {what}: {e}"));
        self.configuration.push(PolicyError { message, reason: "" });
    }

    /// An invocation that failed: its conditions or a mutation (the mutating dispatcher's `addConfigError`).
    fn failure(&mut self, policy: &MutatingPolicy, binding: &Binding, e: &str) {
        if policy.fail_open {
            return;
        }
        self.failures.push(PolicyError { message: denied(policy, Some(binding), e), reason: "Invalid" });
    }

    /// kube's refusal when policies that fail closed failed: `NewForbidden` given the first failure's message and
    /// reason, every failure a cause.
    fn refusal(self, a: &Attributes, object: Option<&Value>) -> Option<Error> {
        let errors: Vec<PolicyError> = self.configuration.into_iter().chain(self.failures).collect();
        let first = errors.first()?;
        let reason = if first.reason.is_empty() { "Forbidden" } else { first.reason };
        let status = Status {
            code: 403,
            reason: reason.into(),
            message: first.message.clone(),
            details: Some(StatusDetails {
                name: resource_name(a, object),
                group: a.resource.group.clone(),
                kind: a.resource.resource.clone(),
                uid: String::new(),
                causes: errors.iter().map(|e| cause(&e.message)).collect(),
                retry_after_seconds: 0,
            }),
            ..Status::failure("", "")
        };
        Some(Error::Plugin { plugin: MutatingAdmissionPolicyPlugin::NAME, status: Box::new(status) })
    }
}

fn cause(message: &str) -> StatusCause {
    StatusCause { reason: String::new(), message: message.to_owned(), field: String::new() }
}

/// The key a policy's invocation is reinvoked by: policy, binding and param (`keyFor`).
fn key(policy: &str, binding: &str, param: Option<&cel::Value>) -> String {
    let param = param.and_then(cel::value::to_json).unwrap_or_default();
    let meta = &param["metadata"];
    let field = |f: &str| meta[f].as_str().unwrap_or_default().to_owned();
    format!("{policy}\u{0}{binding}\u{0}{}/{}", field("namespace"), field("name"))
}

impl MutatingAdmissionPolicyPlugin {
    /// The invocations of `hook` that select the request: its rules, each binding's, and their params.
    async fn collect<'h>(
        &self,
        hook: &'h Hook<MutatingKind>,
        (a, object, old): (&Attributes, Option<&Value>, Option<&Value>),
        calls: &mut Vec<Call<'h>>,
        state: &mut Dispatch,
        out: &mut Outcome,
    ) {
        let policy = &hook.policy;
        let Some(matcher) = &policy.matcher else {
            state.config_error(policy, None, "policy contained no match constraints, a required field");
            return;
        };
        let version = match matcher.matches(a, object, old, &self.namespaces).await {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => return state.config_error(policy, None, &e),
        };
        for binding in &hook.bindings {
            match binding_selects(binding, &self.namespaces, (a, object, old)).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    state.config_error(policy, Some(binding), &e);
                    continue;
                }
            }
            let params = match binding_params(&self.params, policy, binding, a).await {
                Ok(found) => found,
                Err(e) => {
                    state.config_error(policy, Some(binding), &e);
                    continue;
                }
            };
            if policy.origin == super::Origin::Manifest {
                manifest::record_source(out, manifest::MANIFEST_POLICIES_ANNOTATION, &policy.name);
            }
            for params in params {
                calls.push(Call { hook, binding, version: version.clone(), params });
            }
        }
    }

    /// One invocation on the object as the policies before it left it (`dispatchInvocations`' loop body); whether
    /// a mutation applied.
    async fn call(
        &self,
        Call { hook, binding, version, params }: Call<'_>,
        (a, object, old): (&Attributes, &mut Option<&mut Value>, Option<&Value>),
        round: &mut PluginRound<'_>,
        state: &mut Dispatch,
    ) -> Result<bool, Error> {
        let policy = &hook.policy;
        let key = key(&policy.name, &binding.name, params.as_ref());
        let skip = round.skips(&key);
        // Skipped in this round with no conditions to evaluate first: nothing to build for it.
        if skip && policy.match_conditions.is_empty() {
            return Ok(false);
        }
        let reads = (a, version.as_str(), &policy.reads);
        let mut input = match self.input(reads, (object.as_deref(), old), params, state).await {
            Ok(input) => input,
            Err(Failure::Policy(e)) => {
                state.config_error(policy, None, &e);
                return Ok(false);
            }
            Err(Failure::Request(e)) => return Err(e),
        };
        // Not converted for the policy, the object itself goes to it and comes back, not a copy.
        let in_place = input.object.is_none();
        if in_place {
            input.object = object.as_deref_mut().map(std::mem::take);
        }
        let (p, interfaces) = (policy.clone(), a.interfaces);
        let mut invoked = activation::evaluate(
            policy.reads.authorizer,
            move || invoke(&p, input, skip, interfaces),
            || Invoked::failed(Failure::Request(internal("the policy's evaluation failed"))),
        )
        .await;
        if let (Some(target), Some(back)) = (object.as_deref_mut(), invoked.object.take()) {
            if in_place || invoked.changed {
                *target = back;
            }
        }
        for o in &invoked.observed {
            observe(&policy.name, &binding.name, o);
        }
        for failure in invoked.failures {
            match failure {
                Failure::Policy(e) => state.failure(policy, binding, &e),
                Failure::Request(e) => return Err(e),
            }
        }
        if !invoked.matched {
            return Ok(false);
        }
        if invoked.changed {
            if let Some(target) = object.as_deref_mut() {
                if let Err(source) = a.interfaces.convert(target, &a.resource.version) {
                    return Err(Error::Conversion { version: a.resource.version.clone(), source });
                }
            }
        }
        round.invoked(&key, invoked.changed, policy.body.reinvoke_if_needed);
        Ok(invoked.applied)
    }

    /// What the policy's expressions see, in the version its rules matched.
    async fn input(
        &self,
        (a, version, reads): (&Attributes, &str, &Reads),
        (object, old): (Option<&Value>, Option<&Value>),
        params: Option<cel::Value>,
        state: &mut Dispatch,
    ) -> Result<Input, Failure> {
        let inv = Invocation::new(a, version, object, old)
            .map_err(|e| Failure::Policy(format!("failed to convert object version: {e}")))?;
        let request = reads.request.reads().then(|| Value::Object(activation::request_fields(&inv.attributes, a)));
        let namespace = match (&state.namespace, reads.namespace.reads()) {
            (_, false) => None,
            (Some(ns), true) => Some(ns.clone()),
            (None, true) => {
                let ns = namespace_object(&self.namespaces, a).await.map_err(Failure::Request)?;
                Some(state.namespace.insert(ns).clone())
            }
        };
        let (old, authorizer) = (inv.old().cloned(), activation::authorizer_value(&self.authorizer, a));
        // The object in the request's own version is the caller's to hand over.
        Ok(Input { object: inv.into_converted_object(), old, request, namespace, params, authorizer })
    }
}

fn observe(policy: &str, binding: &str, o: &Observed) {
    let labels = MutatingPolicyCheckLabels {
        policy: policy.to_owned(),
        policy_binding: binding.to_owned(),
        error_type: o.error_type.to_owned(),
    };
    let m = crate::admission::metrics::metrics();
    m.mutating_policy_checks.get_or_create(&labels).inc();
    m.mutating_policy_check_duration.get_or_create(&labels).observe(o.elapsed.as_secs_f64());
}

/// One invocation: the policy's matchConditions, then, unless this round `skip`s it, its mutations in order on the
/// object (`dispatchInvocations`' loop body). Synchronous: it runs where the authorizer may block.
fn invoke(policy: &MutatingPolicy, input: Input, skip: bool, interfaces: &'static dyn ObjectInterfaces) -> Invoked {
    let reads = &policy.reads;
    let mut out = Invoked {
        matched: false,
        applied: false,
        changed: false,
        object: input.object,
        failures: Vec::new(),
        observed: Vec::new(),
    };
    let mut activation = Activation::new();
    activation
        .bind("oldObject", reads.old.project(input.old.as_ref()))
        .bind("request", reads.request.project(input.request.as_ref()))
        .bind("authorizer", input.authorizer)
        .bind("namespaceObject", cel::Value::Null)
        .bind("object", reads.object.project(out.object.as_ref()));
    if let Some(p) = input.params {
        activation.bind("params", p);
    }
    if !policy.match_conditions.is_empty() {
        // Match conditions see no namespace object, as kube's matcher passes none.
        activation.bind_variables(policy.variables.clone());
        match policy.match_conditions.evaluate(&activation) {
            Matched::Yes => {}
            Matched::No(_) => return out,
            Matched::Error(e) => {
                out.failures.push(Failure::Policy(e));
                return out;
            }
        }
    }
    // In the second round, only what a later change asked to run again (after the conditions, as kube checks it).
    if skip {
        return out;
    }
    out.matched = true;
    // Each mutation sees the object as the ones before it left it, and variables evaluated afresh on it, as kube
    // builds an activation per mutation.
    activation.bind("namespaceObject", reads.namespace.project(input.namespace.as_ref()));
    for m in &policy.body.mutations {
        let Some(current) = &out.object else { continue };
        let started = Instant::now();
        activation.bind("object", reads.object.project(Some(current)));
        activation.bind_variables(policy.variables.clone());
        let result = mutate(m, &activation, current, interfaces);
        let elapsed = started.elapsed();
        match result {
            Ok(object) => {
                out.observed.push(Observed { error_type: "no_error", elapsed });
                out.applied = true;
                out.changed |= object != *current;
                out.object = Some(object);
            }
            Err(Failure::Policy(e)) => {
                out.observed.push(Observed { error_type: error_type(&e), elapsed });
                out.failures.push(Failure::Policy(e));
            }
            Err(Failure::Request(e)) => {
                out.observed.push(Observed { error_type: "invalid_error", elapsed });
                out.failures.push(Failure::Request(e));
                return out;
            }
        }
    }
    out
}

/// One mutation of `object` (`dispatchOne`): evaluated on a budget of its own, applied, defaulted.
fn mutate(
    m: &Mutation,
    activation: &Activation,
    object: &Value,
    interfaces: &'static dyn ObjectInterfaces,
) -> Result<Value, Failure> {
    // An expression that reads nothing of the request has one value: it is evaluated once.
    let patch = match &m.constant {
        Some(cell) => cell.get_or_init(|| patch_of(m, activation)).clone(),
        None => patch_of(m, activation),
    };
    match patch.map_err(Failure::Policy)? {
        Patch::Apply(patch) => {
            let mut patched = mutation::apply_configuration(interfaces, object, &patch).map_err(|e| match e {
                ApplyConfigurationError::KindNotFound(_) => Failure::Request(unavailable(&e.to_string())),
                ApplyConfigurationError::Patch(_) => Failure::Policy(e.to_string()),
            })?;
            interfaces
                .decode_and_default(&mut patched)
                .map_err(|e| Failure::Policy(format!("error applying patch: {e}")))?;
            Ok(patched)
        }
        Patch::Operations(ops) => {
            let mut patched = mutation::json_patch(object, &ops).map_err(Failure::Policy)?;
            // kube decodes the patched object into its type, strictly; one that does not is an internal error.
            interfaces
                .decode_and_default_strict(&mut patched)
                .map_err(|e| Failure::Request(internal(&e.to_string())))?;
            Ok(patched)
        }
    }
}

/// What a mutation's expression evaluates to, as the patch it makes; an error is the policy's failure.
fn patch_of(m: &Mutation, activation: &Activation) -> Result<Patch, String> {
    let program = m.program.as_ref().map_err(compile_error)?;
    let mut budget = Budget::default();
    let value = program.eval(activation, &mut budget).map_err(|e| match e {
        EvalError::OutOfBudget => e.to_string(),
        e => expression_error(program.source(), &e),
    })?;
    match m.patch_type {
        PatchType::ApplyConfiguration => match cel::value::to_json(&value) {
            Some(p @ Value::Object(_)) => Ok(Patch::Apply(p)),
            _ => Err(format!(
                "unsupported return type from ApplyConfiguration expression: {}",
                cel::value::type_name(&value)
            )),
        },
        PatchType::JsonPatch => operations(&value).map(Patch::Operations),
    }
}

/// A JSONPatch expression's value as operations, as `evaluatePatchExpression` builds them.
fn operations(value: &cel::Value) -> Result<Vec<Value>, String> {
    let Some(Value::Array(items)) = cel::value::to_json(value) else {
        return Err("type mismatch: JSONPatchType.expression should evaluate to array".into());
    };
    items
        .into_iter()
        .map(|item| {
            let op = item.as_object().filter(|o| o.get("op").is_some_and(Value::is_string));
            let Some(op) = op else {
                return Err(format!(
                    "type mismatch: JSONPatchType.expression should evaluate to array of JSONPatch, got element of {}",
                    json_type(&item)
                ));
            };
            let text = |f: &str| op.get(f).and_then(Value::as_str).unwrap_or_default();
            let from = Some(text("from")).filter(|f| !f.is_empty());
            Ok(mutation::operation(text("op"), text("path"), from, op.get("value").cloned()))
        })
        .collect()
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

fn unavailable(message: &str) -> Error {
    let status = Status { code: 503, reason: "ServiceUnavailable".into(), ..Status::failure(message, "") };
    Error::Plugin { plugin: MutatingAdmissionPolicyPlugin::NAME, status: Box::new(status) }
}

fn internal(message: &str) -> Error {
    // `apierrors.NewInternalError`: the error as the cause, and in the message after kube's words.
    let details = StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: vec![cause(message)],
        retry_after_seconds: 0,
    };
    let text = format!("Internal error occurred: {message}");
    let status =
        Status { code: 500, reason: "InternalError".into(), details: Some(details), ..Status::failure(&text, "") };
    Error::Plugin { plugin: MutatingAdmissionPolicyPlugin::NAME, status: Box::new(status) }
}
