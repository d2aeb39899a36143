//! ValidatingAdmissionPolicy, as k8s.io/apiserver's `admission/plugin/policy/validating` runs it for its own
//! resources: each policy with a binding that both select the request evaluated ([`evaluate`]) and its decisions
//! enforced as the binding's `validationActions` say: `Deny` refuses (the first denial is the answer), `Warn` adds
//! a warning, `Audit` an entry of the `validation.policy.admission.k8s.io/validation_failure` audit annotation.
//!
//! Policies run in the validating phase after the mutating plugins and before the validating webhooks and quota,
//! for every write (status and scale included) and dry runs.

mod compiled;
mod evaluate;

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

pub use compiled::{ValidatingKind, ValidatingPolicy, Validations};
use evaluate::{Action, Annotation, Decision, Evaluation, Input};

use super::{binding_params, binding_selects, namespace_object, Binding, Hook, Origin, Params, PolicySet, Versioned};
use crate::admission::activation::{self, ExpressionAuthorizer};
use crate::admission::manifest;
use crate::admission::metrics::PolicyCheckLabels;
use crate::admission::namespace::resource_name;
use crate::admission::{Attributes, Error, Handler, Namespaces, Outcome, PluginContext, Validating};
use crate::api::Operation;
use crate::cel;

/// The ValidatingAdmissionPolicies in force.
pub type ValidatingPolicies = PolicySet<ValidatingKind>;

/// The audit annotation of failed validations whose binding says `Audit`.
pub const VALIDATION_FAILURE_ANNOTATION: &str = "validation.policy.admission.k8s.io/validation_failure";
/// At most this many failures go into it (`maxValidationFailures`).
const MAX_VALIDATION_FAILURES: usize = 50;
/// An audit annotation's value is cut at this length (`maxAuditAnnotationValueLength`).
const MAX_ANNOTATION_VALUE: usize = 10 * 1024;

/// The ValidatingAdmissionPolicy plugin.
pub struct ValidatingAdmissionPolicyPlugin {
    policies: ValidatingPolicies,
    params: Params,
    namespaces: Namespaces,
    authorizer: ExpressionAuthorizer,
}

impl ValidatingAdmissionPolicyPlugin {
    pub const NAME: &'static str = "ValidatingAdmissionPolicy";

    pub fn new(
        policies: ValidatingPolicies,
        params: Params,
        namespaces: Namespaces,
        authorizer: ExpressionAuthorizer,
    ) -> Self {
        Self { policies, params, namespaces, authorizer }
    }

    pub(crate) fn factory(ctx: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
        let Some((policies, params)) = ctx.policies() else { return Ok(None) };
        let authorizer = ctx.config().authorizer.clone();
        Ok(Some(Arc::new(Self::new(policies, params, ctx.namespaces().clone(), authorizer))))
    }
}

impl Handler for ValidatingAdmissionPolicyPlugin {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update | Operation::Delete)
    }

    fn validating(&self) -> Option<&dyn Validating> {
        Some(self)
    }

    fn reads_objects(&self, a: &Attributes) -> bool {
        self.policies.may_select(a)
    }

    fn has_synced(&self) -> bool {
        self.policies.has_synced()
    }
}

/// One entry of the validation failure annotation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct ValidationFailure {
    message: String,
    policy: String,
    binding: String,
    expression_index: usize,
    validation_actions: Vec<String>,
}

/// What a request's policies decided so far.
#[derive(Default)]
struct Dispatch {
    /// The first denial: the answer.
    denied: Option<Error>,
    failures: Vec<ValidationFailure>,
    /// `namespaceObject`, read from the cache the first time a policy reads it.
    namespace: Option<Value>,
}

/// `ErrorType(decision)` of `validating/errors.go`.
fn error_type(d: &Decision) -> &'static str {
    if d.evaluation == Evaluation::Admit {
        "no_error"
    } else if d.message.starts_with("compilation") {
        "compile_error"
    } else if d.message.starts_with("validation failed due to running out of cost budget") {
        "out_of_budget"
    } else {
        "invalid_error"
    }
}

