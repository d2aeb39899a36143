//! Admission plugins by name, as k8s.io/apiserver's `admission.Plugins`: each plugin registers a factory under its
//! `--enable-admission-plugins` name, and a chain is built from the enabled names in the order of registration.
//! Adding a plugin is one [`Plugins::register`] in [`recommended`], at its place in the order.

use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::{
    policy, webhook, Chain, Handler, LimitedResource, MutatingAdmissionPolicyPlugin, MutatingPolicies,
    MutatingWebhooks, NamespaceLifecycle, Namespaces, Quotas, ResourceQuota, ValidatingAdmissionPolicyPlugin,
    ValidatingPolicies, ValidatingWebhooks, WebhookClients, WebhookConfigurations,
};

/// Makes a plugin from what the context holds; None when it cannot run here (a source it reads was not given).
pub type Factory = fn(&PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>>;

/// The plugins this server knows, in the order they run.
#[derive(Clone, Default)]
pub struct Plugins {
    order: Vec<(&'static str, Factory)>,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins").field("order", &self.names()).finish()
    }
}

/// Every plugin of this server, all on by default, as k8s.io/apiserver's `RecommendedPluginOrder` and
/// kube-apiserver's default set (ResourceQuota last, as there: it charges only what the others let through).
pub fn recommended() -> Plugins {
    let mut plugins = Plugins::default();
    plugins.register(NamespaceLifecycle::NAME, NamespaceLifecycle::factory);
    plugins.register(MutatingAdmissionPolicyPlugin::NAME, MutatingAdmissionPolicyPlugin::factory);
    plugins.register(MutatingWebhooks::NAME, MutatingWebhooks::factory);
    plugins.register(ValidatingAdmissionPolicyPlugin::NAME, ValidatingAdmissionPolicyPlugin::factory);
    plugins.register(ValidatingWebhooks::NAME, ValidatingWebhooks::factory);
    plugins.register(ResourceQuota::NAME, ResourceQuota::factory);
    plugins
}

impl Plugins {
    /// Adds `name` after the plugins registered before it. A name registered twice is a bug (upstream exits).
    pub fn register(&mut self, name: &'static str, factory: Factory) {
        assert!(!self.is_registered(name), "admission plugin {name:?} registered twice");
        self.order.push((name, factory));
    }

    /// The registered names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.order.iter().map(|(name, _)| *name).collect()
    }

    pub fn is_registered(&self, name: &str) -> bool {
        self.order.iter().any(|(n, _)| *n == name)
    }

    /// The chain of the plugins named in `enabled`, in the order of registration; names not registered are
    /// ignored (the options refuse them before).
    pub fn chain(&self, enabled: &[&str], ctx: &PluginContext) -> anyhow::Result<Chain> {
        let mut handlers = Vec::new();
        for (name, factory) in self.order.iter().filter(|(n, _)| enabled.contains(n)) {
            handlers.extend(factory(ctx).with_context(|| format!("admission plugin {name}"))?);
        }
        Ok(Chain::new(handlers))
    }

    /// Starts the watches the `enabled` plugins need on the main API server (namespaces; webhook configurations;
    /// quotas; policies) and returns the chain at once; requests wait for the first lists (up to
    /// [`READY_WAIT`](super::READY_WAIT)). The watches stop with `stop`.
    pub fn start(
        &self,
        enabled: &[&str],
        client: kube::Client,
        config: PluginConfig,
        stop: CancellationToken,
    ) -> anyhow::Result<Chain> {
        if enabled.is_empty() {
            return Ok(Chain::empty());
        }
        self.chain(enabled, &PluginContext::watching(client, config, stop))
    }

    /// Every registered plugin over sources filled by hand (tests); one whose source is missing does not run.
    pub fn with_sources(&self, sources: Sources, config: PluginConfig) -> anyhow::Result<Chain> {
        self.chain(&self.names(), &PluginContext::fixed(sources, config))
    }
}

