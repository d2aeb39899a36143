//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook: the cluster's webhook configurations
//! (`admissionregistration.k8s.io/v1`, watched from the main API server), which of their webhooks a request
//! concerns, and calling them as k8s.io/apiserver's mutating and validating dispatchers do.

mod client;
pub mod manifests;
mod review;
pub(crate) mod rules;
mod verify;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::RwLock;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use client::{CallError, WebhookClients};
use review::ReviewVersion;
pub use verify::san_names;

use super::activation::{self, ExpressionAuthorizer, Invocation};
use super::manifest;
use super::matchconditions::{self, MatchConditions, Matched};
use super::namespace::resource_name;
use super::{Attributes, Error, Handler, Mutating, Namespaces, Outcome, Plugin, Reinvocation, Validating, READY_WAIT};
use crate::api::selector::Selector;

/// A webhook's wait when its configuration gives no `timeoutSeconds` (v1's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// One webhook of a configuration, ready to match and call.
#[derive(Debug)]
pub struct Hook {
    /// `<configuration>/<webhook>/<n>`: webhook names need not be unique within a configuration.
    uid: String,
    configuration: String,
    name: String,
    rules: Vec<RuleWithOperations>,
    /// `Exact`, or `Equivalent` (v1's default: also called for the same resource in another served version).
    match_policy: Option<String>,
    namespace_selector: Result<Selector, String>,
    object_selector: Result<Selector, String>,
    ignore_failures: bool,
    side_effects: Option<String>,
    timeout: Duration,
    review_versions: Vec<String>,
    reinvoke_if_needed: bool,
    client_config: WebhookClientConfig,
    /// Compiled when the configuration is read; an expression that does not compile fails when evaluated.
    match_conditions: Arc<MatchConditions>,
}

impl Hook {
    /// Names it in the request's audit annotations when it comes from a manifest.
    fn record_source(&self, out: &mut Outcome) {
        if self.configuration.ends_with(manifest::STATIC_SUFFIX) {
            manifest::record_source(out, manifest::MANIFEST_WEBHOOKS_ANNOTATION, &self.name);
        }
    }

    fn configuration_error(&self, message: &str) -> Error {
        Error::Configuration { webhook: self.name.clone(), message: message.to_owned() }
    }
}

/// The fields both kinds of webhook share.
struct HookSpec<'a> {
    name: &'a str,
    rules: &'a Option<Vec<RuleWithOperations>>,
    match_policy: &'a Option<String>,
    namespace_selector: &'a Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    object_selector: &'a Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    failure_policy: &'a Option<String>,
    side_effects: &'a str,
    timeout_seconds: Option<i32>,
    review_versions: &'a [String],
    reinvocation_policy: Option<&'a str>,
    client_config: &'a WebhookClientConfig,
    match_conditions: &'a Option<Vec<MatchCondition>>,
}

fn selector(s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>) -> Result<Selector, String> {
    s.as_ref().map_or(Ok(Selector::default()), Selector::from_label_selector)
}

fn mutating_spec(h: &MutatingWebhook) -> HookSpec<'_> {
    HookSpec {
        name: &h.name,
        rules: &h.rules,
        match_policy: &h.match_policy,
        namespace_selector: &h.namespace_selector,
        object_selector: &h.object_selector,
        failure_policy: &h.failure_policy,
        side_effects: &h.side_effects,
        timeout_seconds: h.timeout_seconds,
        review_versions: &h.admission_review_versions,
        reinvocation_policy: h.reinvocation_policy.as_deref(),
        client_config: &h.client_config,
        match_conditions: &h.match_conditions,
    }
}

fn validating_spec(h: &ValidatingWebhook) -> HookSpec<'_> {
    HookSpec {
        name: &h.name,
        rules: &h.rules,
        match_policy: &h.match_policy,
        namespace_selector: &h.namespace_selector,
        object_selector: &h.object_selector,
        failure_policy: &h.failure_policy,
        side_effects: &h.side_effects,
        timeout_seconds: h.timeout_seconds,
        review_versions: &h.admission_review_versions,
        reinvocation_policy: None,
        client_config: &h.client_config,
        match_conditions: &h.match_conditions,
    }
}

