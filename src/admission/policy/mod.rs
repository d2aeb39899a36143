//! ValidatingAdmissionPolicy, as k8s.io/apiserver's `admission/plugin/policy/validating` runs it for its own
//! resources: the policies and bindings of `staticManifestsDir` ([`manifests`]), then the cluster's, each policy
//! with a binding that both select the request evaluated ([`evaluate`]) and its decisions enforced as the binding's
//! `validationActions` say: `Deny` refuses (the first denial is the answer), `Warn` adds a warning, `Audit` an
//! entry of the `validation.policy.admission.k8s.io/validation_failure` audit annotation.
//!
//! Policies run in the validating phase after the mutating webhooks and before the validating webhooks and quota,
//! for every write (status and scale included) and dry runs. Order: manifests first, then policies by name, and a
//! policy's bindings by name (kube's order is a map's, unspecified).

pub mod cluster;
mod compiled;
mod evaluate;
pub mod manifests;
mod matching;
mod params;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use parking_lot::RwLock;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

pub use compiled::{Binding, Origin, Policy};
use evaluate::{Action, Annotation, Decision, Evaluation, Input};
pub use params::Params;

use super::activation::{self, ExpressionAuthorizer, Invocation, Reads};
use super::manifest;
use super::namespace::resource_name;
use super::{Attributes, Error, Handler, Namespaces, Outcome, PluginContext, Validating, READY_WAIT};
use crate::api::Operation;

use crate::admission::metrics::PolicyCheckLabels;
use crate::cel;

/// The audit annotation of failed validations whose binding says `Audit`.
pub const VALIDATION_FAILURE_ANNOTATION: &str = "validation.policy.admission.k8s.io/validation_failure";
/// At most this many failures go into it (`maxValidationFailures`).
const MAX_VALIDATION_FAILURES: usize = 50;
/// An audit annotation's value is cut at this length (`maxAuditAnnotationValueLength`).
const MAX_ANNOTATION_VALUE: usize = 10 * 1024;

/// A policy with the bindings that name it.
#[derive(Debug, Clone)]
pub struct Hook {
    pub policy: Arc<Policy>,
    pub bindings: Vec<Arc<Binding>>,
}

/// Pairs policies with their bindings: policies by name, each binding under the policy it names; a policy
/// without bindings, or a binding whose policy is missing, is left out (kube evaluates neither).
pub fn hooks(policies: Vec<Arc<Policy>>, bindings: Vec<Arc<Binding>>) -> Vec<Hook> {
    let mut by_policy: BTreeMap<&str, Vec<Arc<Binding>>> = BTreeMap::new();
    for b in &bindings {
        by_policy.entry(b.policy_name.as_str()).or_default().push(b.clone());
    }
    let mut policies = policies;
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    policies
        .into_iter()
        .filter_map(|policy| {
            let mut bindings = by_policy.get(policy.name.as_str())?.clone();
            bindings.sort_by(|a, b| a.name.cmp(&b.name));
            Some(Hook { policy, bindings })
        })
        .collect()
}

/// The policies in force: from manifests and from the cluster, each replaced whole when its source changes.
#[derive(Clone)]
pub struct Policies {
    manifest: Arc<RwLock<Arc<[Hook]>>>,
    cluster: Arc<RwLock<Arc<[Hook]>>>,
    /// Whether the cluster's first lists are in (or the cluster does not serve the API).
    synced: watch::Sender<bool>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, c) = self.current();
        f.debug_struct("Policies").field("manifest", &m.len()).field("cluster", &c.len()).finish()
    }
}

impl Default for Policies {
    fn default() -> Self {
        Self {
            manifest: Arc::new(RwLock::new(Arc::from(Vec::new()))),
            cluster: Arc::new(RwLock::new(Arc::from(Vec::new()))),
            synced: watch::Sender::new(false),
        }
    }
}

impl Policies {
    /// These policies and bindings as the cluster's, and no source behind them.
    pub fn fixed(policies: &[ValidatingAdmissionPolicy], bindings: &[ValidatingAdmissionPolicyBinding]) -> Self {
        let this = Self::default();
        let p = policies.iter().map(|p| Arc::new(Policy::compile(p, Origin::Cluster))).collect();
        let b = bindings.iter().map(|b| Arc::new(Binding::compile(b))).collect();
        this.set_cluster(hooks(p, b));
        this
    }

    pub fn set_manifests(&self, hooks: Vec<Hook>) {
        *self.manifest.write() = Arc::from(hooks);
    }

    pub fn set_cluster(&self, hooks: Vec<Hook>) {
        *self.cluster.write() = Arc::from(hooks);
        self.synced.send_replace(true);
    }

    /// The cluster's policies are not read (not served, or no main API server): only manifests count.
    pub fn cluster_absent(&self) {
        self.set_cluster(Vec::new());
    }

    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn current(&self) -> (Arc<[Hook]>, Arc<[Hook]>) {
        (self.manifest.read().clone(), self.cluster.read().clone())
    }

