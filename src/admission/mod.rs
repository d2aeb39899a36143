//! Admission, as k8s.io/apiserver's `admission/chain.go` runs it for kube-apiserver's own types: a [`Chain`] is a
//! list of plugins ([`Handler`]s), each saying which operations it handles and whether it mutates ([`Mutating`]),
//! validates ([`Validating`]) or both. Today's plugins: NamespaceLifecycle (mutating), then the cluster's mutating
//! webhooks (the mutating phase reinvoked once when a later plugin changed the object), and after schema validation
//! the validating webhooks, all at once. kube-apiserver only proxies an aggregated API, so this server runs them
//! itself.
//!
//! The registry calls the chain once per phase ([`Admission::admit`], [`Admission::validate`]) on every write,
//! whatever door it came through; nothing here knows HTTP or PodSets: the [`Attributes`] name the kind and resource
//! under review and hand in how its objects decode and default ([`ObjectInterfaces`]). Namespaces and webhook
//! configurations come from watches of the main API server ([`Plugins::start`]).
//!
//! Where kube-apiserver 1.20 calls them, as tests/admission.rs saw it for ConfigMaps and Deployments:
//! - `admit` after decoding and defaulting, before the server's own fields: a create's object reaches mutating
//!   webhooks without uid or creationTimestamp, and validating ones with them. After `admit` changed the object,
//!   it is decoded and validated again.
//! - `validate` after validation, before storing; a refusal stores nothing. Dry runs run both.
//! - A create's `name` is the body's (empty with `generateName`); an apply that creates is a `Create` with
//!   `CreateOptions` carrying the apply's field manager; a delete passes no object and the stored one as `old`.
//! - `status` and `scale` writes are `Update`s with their subresource; `/scale`'s objects are `autoscaling/v1`
//!   Scales, which carry no labels (so an objectSelector never selects them, as for a Deployment's scale).

pub mod activation;
mod cache;
mod error;
pub mod manifest;
pub mod matchconditions;
pub mod metrics;
pub mod mutation;
mod namespace;
mod options;
mod plugins;
pub mod policy;
pub mod quota;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kube::core::{GroupVersionKind, GroupVersionResource};
use serde_json::Value;
use tracing::Instrument;

pub use error::{denial_code, policy_reason_code, Error, GroupResource};
pub use mutation::ApplyConfigurationError;
pub use namespace::{NamespaceLifecycle, Namespaces};
pub use options::{RequestOptions, WriteKind};
pub use plugins::{recommended, Factory, PluginConfig, PluginContext, Plugins, Sources, WebhookPluginConfig};
pub use policy::{
    MutatingAdmissionPolicyPlugin, MutatingPolicies, ValidatingAdmissionPolicyPlugin, ValidatingPolicies,
};
pub use quota::{LimitedResource, Quotas, ResourceQuota};
pub use webhook::{MutatingWebhooks, StaticWebhooks, ValidatingWebhooks, WebhookClients, WebhookConfigurations};

use crate::api::{Operation, Subresource, UserInfo};

/// A boxed error of a decode.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the objects under review decode and default, as k8s.io/apiserver's `ObjectInterfaces`: the object a
/// mutating webhook patched goes through it, as kube-apiserver decodes and defaults after every patch (a field set
/// with the wrong type fails here, not in storage).
pub trait ObjectInterfaces: Send + Sync + std::fmt::Debug {
    /// `object` decoded into its type and defaulted, written back as JSON.
    fn decode_and_default(&self, object: &mut Value) -> Result<(), BoxError>;

    /// [`ObjectInterfaces::decode_and_default`], a field the type does not have an error (`strict decoding error:
    /// unknown field "spec.x"`), as kube decodes what a JSON patch made.
    fn decode_and_default_strict(&self, object: &mut Value) -> Result<(), BoxError> {
        self.decode_and_default(object)
    }

    /// The versions of the reviewed resource's group that serve it: equivalent resources, for webhooks whose
    /// rules name another one (`matchPolicy: Equivalent`).
    fn versions(&self) -> &'static [crate::api::resource::VersionInfo] {
        &[]
    }

    /// `object` converted to `version` of its group (a kind of another group, as `/scale`'s Scale, is the same in
    /// every version of the resource and stays as it is).
    fn convert(&self, _object: &mut Value, _version: &str) -> Result<(), BoxError> {
        Ok(())
    }

    /// `patch`, a mutating admission policy's apply configuration, merged into `object` (the object under review,
    /// as JSON) by the schema of the object's kind and version, as k8s.io/apiserver's `ApplyStructuredMergeDiff`:
    /// refused when it names a field the schema does not declare or sets an atomic list, map or struct. The
    /// merged object still has to be decoded and defaulted. A kind without a schema answers
    /// [`ApplyConfigurationError::KindNotFound`], as kube-apiserver does when it has no OpenAPI for the kind.
    fn apply_configuration(&self, object: &Value, _patch: &Value) -> Result<Value, ApplyConfigurationError> {
        Err(ApplyConfigurationError::KindNotFound(mutation::gvk_text(object)))
    }
}

