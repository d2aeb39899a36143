//! Admission, as kube-apiserver runs it for its own types: NamespaceLifecycle, then the cluster's mutating
//! webhooks (reinvoked once when a later one changed the object), and after schema validation the validating
//! webhooks, all at once. kube-apiserver only proxies an aggregated API, so this server runs them itself.
//!
//! The registry calls [`Admission::admit`] and [`Admission::validate`] on every write, whatever door it came
//! through; nothing here knows HTTP. Namespaces and webhook configurations come from watches of the main API
//! server ([`Chain::start`]).
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

mod error;
mod namespace;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kube::core::{GroupVersionKind, GroupVersionResource};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use error::{denial_code, Error, GroupResource};
pub use namespace::{NamespaceLifecycle, Namespaces};
pub use webhook::{MutatingWebhooks, ValidatingWebhooks, WebhookClients, WebhookConfigurations};

use crate::api::{Operation, Subresource, UserInfo};

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
    /// The object's kind: `demo.k8s.io/v1alpha1 PodSet`, or `autoscaling/v1 Scale` for `/scale`.
    pub kind: GroupVersionKind,
    /// The resource addressed: `demo.k8s.io/v1alpha1 podsets`, whatever the subresource.
    pub resource: GroupVersionResource,
    /// The request's CreateOptions, UpdateOptions, PatchOptions or DeleteOptions, with apiVersion and kind
    /// (`meta.k8s.io/v1`), as AdmissionReview's `request.options` carries them.
    pub options: Value,
}

impl Attributes {
    /// A write to a PodSet, or to its `status` or `scale`.
    pub fn podset(
        operation: Operation,
        subresource: Subresource,
        namespace: impl Into<String>,
        name: impl Into<String>,
        user: UserInfo,
        dry_run: bool,
        options: Value,
    ) -> Self {
        let kind = match subresource {
            Subresource::Scale => GroupVersionKind::gvk("autoscaling", "v1", "Scale"),
            _ => GroupVersionKind::gvk(crate::api::GROUP, crate::api::VERSION, crate::api::KIND),
        };
        Self {
            operation,
            subresource,
            namespace: namespace.into(),
            name: name.into(),
            user,
            dry_run,
            kind,
            resource: GroupVersionResource::gvr(crate::api::GROUP, crate::api::VERSION, crate::api::PLURAL),
            options,
        }
    }

    /// `request.options` as kube-apiserver 1.20 fills it: `kind` is `CreateOptions`, `UpdateOptions`,
    /// `PatchOptions` or `DeleteOptions` (meta.k8s.io/v1), with `dryRun: ["All"]` on a dry run and the
    /// `fieldManager` only when the client named one. An apply that creates the object is a create:
    /// kube-apiserver sends it `CreateOptions` with the apply's field manager.
    pub fn options(kind: &str, dry_run: bool, field_manager: Option<&str>) -> Value {
        let mut o = serde_json::json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
        if dry_run {
            o["dryRun"] = serde_json::json!(["All"]);
        }
        if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
            o["fieldManager"] = m.into();
        }
        o
    }

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

/// An admission plugin, or a chain of them.
#[async_trait]
pub trait Admission: Send + Sync {
    /// Mutating phase (NamespaceLifecycle's check, MutatingAdmissionWebhook with reinvocationPolicy IfNeeded): may
    /// change `object`. `object` is None on delete; `old` is the stored object (None on create). A caller that
    /// sees the object changed decodes and validates it again.
    /// A plugin without this phase admits everything.
    async fn admit(
        &self,
        _a: &Attributes,
        _object: Option<&mut Value>,
        _old: Option<&Value>,
        _out: &mut Outcome,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Validating phase (ValidatingAdmissionWebhook: every matching webhook is called at once). A plugin
    /// without this phase allows everything.
    async fn validate(
        &self,
        _a: &Attributes,
        _object: Option<&Value>,
        _old: Option<&Value>,
        _out: &mut Outcome,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Whether any plugin runs at all; when not, a caller may skip admission and what it would build for it.
    fn runs(&self) -> bool {
        true
    }

    /// Whether a write's objects may be read at all (a webhook may be called); when not, the caller may pass
    /// none and skip building them.
    fn reads_objects(&self) -> bool {
        true
    }
}

/// The admission plugins this server has, by kube-apiserver's names, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plugin {
    NamespaceLifecycle,
    MutatingAdmissionWebhook,
    ValidatingAdmissionWebhook,
}

impl Plugin {
    /// Every plugin, in order; all are on by default, as in k8s.io/apiserver's `RecommendedPluginOrder`.
    pub const ALL: [Plugin; 3] =
        [Plugin::NamespaceLifecycle, Plugin::MutatingAdmissionWebhook, Plugin::ValidatingAdmissionWebhook];