/// The webhooks of `configurations` in the order kube-apiserver calls them: configurations by name, webhooks as
/// listed.
fn hooks_of<'a, C: 'a>(
    configurations: impl IntoIterator<Item = &'a C>,
    name_of: impl Fn(&C) -> &str,
    specs: impl Fn(&'a C) -> Vec<HookSpec<'a>>,
) -> Vec<Arc<Hook>> {
    let mut configurations: Vec<&C> = configurations.into_iter().collect();
    configurations.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    let mut hooks = Vec::new();
    for c in configurations {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for h in specs(c) {
            let n = seen.entry(h.name).or_default();
            let uid = format!("{}/{}/{n}", name_of(c), h.name);
            *n += 1;
            hooks.push(Arc::new(Hook {
                uid,
                configuration: name_of(c).to_owned(),
                name: h.name.to_owned(),
                rules: h.rules.clone().unwrap_or_default(),
                match_policy: h.match_policy.clone(),
                namespace_selector: selector(h.namespace_selector),
                object_selector: selector(h.object_selector),
                ignore_failures: h.failure_policy.as_deref() == Some("Ignore"),
                side_effects: Some(h.side_effects.to_owned()).filter(|s| !s.is_empty()),
                timeout: h
                    .timeout_seconds
                    .map_or(DEFAULT_TIMEOUT, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0).max(1))),
                review_versions: h.review_versions.to_vec(),
                reinvoke_if_needed: h.reinvocation_policy == Some("IfNeeded"),
                client_config: h.client_config.clone(),
                match_conditions: Arc::new(MatchConditions::compile(
                    h.match_conditions.as_deref().unwrap_or_default(),
                    activation::DECLARED,
                )),
            }));
        }
    }
    hooks
}

pub(crate) fn mutating_hooks_of<'a>(
    configs: impl IntoIterator<Item = &'a MutatingWebhookConfiguration>,
) -> Vec<Arc<Hook>> {
    hooks_of(
        configs,
        |c: &MutatingWebhookConfiguration| c.metadata.name.as_deref().unwrap_or(""),
        |c| c.webhooks.iter().flatten().map(mutating_spec).collect(),
    )
}

pub(crate) fn validating_hooks_of<'a>(
    configs: impl IntoIterator<Item = &'a ValidatingWebhookConfiguration>,
) -> Vec<Arc<Hook>> {
    hooks_of(
        configs,
        |c: &ValidatingWebhookConfiguration| c.metadata.name.as_deref().unwrap_or(""),
        |c| c.webhooks.iter().flatten().map(validating_spec).collect(),
    )
}

/// One kind's webhooks as last listed, and whether the first list is in.
#[derive(Clone)]
struct HookList {
    hooks: Arc<RwLock<Arc<[Arc<Hook>]>>>,
    synced: watch::Sender<bool>,
}

impl HookList {
    fn new() -> Self {
        Self { hooks: Arc::new(RwLock::new(Arc::from(Vec::new()))), synced: watch::Sender::new(false) }
    }

    fn set(&self, hooks: Vec<Arc<Hook>>) {
        *self.hooks.write() = Arc::from(hooks);
        self.synced.send_replace(true);
    }

    fn get(&self) -> Arc<[Arc<Hook>]> {
        self.hooks.read().clone()
    }

    async fn wait_for_ready(&self) -> bool {
        let mut rx = self.synced.subscribe();
        let ready = matches!(tokio::time::timeout(READY_WAIT, rx.wait_for(|s| *s)).await, Ok(Ok(_)));
        ready
    }
}

/// Webhooks from `staticManifestsDir`: called before the cluster's, in force from the first request.
#[derive(Clone, Default)]
pub struct StaticWebhooks {
    mutating: Arc<RwLock<Arc<[Arc<Hook>]>>>,
    validating: Arc<RwLock<Arc<[Arc<Hook>]>>>,
}

impl std::fmt::Debug for StaticWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticWebhooks")
            .field("mutating", &self.mutating.read().len())
            .field("validating", &self.validating.read().len())
            .finish()
    }
}

impl StaticWebhooks {
    pub(crate) fn set_mutating(&self, hooks: Vec<Arc<Hook>>) {
        *self.mutating.write() = Arc::from(hooks);
    }

    pub(crate) fn set_validating(&self, hooks: Vec<Arc<Hook>>) {
        *self.validating.write() = Arc::from(hooks);
    }
}