    fn is_empty(&self) -> bool {
        self.manifest.read().is_empty() && self.cluster.read().is_empty()
    }

    async fn wait_for_ready(&self) -> bool {
        let mut rx = self.synced.subscribe();
        let ready = matches!(tokio::time::timeout(READY_WAIT, rx.wait_for(|s| *s)).await, Ok(Ok(_)));
        ready
    }
}

/// The ValidatingAdmissionPolicy plugin.
pub struct ValidatingAdmissionPolicyPlugin {
    policies: Policies,
    params: Params,
    namespaces: Namespaces,
    authorizer: ExpressionAuthorizer,
}

impl ValidatingAdmissionPolicyPlugin {
    pub const NAME: &'static str = "ValidatingAdmissionPolicy";

    pub fn new(policies: Policies, params: Params, namespaces: Namespaces, authorizer: ExpressionAuthorizer) -> Self {
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

    /// Only when a policy's rules could select the request: policies for other resources cost a write nothing.
    fn reads_objects(&self, a: &Attributes) -> bool {
        if !self.policies.has_synced() {
            return true;
        }
        let (manifest, cluster) = self.policies.current();
        manifest.iter().chain(cluster.iter()).any(|h| h.policy.matcher.as_ref().is_none_or(|m| m.may_select(a)))
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

/// The request in one version, converted once and shared by every policy that selects it there; its `request`
/// built the first time a policy reads it. Each policy is given only what it reads of them.
struct Versioned<'a> {
    invocation: Invocation<'a>,
    request: Option<Value>,
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
        (policy, binding): (&Policy, Option<&Binding>),
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

    /// The request in `version`, converted once.
    fn versioned<'v, 'a>(
        cache: &'v mut Vec<Versioned<'a>>,
        a: &'a Attributes,
        (version, reads): (&str, &Reads),
        object: Option<&'a Value>,
        old: Option<&'a Value>,
    ) -> Result<&'v Versioned<'a>, Error> {
        let i = match cache.iter().position(|v| v.invocation.attributes.resource.version == version) {
            Some(i) => i,
            None => {
                cache.push(Versioned { invocation: Invocation::new(a, version, object, old)?, request: None });
                cache.len() - 1
            }
        };
        let v = &mut cache[i];
        if reads.request.reads() && v.request.is_none() {
            v.request = Some(Value::Object(activation::request_fields(&v.invocation.attributes, a)));
        }
        Ok(&cache[i])
    }

    /// `namespaceObject`: the request's namespace as `CreateNamespaceObject` copies it; null when cluster-scoped.
    async fn namespace_object(&self, a: &Attributes) -> Result<Value, Error> {
        if a.namespace.is_empty() {
            return Ok(Value::Null);
        }
        let ns = self.namespaces.get(&a.namespace).await?;
        let mut v = serde_json::to_value(&*ns).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
            if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
                meta.remove("ownerReferences");
            }
        }
        Ok(v)
    }

    /// The decisions of one binding's evaluation, enforced as its actions say.
    fn enforce(
        &self,
        state: &mut Dispatch,
        out: &mut Outcome,
        a: &Attributes,
        object: Option<&Value>,
        (policy, binding): (&Policy, &Binding),
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
        hook: &Hook,
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
            if let Some(m) = &binding.matcher {
                match m.matches(a, object, old, &self.namespaces).await {
                    Ok(Some(_)) => {}
                    Ok(None) => continue,
                    Err(e) => {
                        self.config_error(state, a, object, (policy, Some(binding)), &e);
                        continue;
                    }
                }
            }
            let params = match (&policy.param_kind, &binding.param_ref) {
                (None, _) => vec![None],
                (Some(_), None) => vec![Some(cel::Value::Null)],
                (Some(kind), Some(r)) => match self.params.collect(kind, r, &a.namespace).await {
                    // No param and `parameterNotFoundAction: Allow`: the binding does not apply.
                    Ok(found) if found.is_empty() => continue,
                    Ok(found) => found.into_iter().map(Some).collect(),
                    Err(e) => {
                        self.config_error(state, a, object, (policy, Some(binding)), &e);
                        continue;
                    }
                },
            };
            let reads = &policy.reads;
            let versioned = match Self::versioned(cache, a, (&version, reads), object, old) {
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
                (None, true) => reads.namespace.project(Some(state.namespace.insert(self.namespace_object(a).await?))),
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
        if self.policies.has_synced() && self.policies.is_empty() {
            return Ok(());
        }
        if !self.policies.wait_for_ready().await || !self.namespaces.wait_for_ready().await {
            return Err(Error::NotReady { resource: a.group_resource(), name: resource_name(a, object) });
        }
        let (manifest, cluster) = self.policies.current();
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