/// What a write is, as k8s.io/apiserver's `admission.Attributes`.
#[derive(Debug, Clone)]
pub struct Attributes {
    pub operation: Operation,
    pub subresource: Subresource,
    pub namespace: String,
    /// The object's name; empty on a create that asks for `generateName` (as kube-apiserver sends it).
    pub name: String,
    /// The original caller (the front proxy's X-Remote-User, -Group, -Extra-*).
    pub user: UserInfo,
    pub dry_run: bool,
    /// The kind of the objects under review: `demo.k8s.io/v1alpha1 PodSet`, or `autoscaling/v1 Scale` for `/scale`.
    pub kind: GroupVersionKind,
    /// The resource addressed: `demo.k8s.io/v1alpha1 podsets`, whatever the subresource.
    pub resource: GroupVersionResource,
    /// How the objects of `kind` decode and default.
    pub interfaces: &'static dyn ObjectInterfaces,
    /// The request's CreateOptions, UpdateOptions, PatchOptions or DeleteOptions, as AdmissionReview's
    /// `request.options` carries them.
    pub options: RequestOptions,
}

impl Attributes {
    fn group_resource(&self) -> GroupResource {
        GroupResource { group: self.resource.group.clone(), resource: self.resource.resource.clone() }
    }
}

/// What admission hands back besides its verdict: warnings for the client (`Warning` headers) and annotations
/// for the audit event, keyed as kube-apiserver keys them (`<webhook name>/<key>`,
/// `mutation.webhook.admission.k8s.io/round_0_index_0`, `patch.webhook.admission.k8s.io/...`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
}

/// Admission as the registry's write path calls it: the whole chain, once per phase.
#[async_trait]
pub trait Admission: Send + Sync {
    /// The mutating phase: may change `object`. `object` is None on delete; `old` is the stored object (None on
    /// create). A caller that sees the object changed decodes and validates it again.
    async fn admit(
        &self,
        a: &Attributes,
        object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error>;

    /// The validating phase, on the object as it is to be stored.
    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error>;

    /// Whether any plugin runs at all; when not, a caller may skip admission and what it would build for it.
    fn runs(&self) -> bool;

    /// In which phase the objects of the write `a` may be read (a webhook may be called, a policy's rules select
    /// it, a quota may name the object); in a phase where they are not, the caller may pass none and skip
    /// building them.
    fn reads_objects(&self, a: &Attributes) -> ObjectReads;
}

/// The phases of a request's admission that may read its objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectReads {
    pub admit: bool,
    pub validate: bool,
}

impl ObjectReads {
    pub fn any(&self) -> bool {
        self.admit || self.validate
    }
}

/// One plugin of the chain, as k8s.io/apiserver's `admission.Interface`: which operations it handles, and its
/// mutating and validating phases, if it has them.
pub trait Handler: Send + Sync {
    /// Its name in `--enable-admission-plugins` (and in metrics and traces).
    fn name(&self) -> &'static str;

    /// Whether it takes part in a request of this operation (`Handles`); every one unless it says otherwise.
    fn handles(&self, _operation: Operation) -> bool {
        true
    }

    /// Its mutating phase (`MutationInterface`).
    fn mutating(&self) -> Option<&dyn Mutating> {
        None
    }

    /// Its validating phase (`ValidationInterface`).
    fn validating(&self) -> Option<&dyn Validating> {
        None
    }

    /// Whether it may read the objects of the request `a` (a webhook that may be called); the others never look
    /// at them.
    fn reads_objects(&self, _a: &Attributes) -> bool {
        false
    }

    /// Whether the caches it reads have their first lists (for `/readyz`).
    fn has_synced(&self) -> bool {
        true
    }
}

/// A plugin's mutating phase.
#[async_trait]
pub trait Mutating: Send + Sync {
    /// May change `object`; `reinvocation` is the request's reinvocation context, shared by the rounds.
    async fn admit(
        &self,
        a: &Attributes,
        object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        reinvocation: &mut Reinvocation,
    ) -> Result<(), Error>;
}

/// A plugin's validating phase.
#[async_trait]
pub trait Validating: Send + Sync {
    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error>;
}

/// k8s.io/apiserver's reinvocation context for one request: whether this is the second round of the mutating
/// phase and whether one is needed, and each plugin's own part ([`PluginReinvocation`], under its name, as kube
/// keeps it), so that one plugin's bookkeeping never reads as another's.
#[derive(Debug, Default)]
pub struct Reinvocation {
    is_reinvoke: bool,
    should_reinvoke: bool,
    plugins: BTreeMap<&'static str, PluginReinvocation>,
}