/// The cluster's Mutating- and ValidatingWebhookConfigurations, after those of manifests.
#[derive(Clone)]
pub struct WebhookConfigurations {
    mutating: HookList,
    validating: HookList,
    statics: StaticWebhooks,
}

impl WebhookConfigurations {
    /// Watches both kinds until `stop`.
    pub fn watch(client: kube::Client, stop: CancellationToken) -> Self {
        let this = Self { mutating: HookList::new(), validating: HookList::new(), statics: StaticWebhooks::default() };
        spawn_watch(kube::Api::all(client.clone()), this.mutating.clone(), stop.clone(), |s| {
            mutating_hooks_of(s.state().iter().map(|c| &**c))
        });
        spawn_watch(kube::Api::all(client), this.validating.clone(), stop, |s| {
            validating_hooks_of(s.state().iter().map(|c| &**c))
        });
        this
    }

    /// These configurations and no others, with no main API server behind them.
    pub fn fixed(mutating: &[MutatingWebhookConfiguration], validating: &[ValidatingWebhookConfiguration]) -> Self {
        let this = Self { mutating: HookList::new(), validating: HookList::new(), statics: StaticWebhooks::default() };
        this.mutating.set(mutating_hooks_of(mutating));
        this.validating.set(validating_hooks_of(validating));
        this
    }

    pub fn has_synced(&self) -> bool {
        *self.mutating.synced.borrow() && *self.validating.synced.borrow()
    }

    /// These configurations with the webhooks of manifests before them.
    pub fn with_statics(mut self, statics: StaticWebhooks) -> Self {
        self.statics = statics;
        self
    }

    /// Whether any webhook may be called: there is one, or the first lists are still to come.
    pub fn may_call(&self) -> bool {
        !self.has_synced()
            || !self.mutating.get().is_empty()
            || !self.validating.get().is_empty()
            || !self.statics.mutating.read().is_empty()
            || !self.statics.validating.read().is_empty()
    }

    fn mutating_hooks(&self) -> Arc<[Arc<Hook>]> {
        with_statics(&self.statics.mutating, self.mutating.get())
    }

    fn validating_hooks(&self) -> Arc<[Arc<Hook>]> {
        with_statics(&self.statics.validating, self.validating.get())
    }
}

/// The manifests' webhooks, then the cluster's; without manifests, the cluster's list as it is (no copy per
/// request).
fn with_statics(statics: &RwLock<Arc<[Arc<Hook>]>>, cluster: Arc<[Arc<Hook>]>) -> Arc<[Arc<Hook>]> {
    let statics = statics.read().clone();
    if statics.is_empty() {
        return cluster;
    }
    statics.iter().chain(cluster.iter()).cloned().collect()
}

/// Keeps `list` equal to what a watch of `api` sees, rebuilt on every change.
fn spawn_watch<K>(
    api: kube::Api<K>,
    list: HookList,
    stop: CancellationToken,
    build: impl Fn(&Store<K>) -> Vec<Arc<Hook>> + Send + 'static,
) where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
    let kind = K::kind(&()).into_owned();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut ready = false;
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                Ok(watcher::Event::InitDone) => ready = true,
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, kind, "admission: watching webhook configurations");
                    continue;
                }
            }
            if ready {
                list.set(build(&store));
            }
        }
    });
}

/// How each mutating webhook's call is recorded in the audit event.
#[derive(Serialize)]
struct MutationAnnotation<'a> {
    configuration: &'a str,
    webhook: &'a str,
    mutated: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PatchAnnotation<'a> {
    configuration: &'a str,
    webhook: &'a str,
    patch: &'a json_patch::Patch,
    patch_type: &'a str,
}

