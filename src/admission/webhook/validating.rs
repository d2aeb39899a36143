//! ValidatingAdmissionWebhook: the validating webhooks called all at once.

use std::sync::Arc;

use serde_json::Value;

use super::dispatch::{call, conditions_hold, fails_open, observe};
use super::{rules, WebhookClients, WebhookConfigurations};
use crate::admission::activation::{ExpressionAuthorizer, Invocation};
use crate::admission::namespace::resource_name;
use crate::admission::{Attributes, Error, Handler, Namespaces, Outcome, PluginContext, Validating};

/// ValidatingAdmissionWebhook.
pub struct ValidatingWebhooks {
    configurations: WebhookConfigurations,
    namespaces: Namespaces,
    clients: WebhookClients,
    authorizer: ExpressionAuthorizer,
}

impl Handler for ValidatingWebhooks {
    fn name(&self) -> &'static str {
        Self::NAME
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
    pub const NAME: &'static str = "ValidatingAdmissionWebhook";

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
        let clients = config.webhooks.validating.clone();
        Ok(Some(Arc::new(Self::new(configurations, namespaces, clients, config.authorizer.clone()))))
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