/// What one plugin remembers across the rounds: its last output, and which of its IfNeeded invocations saw the
/// object before a later change and so run again.
#[derive(Debug, Default)]
pub struct PluginReinvocation {
    last_output: Option<Value>,
    previously_invoked: std::collections::BTreeSet<String>,
    to_reinvoke: std::collections::BTreeSet<String>,
}

impl Reinvocation {
    /// Moves to the second round if one is needed; false when the mutating phase is done. A second round in which
    /// no plugin has an IfNeeded invocation to run again would run nothing, and is not started.
    fn start_next_round(&mut self) -> bool {
        let reinvocable = self.plugins.values().any(|p| !p.previously_invoked.is_empty() || !p.to_reinvoke.is_empty());
        if self.is_reinvoke || !self.should_reinvoke || !reinvocable {
            return false;
        }
        self.is_reinvoke = true;
        true
    }

    /// The round as the plugin `name` takes part in it.
    pub fn plugin(&mut self, name: &'static str) -> PluginRound<'_> {
        PluginRound {
            is_reinvoke: self.is_reinvoke,
            should_reinvoke: &mut self.should_reinvoke,
            state: self.plugins.entry(name).or_default(),
        }
    }
}

/// One plugin's view of the current round.
pub struct PluginRound<'a> {
    is_reinvoke: bool,
    should_reinvoke: &'a mut bool,
    state: &'a mut PluginReinvocation,
}

impl PluginRound<'_> {
    /// Whether this is the second round.
    pub fn is_reinvoke(&self) -> bool {
        self.is_reinvoke
    }

    /// At the start of the plugin's turn: when another plugin changed the object since this one last returned
    /// it, its IfNeeded invocations run again.
    pub fn begin(&mut self, object: Option<&Value>) {
        if self.is_reinvoke && self.state.last_output.as_ref() != object {
            self.require_reinvoking_previously_invoked();
        }
    }

    /// At the end of the plugin's turn: the object it returns, kept only where the second round compares it (the
    /// first round's, when the plugin has IfNeeded invocations to run again): no copy of every object otherwise.
    pub fn end(&mut self, object: Option<&Value>) {
        let compared = !self.is_reinvoke && !self.state.previously_invoked.is_empty();
        self.state.last_output = compared.then(|| object.cloned()).flatten();
    }

    /// Whether the invocation `key` sits out this round: in the second, only those to reinvoke run.
    pub fn skips(&self, key: &str) -> bool {
        self.is_reinvoke && !self.state.to_reinvoke.contains(key)
    }

    /// The invocation `key` ran; `changed` says whether it changed the object, `if_needed` whether it is
    /// reinvoked when a later one does.
    pub fn invoked(&mut self, key: &str, changed: bool, if_needed: bool) {
        if changed {
            self.require_reinvoking_previously_invoked();
            *self.should_reinvoke = true;
        }
        if if_needed {
            self.state.previously_invoked.insert(key.to_owned());
        }
    }

    /// The plugin changed the object in this round (kube's `Dirty`): its IfNeeded invocations so far run again,
    /// and a second round is asked for.
    pub fn mutated(&mut self) {
        self.require_reinvoking_previously_invoked();
        *self.should_reinvoke = true;
    }

    fn require_reinvoking_previously_invoked(&mut self) {
        let s = &mut *self.state;
        s.to_reinvoke.append(&mut s.previously_invoked);
    }
}

/// How long a request waits for a plugin's first list from the main API server before it is refused (403 "not yet
/// ready to handle request"), as k8s.io/apiserver's `admission.Handler.WaitForReady`.
pub const READY_WAIT: Duration = Duration::from_secs(10);

/// The admission chain: the enabled plugins, in order, over shared watches of the main API server.
#[derive(Clone, Default)]
pub struct Chain {
    handlers: Vec<Arc<dyn Handler>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("plugins", &self.plugins()).finish()
    }
}

impl Chain {
    /// No plugins: every request is admitted.
    pub fn empty() -> Self {
        Self::default()
    }

    /// A chain of these plugins, in this order.
    pub fn new(handlers: Vec<Arc<dyn Handler>>) -> Self {
        Self { handlers }
    }

    /// The plugins that run, in order.
    pub fn plugins(&self) -> Vec<&'static str> {
        self.handlers.iter().map(|h| h.name()).collect()
    }

    /// Whether the watches the chain reads have their first lists (for `/readyz`).
    pub fn has_synced(&self) -> bool {
        self.handlers.iter().all(|h| h.has_synced())
    }
}