/// Calls `hook` for `a` (after the dry-run check) and checks its answer. Warnings and audit annotations go to
/// `out` whatever the verdict.
async fn call(
    clients: &WebhookClients,
    hook: &Hook,
    a: &Attributes,
    invocation: &Invocation<'_>,
    mutating: bool,
    out: &mut Outcome,
) -> Result<review::Answer, Error> {
    let calling = |source| Error::Calling { webhook: hook.name.clone(), source };
    if a.dry_run {
        match hook.side_effects.as_deref() {
            None => return Err(calling(CallError::SideEffectsUnset)),
            Some("None" | "NoneOnDryRun") => {}
            Some(_) => return Err(Error::DryRunUnsupported { webhook: hook.name.clone() }),
        }
    }
    let version = ReviewVersion::pick(&hook.review_versions).map_err(calling)?;
    let uid = uuid::Uuid::new_v4().to_string();
    let request = review::request(version, &uid, &invocation.attributes, a, invocation.object(), invocation.old());
    // k8s.io/apiserver's span for a webhook call; the call carries its context.
    let span = tracing::info_span!(
        "webhook",
        otel.name = if mutating { "Call mutating webhook" } else { "Call validating webhook" },
        configuration = %hook.configuration,
        webhook = %hook.name,
        resource = %format_args!("{}/{}, Resource={}", a.resource.group, a.resource.version, a.resource.resource),
        subresource = a.subresource.as_str(),
        operation = a.operation.as_str(),
        UID = %uid,
    );
    let body = clients.post(&hook.client_config, &request, hook.timeout).instrument(span).await.map_err(calling)?;
    let answer = review::answer(version, &uid, mutating, &body).map_err(calling)?;
    for (k, v) in &answer.audit_annotations {
        out.audit_annotations.insert(format!("{}/{k}", hook.name), v.clone());
    }
    out.warnings.extend(answer.warnings.iter().cloned());
    if !answer.allowed {
        return Err(Error::Denied { webhook: hook.name.clone(), status: answer.status });
    }
    Ok(answer)
}