/// What the webhook plugins call webhooks with: for each, the clients made from its `kubeConfigFile` (in
/// `--admission-control-config-file`), or anonymous ones.
#[derive(Debug, Clone, Default)]
pub struct WebhookPluginConfig {
    pub mutating: WebhookClients,
    pub validating: WebhookClients,
    /// Each plugin's `staticManifestsDir`.
    pub mutating_manifests: Option<std::path::PathBuf>,
    pub validating_manifests: Option<std::path::PathBuf>,
    /// The webhooks of those directories, once loaded.
    pub statics: webhook::StaticWebhooks,
}

/// The plugins' configuration (`--admission-control-config-file`).
#[derive(Debug, Clone, Default)]
pub struct PluginConfig {
    pub webhooks: WebhookPluginConfig,
    /// What the `authorizer` of CEL expressions asks (match conditions, policies).
    pub authorizer: super::activation::ExpressionAuthorizer,
    /// ValidatingAdmissionPolicy's `staticManifestsDir`.
    pub policy_manifests: Option<std::path::PathBuf>,
    /// ValidatingAdmissionPolicy's policies, with those of its `staticManifestsDir` already loaded.
    pub policies: Option<ValidatingPolicies>,
    /// MutatingAdmissionPolicy's `staticManifestsDir`.
    pub mutating_policy_manifests: Option<std::path::PathBuf>,
    /// MutatingAdmissionPolicy's policies, with those of its `staticManifestsDir` already loaded.
    pub mutating_policies: Option<MutatingPolicies>,
    /// ResourceQuota's `limitedResources`.
    pub limited_resources: Vec<LimitedResource>,
}

/// What the plugins read from the main API server, filled by hand (tests); a plugin whose source is missing does
/// not run.
#[derive(Clone)]
pub struct Sources {
    pub namespaces: Namespaces,
    pub configurations: Option<WebhookConfigurations>,
    pub quotas: Option<Quotas>,
    /// ValidatingAdmissionPolicy's policies, and the param caches of the cluster's.
    pub policies: Option<(ValidatingPolicies, policy::Params)>,
    /// MutatingAdmissionPolicy's policies, and the param caches of the cluster's.
    pub mutating_policies: Option<(MutatingPolicies, policy::Params)>,
}

/// What the factories read: the plugins' configuration, and the main API server's objects, either given by hand
/// or watched, each watch started once, by the first plugin that reads it (both webhook plugins share theirs).
pub struct PluginContext {
    config: PluginConfig,
    namespaces: Namespaces,
    main: Option<(kube::Client, CancellationToken)>,
    configurations: OnceLock<Option<WebhookConfigurations>>,
    quotas: OnceLock<Option<Quotas>>,
    policies: OnceLock<Option<(ValidatingPolicies, policy::Params)>>,
    mutating_policies: OnceLock<Option<(MutatingPolicies, policy::Params)>>,
    /// The param caches both policy plugins share, so a paramKind is watched once.
    params: OnceLock<policy::Params>,
}

impl PluginContext {
    /// Over the main API server `client`, its watches stopping with `stop`. Namespaces are watched at once: most
    /// plugins read them.
    pub fn watching(client: kube::Client, config: PluginConfig, stop: CancellationToken) -> Self {
        Self {
            config,
            namespaces: Namespaces::watch(client.clone(), stop.clone()),
            main: Some((client, stop)),
            configurations: OnceLock::new(),
            quotas: OnceLock::new(),
            policies: OnceLock::new(),
            mutating_policies: OnceLock::new(),
            params: OnceLock::new(),
        }
    }