/// Records one plugin's phase in `apiserver_admission_controller_admission_duration_seconds`.
fn observe_plugin(name: &str, step: &str, a: &Attributes, started: std::time::Instant, rejected: bool) {
    let labels = crate::admission::metrics::AdmissionControllerLabels {
        name: name.to_owned(),
        r#type: step.to_owned(),
        operation: a.operation.as_str().to_owned(),
        rejected: rejected.to_string(),
    };
    let m = crate::admission::metrics::metrics();
    m.controller_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
}

/// Records one phase in `apiserver_admission_step_admission_duration_seconds`; `step` is `admit` or `validate`.
fn observe_step(step: &str, a: &Attributes, started: std::time::Instant, rejected: bool) {
    let labels = crate::admission::metrics::AdmissionStepLabels {
        r#type: step.to_owned(),
        operation: a.operation.as_str().to_owned(),
        rejected: rejected.to_string(),
    };
    let m = crate::admission::metrics::metrics();
    m.step_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
}

impl Chain {
    /// Every mutating plugin that handles `a`, in order; the whole phase runs again, once, when a plugin changed
    /// the object after an IfNeeded webhook had seen it (k8s.io/apiserver's reinvoker).
    async fn admit_rounds(
        &self,
        plugins: &[(&'static str, &dyn Mutating)],
        a: &Attributes,
        mut object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        let mut reinvocation = Reinvocation::default();
        loop {
            for (name, p) in plugins {
                let started = std::time::Instant::now();
                let span = tracing::info_span!("admission.plugin", otel.name = *name, phase = "admit");
                let result = p.admit(a, object.as_deref_mut(), old, out, &mut reinvocation).instrument(span).await;
                observe_plugin(name, "admit", a, started, result.is_err());
                result?;
            }
            if !reinvocation.start_next_round() {
                return Ok(());
            }
        }
    }
}

#[async_trait]
impl Admission for Chain {
    async fn admit(
        &self,
        a: &Attributes,
        object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        // The phase is timed whenever the chain has one, as k8s.io/apiserver times it, even when no plugin
        // handles this operation.
        if !self.handlers.iter().any(|h| h.mutating().is_some()) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let plugins: Vec<(&'static str, &dyn Mutating)> = self
            .handlers
            .iter()
            .filter(|h| h.handles(a.operation))
            .filter_map(|h| h.mutating().map(|m| (h.name(), m)))
            .collect();
        let span = tracing::info_span!("admission", otel.name = "Admit", operation = a.operation.as_str());
        let result = self.admit_rounds(&plugins, a, object, old, out).instrument(span).await;
        observe_step("admit", a, started, result.is_err());
        result
    }

    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        if !self.handlers.iter().any(|h| h.validating().is_some()) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let plugins = self
            .handlers
            .iter()
            .filter(|h| h.handles(a.operation))
            .filter_map(|h| h.validating().map(|v| (h.name(), v)));
        let mut result = Ok(());
        let phase = tracing::info_span!("admission", otel.name = "Validate", operation = a.operation.as_str());
        for (name, p) in plugins {
            let begun = std::time::Instant::now();
            let span = tracing::info_span!(parent: &phase, "admission.plugin", otel.name = name, phase = "validate");
            result = p.validate(a, object, old, out).instrument(span).await;
            observe_plugin(name, "validate", a, begun, result.is_err());
            if result.is_err() {
                break;
            }
        }
        drop(phase);
        observe_step("validate", a, started, result.is_err());
        result
    }

    fn runs(&self) -> bool {
        !self.handlers.is_empty()
    }

    fn reads_objects(&self, a: &Attributes) -> ObjectReads {
        let reading = || self.handlers.iter().filter(|h| h.handles(a.operation) && h.reads_objects(a));
        ObjectReads {
            admit: reading().any(|h| h.mutating().is_some()),
            validate: reading().any(|h| h.validating().is_some()),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Objects taken as they are: the plugins' tests need no type behind them.
    #[derive(Debug)]
    struct AsTheyAre;

    impl ObjectInterfaces for AsTheyAre {
        fn decode_and_default(&self, _object: &mut Value) -> Result<(), BoxError> {
            Ok(())
        }
    }

    /// A write to `demo.k8s.io/v1alpha1 podsets` (a Scale for `/scale`), as the registry describes one.
    pub(crate) fn attributes(op: Operation, sub: Subresource, ns: &str, name: &str, user: UserInfo) -> Attributes {
        let kind = match sub {
            Subresource::Scale => GroupVersionKind::gvk("autoscaling", "v1", "Scale"),
            _ => GroupVersionKind::gvk("demo.k8s.io", "v1alpha1", "PodSet"),
        };
        Attributes {
            operation: op,
            subresource: sub,
            namespace: ns.into(),
            name: name.into(),
            user,
            dry_run: false,
            kind,
            resource: GroupVersionResource::gvr("demo.k8s.io", "v1alpha1", "podsets"),
            interfaces: &AsTheyAre,
            options: RequestOptions::write(WriteKind::Update, false, None),
        }
    }
}