/// Records one call of `hook` in `apiserver_admission_webhook_*`; `step` is `admit` or `validating`.
fn observe(hook: &Hook, step: &str, a: &Attributes, took: Duration, error: Option<&Error>) {
    use crate::metrics::{AdmissionRejectionLabels, AdmissionWebhookLabels};
    let m = &crate::metrics::global().admission;
    let rejected = match error {
        None => false,
        Some(Error::Calling { .. }) => !hook.ignore_failures,
        Some(_) => true,
    };
    if let Some(e) = error.filter(|_| rejected) {
        let (error_type, code) = match e {
            Error::Calling { .. } => ("calling_webhook_error", 0),
            Error::Denied { status, .. } => ("no_error", super::denial_code(status.as_deref()).min(600)),
            _ => ("apiserver_internal_error", 0),
        };
        m.webhook_rejections
            .get_or_create(&AdmissionRejectionLabels {
                name: hook.name.clone(),
                r#type: step.to_owned(),
                operation: a.operation.as_str().to_owned(),
                error_type: error_type.to_owned(),
                rejection_code: code.to_string(),
            })
            .inc();
    }
    m.webhook_duration
        .get_or_create(&AdmissionWebhookLabels {
            name: hook.name.clone(),
            r#type: step.to_owned(),
            operation: a.operation.as_str().to_owned(),
            rejected: rejected.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// Whether a failure to call `hook` is let through (`failurePolicy: Ignore`), logged as kube-apiserver does.
fn fails_open(hook: &Hook, e: &Error) -> bool {
    let open = hook.ignore_failures && matches!(e, Error::Calling { .. });
    if open {
        tracing::warn!(webhook = %hook.name, error = %e, "failed calling webhook, failing open");
    } else if matches!(e, Error::Calling { .. }) {
        tracing::warn!(webhook = %hook.name, error = %e, "failed calling webhook, failing closed");
    }
    open
}

/// Whether `hook`'s matchConditions let it be called for `invocation`, as the last step of k8s.io/apiserver's
/// `ShouldCallHook`: any false skips it; an error skips it under `failurePolicy: Ignore` and refuses the request
/// (403) under `Fail`. `kind` is the matcher's type label (`admit` or `validating`), `exclusion` the hook's own
/// (`admit` or `validate`): kube labels the two metrics differently.
async fn conditions_hold(
    hook: &Hook,
    requested: &Attributes,
    invocation: &Invocation<'_>,
    authorizer: &ExpressionAuthorizer,
    (kind, exclusion): (&str, &str),
) -> Result<bool, Error> {
    if hook.match_conditions.is_empty() {
        return Ok(true);
    }
    let objects = (invocation.object(), invocation.old());
    let reads = hook.match_conditions.reads();
    let act = activation::activation(&invocation.attributes, requested, objects, authorizer, reads);
    let labels = |t: &str| crate::metrics::MatchConditionLabels {
        name: hook.name.clone(),
        kind: "webhook".into(),
        r#type: t.to_owned(),
        operation: requested.operation.as_str().to_owned(),
    };
    let excluded = || {
        crate::metrics::global().admission.match_condition_exclusions.get_or_create(&labels(exclusion)).inc();
        Ok(false)
    };
    match matchconditions::evaluate(&hook.match_conditions, act, &labels(kind)).await {
        Matched::Yes => Ok(true),
        Matched::No(_) => excluded(),
        Matched::Error(_) if hook.ignore_failures => excluded(),
        Matched::Error(message) => {
            tracing::warn!(webhook = %hook.name, error = %message, "Failed evaluating match conditions, failing closed");
            Err(Error::MatchConditions { resource: requested.group_resource(), name: requested.name.clone(), message })
        }
    }
}

/// MutatingAdmissionWebhook.
pub struct MutatingWebhooks {
    configurations: WebhookConfigurations,
    namespaces: Namespaces,
    clients: WebhookClients,
    authorizer: ExpressionAuthorizer,
}

impl Handler for MutatingWebhooks {
    fn plugin(&self) -> Plugin {
        Plugin::MutatingAdmissionWebhook
    }

    fn mutating(&self) -> Option<&dyn Mutating> {
        Some(self)
    }

    fn reads_objects(&self, _: &Attributes) -> bool {
        self.configurations.may_call()
    }

    fn has_synced(&self) -> bool {
        self.configurations.has_synced() && self.namespaces.has_synced()
    }
}

#[async_trait::async_trait]
impl Mutating for MutatingWebhooks {
    async fn admit(
        &self,
        a: &Attributes,
        object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        reinvocation: &mut Reinvocation,
    ) -> Result<(), Error> {
        self.dispatch(a, object, old, out, reinvocation).await
    }
}

impl MutatingWebhooks {
    /// `authorizer` answers the `authorizer` of match conditions.
    pub fn new(
        configurations: WebhookConfigurations,
        namespaces: Namespaces,
        clients: WebhookClients,
        authorizer: ExpressionAuthorizer,
    ) -> Self {
        Self { configurations, namespaces, clients, authorizer }
    }

    /// One round of the mutating webhooks, as `mutatingDispatcher.Dispatch`.
    async fn dispatch(
        &self,
        a: &Attributes,
        mut object: Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        r: &mut Reinvocation,
    ) -> Result<(), Error> {
        if !self.configurations.mutating.wait_for_ready().await || !self.namespaces.wait_for_ready().await {
            let name = resource_name(a, object.as_deref());
            return Err(Error::NotReady { resource: a.group_resource(), name });
        }
        if r.is_reinvoke && r.last_output.as_ref() != object.as_deref() {
            // Another plugin changed the object since the webhooks last saw it.
            r.require_reinvoking_previously_invoked();
        }
        let hooks = self.configurations.mutating_hooks();
        let result = self.round(&hooks, a, &mut object, old, out, r).await;
        r.last_output = object.as_deref().cloned();
        result
    }

    async fn round(
        &self,
        hooks: &[Arc<Hook>],
        a: &Attributes,
        object: &mut Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        r: &mut Reinvocation,
    ) -> Result<(), Error> {
        let round = usize::from(r.is_reinvoke);
        for (i, hook) in hooks.iter().enumerate() {
            let Some(version) = rules::should_call(hook, a, object.as_deref(), old, &self.namespaces).await? else {
                continue;
            };
            // A webhook skipped in the first round is not called for the first time in the second.
            if r.is_reinvoke && !r.to_reinvoke.contains(&hook.uid) {
                continue;
            }
            let started = std::time::Instant::now();
            let result = match self.call_one(hook, a, &version, object, old, out).await {
                Ok(None) => continue,
                Ok(Some(called)) => Ok(called),
                Err(e) => Err(e),
            };
            observe(hook, "admit", a, started.elapsed(), result.as_ref().err());
            let changed = matches!(result, Ok((true, _)));
            let key = |what| format!("{what}.webhook.admission.k8s.io/round_{round}_index_{i}");
            let mutation =
                MutationAnnotation { configuration: &hook.configuration, webhook: &hook.name, mutated: changed };
            out.audit_annotations.insert(key("mutation"), serde_json::to_string(&mutation).unwrap_or_default());
            if changed {
                r.require_reinvoking_previously_invoked();
                r.should_reinvoke = true;
            }
            if hook.reinvoke_if_needed {
                r.previously_invoked.insert(hook.uid.clone());
            }
            match result {
                Ok((_, Some(patch))) => {
                    out.audit_annotations.insert(key("patch"), patch);
                }
                Ok((_, None)) => {}
                Err(e) if fails_open(hook, &e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Calls one webhook and applies its patch: whether the object changed, and the patch's audit annotation; None
    /// when its match conditions exclude it.
    async fn call_one(
        &self,
        hook: &Hook,
        a: &Attributes,
        version: &str,
        object: &mut Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<Option<(bool, Option<String>)>, Error> {
        let invocation = Invocation::new(a, version, object.as_deref(), old)?;
        // The conditions see the object as the webhooks before this one left it.
        if !conditions_hold(hook, a, &invocation, &self.authorizer, ("admit", "admit")).await? {
            return Ok(None);
        }
        hook.record_source(out);
        let answer = call(&self.clients, hook, a, &invocation, true, out).await?;
        if answer.patch.is_empty() {
            return Ok(Some((false, None)));
        }
        let patch_error = |what, source: Box<dyn std::error::Error + Send + Sync>| Error::Patch {
            webhook: hook.name.clone(),
            what,
            source,
        };
        let patch: json_patch::Patch =
            serde_json::from_slice(&answer.patch).map_err(|e| patch_error("is not a JSON patch", Box::new(e)))?;
        if patch.0.is_empty() {
            return Ok(Some((false, None)));
        }
        // The patch is to the object as the webhook was sent it; what it makes goes back to the request's version.
        let sent = invocation.object().cloned();
        drop(invocation);
        let (Some(object), Some(mut patched)) = (object.as_deref_mut(), sent) else {
            return Err(Error::PatchWithoutObject { webhook: hook.name.clone() });
        };
        if answer.patch_type != "JSONPatch" {
            return Err(Error::Calling {
                webhook: hook.name.clone(),
                source: CallError::UnsupportedPatchType(answer.patch_type),
            });
        }
        json_patch::patch(&mut patched, &patch).map_err(|e| patch_error("does not apply", Box::new(e)))?;
        a.interfaces
            .decode_and_default(&mut patched)
            .map_err(|e| patch_error("makes an object that does not decode", e))?;
        if version != a.resource.version {
            a.interfaces
                .convert(&mut patched, &a.resource.version)
                .map_err(|e| patch_error("makes an object that does not convert back", e))?;
        }
        let changed = patched != *object;
        *object = patched;
        let annotation = PatchAnnotation {
            configuration: &hook.configuration,
            webhook: &hook.name,
            patch: &patch,
            patch_type: "JSONPatch",
        };
        Ok(Some((changed, serde_json::to_string(&annotation).ok())))
    }
}

/// ValidatingAdmissionWebhook.
pub struct ValidatingWebhooks {
    configurations: WebhookConfigurations,
    namespaces: Namespaces,
    clients: WebhookClients,
    authorizer: ExpressionAuthorizer,
}

impl Handler for ValidatingWebhooks {
    fn plugin(&self) -> Plugin {
        Plugin::ValidatingAdmissionWebhook
    }

    fn validating(&self) -> Option<&dyn Validating> {
        Some(self)
    }

    fn reads_objects(&self, _: &Attributes) -> bool {
        self.configurations.may_call()
    }

    fn has_synced(&self) -> bool {
        self.configurations.has_synced() && self.namespaces.has_synced()
    }
}

#[async_trait::async_trait]
impl Validating for ValidatingWebhooks {
    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        self.dispatch(a, object, old, out).await
    }
}

impl ValidatingWebhooks {
    /// `authorizer` answers the `authorizer` of match conditions.
    pub fn new(
        configurations: WebhookConfigurations,
        namespaces: Namespaces,
        clients: WebhookClients,
        authorizer: ExpressionAuthorizer,
    ) -> Self {
        Self { configurations, namespaces, clients, authorizer }
    }

    /// Every matching webhook at once, as `validatingDispatcher.Dispatch`; of several refusals the first
    /// configured one is returned (kube-apiserver returns whichever came back first).
    async fn dispatch(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        out: &mut Outcome,
    ) -> Result<(), Error> {
        if !self.configurations.validating.wait_for_ready().await || !self.namespaces.wait_for_ready().await {
            return Err(Error::NotReady { resource: a.group_resource(), name: resource_name(a, object) });
        }
        let hooks = self.configurations.validating_hooks();
        // Every webhook's rules, selectors and match conditions are weighed before any is called; a condition
        // that fails closed refuses the request with no webhook called.
        let mut relevant = Vec::new();
        for hook in hooks.iter() {
            let Some(version) = rules::should_call(hook, a, object, old, &self.namespaces).await? else { continue };
            let invocation = Invocation::new(a, &version, object, old);
            if let Ok(i) = &invocation {
                if !conditions_hold(hook, a, i, &self.authorizer, ("validating", "validate")).await? {
                    continue;
                }
            }
            relevant.push((hook.clone(), invocation));
        }
        let (called, invocations): (Vec<_>, Vec<_>) = relevant.into_iter().unzip();
        called.iter().for_each(|hook| hook.record_source(out));
        let calls = called.iter().zip(invocations).map(|(hook, invocation)| async move {
            let mut own = Outcome::default();
            let started = std::time::Instant::now();
            let result = match invocation {
                Ok(invocation) => call(&self.clients, hook, a, &invocation, false, &mut own).await,
                Err(e) => Err(e),
            };
            observe(hook, "validating", a, started.elapsed(), result.as_ref().err());
            (own, result)
        });
        let mut first_error = None;
        for ((own, result), hook) in futures::future::join_all(calls).await.into_iter().zip(&called) {
            out.warnings.extend(own.warnings);
            out.audit_annotations.extend(own.audit_annotations);
            match result {
                Ok(_) => {}
                Err(e) if fails_open(hook, &e) => {}
                Err(e) => {
                    tracing::warn!(webhook = %hook.name, error = %e, "rejected by webhook");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{Operation, Subresource, UserInfo};

    pub(crate) fn attrs(op: Operation, sub: Subresource) -> Attributes {
        crate::admission::testing::attributes(op, sub, "default", "web", UserInfo::named("jane", vec![]))
    }

    /// A validating webhook from its JSON (name and rules at least), as the API server would default it.
    pub(crate) fn hook(mut v: Value) -> Hook {
        let m = v.as_object_mut().unwrap();
        m.entry("sideEffects").or_insert("None".into());
        m.entry("admissionReviewVersions").or_insert(serde_json::json!(["v1"]));
        m.entry("clientConfig").or_insert(serde_json::json!({"url": "https://127.0.0.1:1/"}));
        let h: ValidatingWebhook = serde_json::from_value(v).unwrap();
        let c = ValidatingWebhookConfiguration {
            metadata: kube::api::ObjectMeta { name: Some("c".into()), ..Default::default() },
            webhooks: Some(vec![h]),
        };
        Arc::into_inner(validating_hooks_of([&c]).remove(0)).unwrap()
    }

    #[test]
    fn webhooks_run_in_configuration_name_order_with_unique_uids() {
        let config = |name: &str, hooks: &[&str]| MutatingWebhookConfiguration {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            webhooks: Some(
                hooks
                    .iter()
                    .map(|h| MutatingWebhook { name: (*h).into(), side_effects: "None".into(), ..Default::default() })
                    .collect(),
            ),
        };
        let hooks =
            mutating_hooks_of(&[config("b", &["x.example.com"]), config("a", &["y.example.com", "y.example.com"])]);
        let uids: Vec<&str> = hooks.iter().map(|h| h.uid.as_str()).collect();
        assert_eq!(uids, ["a/y.example.com/0", "a/y.example.com/1", "b/x.example.com/0"]);
        assert_eq!(hooks[0].timeout, DEFAULT_TIMEOUT);
        assert!(!hooks[0].ignore_failures, "no failurePolicy fails closed");
    }

    #[test]
    fn reinvocation_reruns_only_earlier_ifneeded_webhooks_once() {
        let mut r = Reinvocation::default();
        r.previously_invoked.insert("a".into());
        assert!(!r.start_next_round(), "nothing changed the object");
        r.require_reinvoking_previously_invoked();
        r.should_reinvoke = true;
        assert!(r.start_next_round());
        assert!(r.to_reinvoke.contains("a") && r.previously_invoked.is_empty());
        assert!(!r.start_next_round(), "one extra round at most");
    }
}