    pub fn name(self) -> &'static str {
        match self {
            Plugin::NamespaceLifecycle => "NamespaceLifecycle",
            Plugin::MutatingAdmissionWebhook => "MutatingAdmissionWebhook",
            Plugin::ValidatingAdmissionWebhook => "ValidatingAdmissionWebhook",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// How long a request waits for a plugin's first list from the main API server before it is refused (403 "not yet
/// ready to handle request"), as k8s.io/apiserver's `admission.Handler.WaitForReady`.
pub const READY_WAIT: Duration = Duration::from_secs(10);

/// The admission chain: the enabled plugins over shared watches of the main API server.
#[derive(Clone, Default)]
pub struct Chain {
    lifecycle: Option<Arc<NamespaceLifecycle>>,
    mutating: Option<Arc<MutatingWebhooks>>,
    validating: Option<Arc<ValidatingWebhooks>>,
    namespaces: Option<Namespaces>,
    configurations: Option<WebhookConfigurations>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("plugins", &self.plugins()).finish()
    }
}

/// What the webhook plugins call webhooks with: for each, the clients made from its `kubeConfigFile` (in
/// `--admission-control-config-file`), or anonymous ones.
#[derive(Debug, Clone, Default)]
pub struct WebhookPluginConfig {
    pub mutating: WebhookClients,
    pub validating: WebhookClients,
}

impl Chain {
    /// No plugins: every request is admitted.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Starts the watches `plugins` need on the main API server (namespaces; webhook configurations) and
    /// returns the chain at once; requests wait for the first lists (up to [`READY_WAIT`]). The watches stop with
    /// `stop`.
    pub fn start(
        plugins: &[Plugin],
        client: kube::Client,
        webhooks: WebhookPluginConfig,
        stop: CancellationToken,
    ) -> Self {
        if plugins.is_empty() {
            return Self::empty();
        }
        let namespaces = Namespaces::watch(client.clone(), stop.clone());
        let has_webhooks = plugins.iter().any(|p| *p != Plugin::NamespaceLifecycle);
        let configurations = has_webhooks.then(|| WebhookConfigurations::watch(client, stop));
        Self::with_sources(plugins, namespaces, configurations, webhooks)
    }

    /// The chain over sources already made (watched, or filled by hand for tests).
    pub fn with_sources(
        plugins: &[Plugin],
        namespaces: Namespaces,
        configurations: Option<WebhookConfigurations>,
        webhooks: WebhookPluginConfig,
    ) -> Self {
        let on = |p| plugins.contains(&p);
        let mut chain = Self { namespaces: Some(namespaces.clone()), ..Self::default() };
        if on(Plugin::NamespaceLifecycle) {
            chain.lifecycle = Some(Arc::new(NamespaceLifecycle::new(namespaces.clone())));
        }
        if let Some(configs) = configurations {
            if on(Plugin::MutatingAdmissionWebhook) {
                let m = MutatingWebhooks::new(configs.clone(), namespaces.clone(), webhooks.mutating);
                chain.mutating = Some(Arc::new(m));
            }
            if on(Plugin::ValidatingAdmissionWebhook) {
                let v = ValidatingWebhooks::new(configs.clone(), namespaces, webhooks.validating);
                chain.validating = Some(Arc::new(v));
            }
            chain.configurations = Some(configs);
        }
        chain
    }

    /// The plugins that run, in order.
    pub fn plugins(&self) -> Vec<Plugin> {
        let mut out = Vec::new();
        if self.lifecycle.is_some() {
            out.push(Plugin::NamespaceLifecycle);
        }
        if self.mutating.is_some() {
            out.push(Plugin::MutatingAdmissionWebhook);
        }
        if self.validating.is_some() {
            out.push(Plugin::ValidatingAdmissionWebhook);
        }
        out
    }

    /// Whether the watches the chain reads have their first lists (for `/readyz`).
    pub fn has_synced(&self) -> bool {
        self.namespaces.as_ref().is_none_or(Namespaces::has_synced)
            && self.configurations.as_ref().is_none_or(WebhookConfigurations::has_synced)
    }
}

/// Records one phase in `apiserver_admission_step_admission_duration_seconds`; `step` is `admit` or `validate`.
fn observe_step(step: &str, a: &Attributes, started: std::time::Instant, rejected: bool) {
    let labels = crate::metrics::AdmissionStepLabels {
        r#type: step.to_owned(),
        operation: a.operation.as_str().to_owned(),
        rejected: rejected.to_string(),
    };
    let m = &crate::metrics::global().admission;
    m.step_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
}

impl Chain {
    async fn admit_rounds(
        &self,
        a: &Attributes,
        mut object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        // k8s.io/apiserver's reinvoker: the whole mutating chain runs again, once, if a webhook changed the
        // object after an IfNeeded webhook had seen it.
        let mut reinvocation = webhook::Reinvocation::default();
        loop {
            if let Some(l) = &self.lifecycle {
                l.admit(a, object.as_deref_mut(), old, out).await?;
            }
            if let Some(m) = &self.mutating {
                m.dispatch(a, object.as_deref_mut(), old, out, &mut reinvocation).await?;
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
        if self.lifecycle.is_none() && self.mutating.is_none() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let result = self.admit_rounds(a, object, old, out).await;
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
        let Some(v) = &self.validating else { return Ok(()) };
        let started = std::time::Instant::now();
        let result = v.validate(a, object, old, out).await;
        observe_step("validate", a, started, result.is_err());
        result
    }

    fn runs(&self) -> bool {
        self.lifecycle.is_some() || self.mutating.is_some() || self.validating.is_some()
    }

    fn reads_objects(&self) -> bool {
        (self.mutating.is_some() || self.validating.is_some())
            && self.configurations.as_ref().is_some_and(WebhookConfigurations::may_call)
    }
}