fn observe(policy: &str, binding: &str, d: &Decision, action: &str) {
    let labels = PolicyCheckLabels {
        policy: policy.to_owned(),
        policy_binding: binding.to_owned(),
        error_type: error_type(d).to_owned(),
        enforcement_action: action.to_owned(),
    };
    let m = crate::admission::metrics::metrics();
    m.policy_checks.get_or_create(&labels).inc();
    m.policy_check_duration.get_or_create(&labels).observe(d.elapsed.as_secs_f64());
}

impl ValidatingAdmissionPolicyPlugin {
    fn deny(&self, state: &mut Dispatch, a: &Attributes, object: Option<&Value>, message: String, reason: &str) {
        if state.denied.is_none() {
            let reason = if reason.is_empty() { "Invalid" } else { reason };
            state.denied = Some(Error::PolicyDenied {
                resource: a.group_resource(),
                name: resource_name(a, object),
                message,
                reason: reason.to_owned(),
            });
        }
    }

    /// A policy or binding that cannot be applied (`addConfigError`): ignored under `failurePolicy: Ignore`, a
    /// denial otherwise, whatever the binding's actions.
    fn config_error(
        &self,
        state: &mut Dispatch,
        a: &Attributes,
        object: Option<&Value>,
        (policy, binding): (&ValidatingPolicy, Option<&Binding>),
        e: &str,
    ) {
        if policy.fail_open {
            return;
        }
        let message = match binding {
            Some(b) => format!(
                "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: failed to configure binding: {e}",
                policy.name, b.name
            ),
            None => {
                format!("ValidatingAdmissionPolicy '{}' denied request: failed to configure policy: {e}", policy.name)
            }
        };
        self.deny(state, a, object, message, "");
    }

