//! MutatingAdmissionWebhook: the mutating webhooks called one after another, each seeing the last one's patch.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::dispatch::{call, conditions_hold, fails_open, observe};
use super::{rules, CallError, Hook, WebhookClients, WebhookConfigurations};
use crate::admission::activation::{ExpressionAuthorizer, Invocation};
use crate::admission::namespace::resource_name;
use crate::admission::{
    Attributes, Error, Handler, Mutating, Namespaces, Outcome, PluginContext, PluginRound, Reinvocation,
};

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

/// MutatingAdmissionWebhook.
pub struct MutatingWebhooks {
    configurations: WebhookConfigurations,
    namespaces: Namespaces,
    clients: WebhookClients,
    authorizer: ExpressionAuthorizer,
}

impl Handler for MutatingWebhooks {
    fn name(&self) -> &'static str {
        Self::NAME
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
    pub const NAME: &'static str = "MutatingAdmissionWebhook";

    /// `authorizer` answers the `authorizer` of match conditions.
    pub fn new(
        configurations: WebhookConfigurations,
        namespaces: Namespaces,
        clients: WebhookClients,
        authorizer: ExpressionAuthorizer,
    ) -> Self {
        Self { configurations, namespaces, clients, authorizer }
    }

    pub(crate) fn factory(ctx: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
        let Some(configurations) = ctx.webhook_configurations() else { return Ok(None) };
        let (namespaces, config) = (ctx.namespaces().clone(), ctx.config());
        let clients = config.webhooks.mutating.clone();
        Ok(Some(Arc::new(Self::new(configurations, namespaces, clients, config.authorizer.clone()))))
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
        let mut r = r.plugin(Self::NAME);
        r.begin(object.as_deref());
        let hooks = self.configurations.mutating_hooks();
        let result = self.round(&hooks, a, &mut object, old, out, &mut r).await;
        r.end(object.as_deref());
        result
    }

    async fn round(
        &self,
        hooks: &[Arc<Hook>],
        a: &Attributes,
        object: &mut Option<&mut Value>,
        old: Option<&Value>,
        out: &mut Outcome,
        r: &mut PluginRound<'_>,
    ) -> Result<(), Error> {
        let round = usize::from(r.is_reinvoke());
        for (i, hook) in hooks.iter().enumerate() {
            let Some(version) = rules::should_call(hook, a, object.as_deref(), old, &self.namespaces).await? else {
                continue;
            };
            // A webhook skipped in the first round is not called for the first time in the second.
            if r.skips(&hook.uid) {
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
            r.invoked(&hook.uid, changed, hook.reinvoke_if_needed);
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