    /// Over sources given by hand, with no main API server behind them.
    pub fn fixed(sources: Sources, config: PluginConfig) -> Self {
        let Sources { namespaces, configurations, quotas, policies, mutating_policies } = sources;
        Self {
            config,
            namespaces,
            main: None,
            configurations: configurations.into(),
            quotas: quotas.into(),
            policies: policies.into(),
            mutating_policies: mutating_policies.into(),
            params: OnceLock::new(),
        }
    }

    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    /// The main API server, and when to stop watching it, for a plugin that watches what no other reads; None
    /// when the sources were given by hand.
    pub fn main_api_server(&self) -> Option<(&kube::Client, &CancellationToken)> {
        self.main.as_ref().map(|(client, stop)| (client, stop))
    }

    /// The cluster's webhook configurations after those of manifests.
    pub(crate) fn webhook_configurations(&self) -> Option<WebhookConfigurations> {
        let watch = || {
            let (client, stop) = self.main_api_server()?;
            let statics = self.config.webhooks.statics.clone();
            Some(WebhookConfigurations::watch(client.clone(), stop.clone()).with_statics(statics))
        };
        self.configurations.get_or_init(watch).clone()
    }

    pub(crate) fn quotas(&self) -> Option<Quotas> {
        let watch = || self.main_api_server().map(|(client, stop)| Quotas::watch(client.clone(), stop.clone()));
        self.quotas.get_or_init(watch).clone()
    }

    /// ValidatingAdmissionPolicy's policies (those of manifests, then the cluster's), and their param caches.
    pub(crate) fn policies(&self) -> Option<(ValidatingPolicies, policy::Params)> {
        let watch = || {
            let (client, stop) = self.main_api_server()?;
            let policies = self.config.policies.clone().unwrap_or_default();
            let params = self.params.get_or_init(|| policy::Params::new(client.clone(), stop.clone())).clone();
            policy::cluster::watch(client.clone(), policies.clone(), params.clone(), stop.clone());
            Some((policies, params))
        };
        self.policies.get_or_init(watch).clone()
    }

    /// MutatingAdmissionPolicy's policies (those of manifests, then the cluster's), and their param caches.
    pub(crate) fn mutating_policies(&self) -> Option<(MutatingPolicies, policy::Params)> {
        let watch = || {
            let (client, stop) = self.main_api_server()?;
            let policies = self.config.mutating_policies.clone().unwrap_or_default();
            let params = self.params.get_or_init(|| policy::Params::new(client.clone(), stop.clone())).clone();
            policy::cluster::watch(client.clone(), policies.clone(), params.clone(), stop.clone());
            Some((policies, params))
        };
        self.mutating_policies.get_or_init(watch).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> PluginContext {
        let sources = Sources {
            namespaces: Namespaces::fixed(Vec::new()),
            configurations: None,
            quotas: None,
            policies: None,
            mutating_policies: None,
        };
        PluginContext::fixed(sources, PluginConfig::default())
    }

    #[test]
    fn the_recommended_plugins_run_in_kube_apiservers_order() {
        let names = recommended().names();
        assert_eq!(
            names,
            [
                "NamespaceLifecycle",
                "MutatingAdmissionPolicy",
                "MutatingAdmissionWebhook",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionWebhook",
                "ResourceQuota"
            ]
        );
    }

    #[test]
    fn a_chain_has_the_enabled_plugins_that_can_run_in_registration_order() {
        fn failing(_: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
            anyhow::bail!("no configuration")
        }
        let mut plugins = recommended();
        // Given no webhook configurations, quotas or policies, only NamespaceLifecycle can run.
        let chain = plugins.chain(&["ResourceQuota", "NamespaceLifecycle", "Unknown"], &context()).unwrap();
        assert_eq!(chain.plugins(), ["NamespaceLifecycle"]);
        plugins.register("Failing", failing);
        let e = plugins.chain(&["Failing"], &context()).unwrap_err();
        assert_eq!(format!("{e:#}"), "admission plugin Failing: no configuration");
    }

    #[test]
    #[should_panic(expected = "admission plugin \"NamespaceLifecycle\" registered twice")]
    fn a_name_is_registered_once() {
        recommended().register(NamespaceLifecycle::NAME, NamespaceLifecycle::factory);
    }
}