    /// The decisions of one binding's evaluation, enforced as its actions say.
    fn enforce(
        &self,
        state: &mut Dispatch,
        out: &mut Outcome,
        a: &Attributes,
        object: Option<&Value>,
        (policy, binding): (&ValidatingPolicy, &Binding),
        decisions: &[Decision],
    ) {
        for d in decisions {
            match d.action {
                Action::Admit => {
                    if d.evaluation == Evaluation::Error {
                        observe(&policy.name, &binding.name, d, "allow");
                    }
                }
                Action::Deny => {
                    for action in &binding.actions {
                        match action.as_str() {
                            "Deny" => {
                                observe(&policy.name, &binding.name, d, "deny");
                                let message = format!(
                                    "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {}",
                                    policy.name, binding.name, d.message
                                );
                                self.deny(state, a, object, message, &d.reason);
                            }
                            "Warn" => {
                                observe(&policy.name, &binding.name, d, "warn");
                                out.warnings.push(format!(
                                    "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {}",
                                    policy.name, binding.name, d.message
                                ));
                            }
                            "Audit" => {
                                observe(&policy.name, &binding.name, d, "audit");
                                state.failures.push(ValidationFailure {
                                    message: d.message.clone(),
                                    policy: policy.name.clone(),
                                    binding: binding.name.clone(),
                                    expression_index: d.index,
                                    validation_actions: binding.actions.clone(),
                                });
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    async fn dispatch_hook<'a>(
        &self,
        hook: &Hook<ValidatingKind>,
        (a, object, old): (&'a Attributes, Option<&'a Value>, Option<&'a Value>),
        cache: &mut Vec<Versioned<'a>>,
        state: &mut Dispatch,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        let policy = &hook.policy;
        let Some(matcher) = &policy.matcher else {
            self.config_error(
                state,
                a,
                object,
                (policy, None),
                "policy contained no match constraints, a required field",
            );
            return Ok(());
        };
        let version = match matcher.matches(a, object, old, &self.namespaces).await {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.config_error(state, a, object, (policy, None), &e);
                return Ok(());
            }
        };
        let mut annotations: Vec<(String, String)> = Vec::new();
        for binding in &hook.bindings {
            match binding_selects(binding, &self.namespaces, (a, object, old)).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    self.config_error(state, a, object, (policy, Some(binding)), &e);
                    continue;
                }
            }
            let params = match binding_params(&self.params, policy, binding, a).await {
                // No param and `parameterNotFoundAction: Allow`: the binding does not apply.
                Ok(found) if found.is_empty() => continue,
                Ok(found) => found,
                Err(e) => {
                    self.config_error(state, a, object, (policy, Some(binding)), &e);
                    continue;
                }
            };
            let reads = &policy.reads;
            let versioned = match Versioned::of(cache, a, (&version, reads), object, old) {
                Ok(v) => v,
                Err(e) => {
                    let e = format!("failed to convert object version: {e}");
                    self.config_error(state, a, object, (policy, Some(binding)), &e);
                    continue;
                }
            };
            let inv = &versioned.invocation;
            let (object_v, old_v, request_v) = (
                reads.object.project(inv.object()),
                reads.old.project(inv.old()),
                reads.request.project(versioned.request.as_ref()),
            );
            let namespace = match (&state.namespace, reads.namespace.reads()) {
                (_, false) => cel::Value::Null,
                (Some(ns), true) => reads.namespace.project(Some(ns)),
                (None, true) => {
                    reads.namespace.project(Some(state.namespace.insert(namespace_object(&self.namespaces, a).await?)))
                }
            };
            let authorizer = activation::authorizer_value(&self.authorizer, a);
            if policy.origin == Origin::Manifest {
                manifest::record_source(out, manifest::MANIFEST_POLICIES_ANNOTATION, &policy.name);
            }
            for params in params {
                let input = Input {
                    object: object_v.clone(),
                    old: old_v.clone(),
                    request: request_v.clone(),
                    namespace: namespace.clone(),
                    params,
                    authorizer: authorizer.clone(),
                };
                let p = policy.clone();
                let result = activation::evaluate(
                    reads.authorizer,
                    move || evaluate::evaluate(&p, &input),
                    evaluate::Result::default,
                )
                .await;
                self.enforce(state, out, a, object, (policy, binding), &result.decisions);
                for annotation in result.annotations {
                    match annotation {
                        Annotation::Publish { key, mut value } => {
                            if value.len() > MAX_ANNOTATION_VALUE {
                                let mut end = MAX_ANNOTATION_VALUE;
                                while !value.is_char_boundary(end) {
                                    end -= 1;
                                }
                                value.truncate(end);
                            }
                            if !annotations.contains(&(key.clone(), value.clone())) {
                                annotations.push((key, value));
                            }
                        }
                        Annotation::Error(message) => {
                            let message = format!(
                                "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {message}",
                                policy.name, binding.name
                            );
                            self.deny(state, a, object, message, "");
                        }
                    }
                }
            }
        }
        // One annotation per key: distinct values joined, in the order they came.
        let mut by_key: Vec<(String, Vec<String>)> = Vec::new();
        for (key, value) in annotations {
            match by_key.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => by_key.push((key, vec![value])),
            }
        }
        for (key, values) in by_key {
            out.audit_annotations.insert(format!("{}/{key}", policy.name), values.join(", "));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Validating for ValidatingAdmissionPolicyPlugin {
    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        let Some((manifest, cluster)) = self.policies.in_force(&self.namespaces, a, object).await? else {
            return Ok(());
        };
        let mut cache = Vec::new();
        let mut state = Dispatch::default();
        for hook in manifest.iter().chain(cluster.iter()) {
            self.dispatch_hook(hook, (a, object, old), &mut cache, &mut state, out).await?;
        }
        if !state.failures.is_empty() {
            state.failures.truncate(MAX_VALIDATION_FAILURES);
            let value = serde_json::to_string(&state.failures).unwrap_or_default();
            out.audit_annotations.insert(VALIDATION_FAILURE_ANNOTATION.to_owned(), value);
        }
        state.denied.map_or(Ok(()), Err)
    }
}
