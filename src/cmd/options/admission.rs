//! Admission plugins, as k8s.io/apiserver's `AdmissionOptions`: which run, and the AdmissionConfiguration file
//! that gives the webhook plugins a kubeconfig for calling webhooks and ResourceQuota its `limitedResources`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::admission::activation::ExpressionAuthorizer;
use crate::admission::{
    recommended, Chain, LimitedResource, MutatingAdmissionPolicyPlugin, MutatingPolicies, MutatingWebhooks,
    PluginConfig, ResourceQuota, ValidatingAdmissionPolicyPlugin, ValidatingPolicies, ValidatingWebhooks,
    WebhookClients,
};
use crate::cmd::encryption::apiserver_id_hash;

#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Admission")]
pub struct AdmissionOptions {
    /// Admission plugins to enable in addition to the default ones (NamespaceLifecycle, MutatingAdmissionPolicy,
    /// MutatingAdmissionWebhook, ValidatingAdmissionPolicy, ValidatingAdmissionWebhook, ResourceQuota, which are all
    /// there are). The order does not matter.
    #[arg(long, value_delimiter = ',')]
    pub enable_admission_plugins: Vec<String>,

    /// Admission plugins to disable although they are on by default. The order does not matter.
    #[arg(long, value_delimiter = ',')]
    pub disable_admission_plugins: Vec<String>,

    /// File with admission control configuration (an AdmissionConfiguration): for MutatingAdmissionWebhook and
    /// ValidatingAdmissionWebhook, a WebhookAdmissionConfiguration whose kubeConfigFile holds the credentials to
    /// call webhooks with and whose staticManifestsDir holds webhook configurations in force from the start; for
    /// ValidatingAdmissionPolicy and MutatingAdmissionPolicy, a ValidatingAdmissionPolicyConfiguration or a
    /// MutatingAdmissionPolicyConfiguration whose staticManifestsDir holds policies and bindings; for ResourceQuota, a ResourceQuotaConfiguration's limitedResources.
    #[arg(long)]
    pub admission_control_config_file: Option<PathBuf>,
}

impl AdmissionOptions {
    /// kube-apiserver's checks: every named plugin exists, and none is both enabled and disabled.
    pub fn validate(&self) -> anyhow::Result<()> {
        let (plugins, mut errors) = (recommended(), Vec::new());
        for (flag, names) in [("enable", &self.enable_admission_plugins), ("disable", &self.disable_admission_plugins)]
        {
            for name in names.iter().filter(|n| !plugins.is_registered(n)) {
                errors.push(format!("{flag}-admission-plugins plugin {name:?} is unknown"));
            }
        }
        let mut both: Vec<&str> = self
            .enable_admission_plugins
            .iter()
            .filter(|n| self.disable_admission_plugins.contains(n))
            .map(String::as_str)
            .collect();
        both.sort();
        both.dedup();
        if !both.is_empty() {
            errors.push(format!(
                "[{}] in enable-admission-plugins and disable-admission-plugins overlapped",
                both.join(" ")
            ));
        }
        match errors.as_slice() {
            [] => Ok(()),
            _ => anyhow::bail!("{}", errors.join("; ")),
        }
    }

    /// The plugins that run, in their order.
    pub fn enabled_plugins(&self) -> Vec<&'static str> {
        let disabled = |p: &&str| {
            self.disable_admission_plugins.iter().any(|n| n == p)
                && !self.enable_admission_plugins.iter().any(|n| n == p)
        };
        recommended().names().into_iter().filter(|p| !disabled(p)).collect()
    }

    /// The admission chain over the main API server `client`, its watches stopping with `stop`.
    ///
    /// Without a main API server (no --kubeconfig, not in a cluster: development with --insecure-allow-all)
    /// there are no namespaces or webhook configurations to read, so the chain is empty; naming a plugin in
    /// --enable-admission-plugins then is an error rather than a plugin silently not running.
    pub fn build(
        &self,
        client: Option<kube::Client>,
        authorizer: ExpressionAuthorizer,
        stop: CancellationToken,
    ) -> anyhow::Result<Chain> {
        self.validate()?;
        let plugins = self.enabled_plugins();
        let Some(client) = client else {
            if !self.enable_admission_plugins.is_empty() {
                anyhow::bail!(
                    "--enable-admission-plugins={}: admission plugins read namespaces and webhook configurations \
                     from the main API server; pass --kubeconfig or run in a cluster",
                    self.enable_admission_plugins.join(",")
                );
            }
            tracing::warn!(
                "no main API server: admission plugins are off (NamespaceLifecycle, the webhooks and ResourceQuota \
                 need it)"
            );
            return Ok(Chain::empty());
        };
        let mut config = match &self.admission_control_config_file {
            Some(path) => plugin_config(path)?,
            None => PluginConfig::default(),
        };
        config.authorizer = authorizer;
        let on = |p| plugins.contains(&p);
        let webhook_dirs = (
            config.webhooks.mutating_manifests.clone().filter(|_| on(MutatingWebhooks::NAME)),
            config.webhooks.validating_manifests.clone().filter(|_| on(ValidatingWebhooks::NAME)),
        );
        crate::admission::webhook::manifests::start(
            webhook_dirs,
            &config.webhooks.statics,
            &apiserver_id_hash(),
            &stop,
        )
        .map_err(|e| anyhow::anyhow!("--admission-control-config-file: {e}"))?;
        if let (Some(dir), true) = (&config.policy_manifests, on(ValidatingAdmissionPolicyPlugin::NAME)) {
            let policies = ValidatingPolicies::default();
            crate::admission::policy::manifests::start(dir.clone(), &policies, apiserver_id_hash(), stop.clone())
                .map_err(|e| anyhow::anyhow!("--admission-control-config-file: ValidatingAdmissionPolicy: {e}"))?;
            config.policies = Some(policies);
        }
        if let (Some(dir), true) = (&config.mutating_policy_manifests, on(MutatingAdmissionPolicyPlugin::NAME)) {
            let policies = MutatingPolicies::default();
            crate::admission::policy::manifests::start(dir.clone(), &policies, apiserver_id_hash(), stop.clone())
                .map_err(|e| anyhow::anyhow!("--admission-control-config-file: MutatingAdmissionPolicy: {e}"))?;
            config.mutating_policies = Some(policies);
        }
        tracing::info!(plugins = ?plugins, "admission");
        recommended().start(&plugins, client, config, stop)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionConfiguration {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    plugins: Vec<PluginConfiguration>,
}

#[derive(Deserialize)]
struct PluginConfiguration {
    name: String,
    #[serde(default)]
    path: Option<PathBuf>,
    #[serde(default)]
    configuration: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WebhookAdmission {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    kube_config_file: String,
    #[serde(default)]
    static_manifests_dir: String,
}

/// ValidatingAdmissionPolicy's part: where its manifests are.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyConfiguration {
    api_version: String,
    kind: String,
    #[serde(default)]
    static_manifests_dir: String,
}

/// ResourceQuota's part of an AdmissionConfiguration.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceQuotaConfiguration {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    limited_resources: Vec<LimitedResource>,
}

/// The plugins' configuration from an AdmissionConfiguration (apiserver.config.k8s.io/v1, or
/// apiserver.k8s.io/v1alpha1 and v1beta1), each plugin's part inline or in a file relative to it: the webhook
/// plugins' clients, ResourceQuota's limitedResources.
fn plugin_config(path: &Path) -> anyhow::Result<PluginConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!("unable to read admission control configuration from {:?} [{e}]", path.display().to_string())
    })?;
    let what = || format!("--admission-control-config-file {}", path.display());
    let config: AdmissionConfiguration = serde_yaml::from_str(&text).with_context(what)?;
    let known = ["apiserver.config.k8s.io/v1", "apiserver.k8s.io/v1alpha1", "apiserver.k8s.io/v1beta1"];
    if config.kind != "AdmissionConfiguration" || !known.contains(&config.api_version.as_str()) {
        anyhow::bail!(
            "{}: expected an AdmissionConfiguration of {}, got kind {:?} of {:?}",
            what(),
            known.join(", "),
            config.kind,
            config.api_version
        );
    }
    let mut out = PluginConfig::default();
    // The plugins that take a configuration (NamespaceLifecycle has none); another name's part is not read, as
    // kube-apiserver reads a plugin's configuration only when it runs it.
    let configured = [
        MutatingWebhooks::NAME,
        ValidatingWebhooks::NAME,
        ValidatingAdmissionPolicyPlugin::NAME,
        MutatingAdmissionPolicyPlugin::NAME,
        ResourceQuota::NAME,
    ];
    for plugin in config.plugins {
        let Some(which) = configured.into_iter().find(|n| *n == plugin.name) else {
            continue;
        };
        let value = match (plugin.configuration, &plugin.path) {
            (Some(v), _) => v,
            (None, Some(p)) => {
                let p = if p.is_absolute() { p.clone() } else { path.parent().unwrap_or(Path::new(".")).join(p) };
                let text =
                    std::fs::read_to_string(&p).with_context(|| format!("{}: reading {}", plugin.name, p.display()))?;
                serde_yaml::from_str(&text).with_context(|| format!("{}: {}", plugin.name, p.display()))?
            }
            (None, None) => continue,
        };
        let slot = match which {
            MutatingWebhooks::NAME => &mut out.webhooks.mutating,
            ValidatingWebhooks::NAME => &mut out.webhooks.validating,
            ValidatingAdmissionPolicyPlugin::NAME | MutatingAdmissionPolicyPlugin::NAME => {
                let kind = format!("{which}Configuration");
                let c: PolicyConfiguration =
                    serde_yaml::from_value(value).with_context(|| format!("{}: {}", what(), plugin.name))?;
                if (c.api_version.as_str(), c.kind.as_str()) != ("apiserver.config.k8s.io/v1", kind.as_str()) {
                    anyhow::bail!(
                        "{}: {}: expected a {kind} of apiserver.config.k8s.io/v1, got kind {:?} of {:?}",
                        what(),
                        plugin.name,
                        c.kind,
                        c.api_version
                    );
                }
                if !c.static_manifests_dir.is_empty() {
                    let dir = PathBuf::from(&c.static_manifests_dir);
                    crate::admission::manifest::validate_dir(&dir)
                        .map_err(|e| anyhow::anyhow!("{}: {}: {e}", what(), plugin.name))?;
                    match which {
                        MutatingAdmissionPolicyPlugin::NAME => out.mutating_policy_manifests = Some(dir),
                        _ => out.policy_manifests = Some(dir),
                    }
                }
                continue;
            }
            _ => {
                let q: ResourceQuotaConfiguration =
                    serde_yaml::from_value(value).with_context(|| format!("{}: {}", what(), plugin.name))?;
                let kinds = ["apiserver.config.k8s.io/v1", "resourcequota.admission.k8s.io/v1beta1"];
                if q.kind != "ResourceQuotaConfiguration" || !kinds.contains(&q.api_version.as_str()) {
                    anyhow::bail!(
                        "{}: {}: expected a ResourceQuotaConfiguration of {}, got kind {:?} of {:?}",
                        what(),
                        plugin.name,
                        kinds.join(" or "),
                        q.kind,
                        q.api_version
                    );
                }
                out.limited_resources = q.limited_resources;
                continue;
            }
        };
        let w: WebhookAdmission =
            serde_yaml::from_value(value).with_context(|| format!("{}: {}", what(), plugin.name))?;
        let kinds = [
            ("apiserver.config.k8s.io/v1", "WebhookAdmissionConfiguration"),
            ("apiserver.config.k8s.io/v1alpha1", "WebhookAdmission"),
        ];
        if !kinds.contains(&(w.api_version.as_str(), w.kind.as_str())) {
            anyhow::bail!(
                "{}: {}: expected a WebhookAdmissionConfiguration of apiserver.config.k8s.io/v1 (or WebhookAdmission \
                 of v1alpha1), got kind {:?} of {:?}",
                what(),
                plugin.name,
                w.kind,
                w.api_version
            );
        }
        if !w.static_manifests_dir.is_empty() {
            let dir = PathBuf::from(&w.static_manifests_dir);
            crate::admission::manifest::validate_dir(&dir)
                .map_err(|e| anyhow::anyhow!("{}: {}: {e}", what(), plugin.name))?;
            match which {
                MutatingWebhooks::NAME => out.webhooks.mutating_manifests = Some(dir),
                _ => out.webhooks.validating_manifests = Some(dir),
            }
            // Only manifests: there is no kubeconfig to read (kubeConfigFile is optional then).
            if w.kube_config_file.is_empty() {
                continue;
            }
        }
        if !Path::new(&w.kube_config_file).is_absolute() {
            anyhow::bail!(
                "{}: {}: kubeConfigFile: Invalid value: {:?}: must be an absolute file path",
                what(),
                plugin.name,
                w.kube_config_file
            );
        }
        *slot = WebhookClients::from_kubeconfig(Path::new(&w.kube_config_file))
            .with_context(|| format!("{}: {}: kubeConfigFile {}", what(), plugin.name, w.kube_config_file))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        admission: AdmissionOptions,
    }

    fn parse(args: &[&str]) -> AdmissionOptions {
        Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap().admission
    }

    #[test]
    fn plugins_are_on_by_default_and_flags_turn_them_off_as_kube_apiserver() {
        assert_eq!(parse(&[]).enabled_plugins(), recommended().names());
        let o = parse(&["--disable-admission-plugins=MutatingAdmissionWebhook,NamespaceLifecycle"]);
        o.validate().unwrap();
        assert_eq!(
            o.enabled_plugins(),
            ["MutatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook", "ResourceQuota"]
        );
        let o = parse(&["--disable-admission-plugins=MutatingAdmissionPolicy"]);
        assert!(!o.enabled_plugins().contains(&"MutatingAdmissionPolicy"));
        let o = parse(&["--disable-admission-plugins=ValidatingAdmissionPolicy"]);
        assert!(!o.enabled_plugins().contains(&"ValidatingAdmissionPolicy"));
        let o = parse(&["--enable-admission-plugins=NamespaceLifecycle"]);
        assert_eq!(o.enabled_plugins(), recommended().names());

        let e = parse(&["--enable-admission-plugins=AlwaysPullImages", "--disable-admission-plugins=Nope"]).validate();
        assert_eq!(
            e.unwrap_err().to_string(),
            "enable-admission-plugins plugin \"AlwaysPullImages\" is unknown; disable-admission-plugins plugin \"Nope\" is unknown"
        );
        let e =
            parse(&["--enable-admission-plugins=NamespaceLifecycle", "--disable-admission-plugins=NamespaceLifecycle"]);
        assert_eq!(
            e.validate().unwrap_err().to_string(),
            "[NamespaceLifecycle] in enable-admission-plugins and disable-admission-plugins overlapped"
        );
    }

    #[tokio::test]
    async fn without_a_main_api_server_the_chain_is_empty_unless_a_plugin_is_asked_for() {
        let chain = parse(&[]).build(None, None, CancellationToken::new()).unwrap();
        assert!(chain.plugins().is_empty() && chain.has_synced());
        let e = parse(&["--enable-admission-plugins=NamespaceLifecycle"]).build(None, None, CancellationToken::new());
        assert!(e.unwrap_err().to_string().contains("pass --kubeconfig"));
    }

    #[test]
    fn the_admission_configuration_file_gives_resource_quota_its_limited_resources() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("admission.yaml");
        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ResourceQuota\n  \
             configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: ResourceQuotaConfiguration\n    \
             limitedResources:\n    - apiGroup: demo.k8s.io\n      resource: podsets\n      matchContains: [podsets]\n",
        )
        .unwrap();
        let config = plugin_config(&file).unwrap();
        assert_eq!(
            config.limited_resources,
            [LimitedResource {
                api_group: "demo.k8s.io".into(),
                resource: "podsets".into(),
                match_contains: vec!["podsets".into()]
            }]
        );
        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ResourceQuota\n  \
             configuration: {apiVersion: v1, kind: ConfigMap}\n",
        )
        .unwrap();
        let e = format!("{:#}", plugin_config(&file).unwrap_err());
        assert!(e.contains("expected a ResourceQuotaConfiguration"), "{e}");
    }

    #[test]
    fn the_admission_configuration_file_gives_each_webhook_plugin_its_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("webhooks.kubeconfig");
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user: {token: t}\n").unwrap();
        std::fs::write(
            dir.path().join("validating.yaml"),
            format!(
                "apiVersion: apiserver.config.k8s.io/v1alpha1\nkind: WebhookAdmission\nkubeConfigFile: {}\n",
                kubeconfig.display()
            ),
        )
        .unwrap();
        let file = dir.path().join("admission.yaml");
        std::fs::write(
            &file,
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
                 - name: MutatingAdmissionWebhook\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
                 kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n\
                 - name: ValidatingAdmissionWebhook\n  path: validating.yaml\n- name: NamespaceLifecycle\n",
                kubeconfig.display()
            ),
        )
        .unwrap();
        let config = plugin_config(&file).unwrap();
        assert!(config.webhooks.mutating.has_credentials() && config.webhooks.validating.has_credentials());

        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ValidatingAdmissionWebhook\n  \
             configuration: {apiVersion: apiserver.config.k8s.io/v1, kind: WebhookAdmissionConfiguration, kubeConfigFile: rel.kubeconfig}\n",
        )
        .unwrap();
        let e = format!("{:#}", plugin_config(&file).unwrap_err());
        assert!(e.ends_with("kubeConfigFile: Invalid value: \"rel.kubeconfig\": must be an absolute file path"), "{e}");
        std::fs::write(&file, "apiVersion: v1\nkind: ConfigMap\n").unwrap();
        assert!(plugin_config(&file).unwrap_err().to_string().contains("expected an AdmissionConfiguration"));
        let e = plugin_config(&dir.path().join("missing.yaml")).unwrap_err().to_string();
        assert!(e.starts_with("unable to read admission control configuration from \""), "{e}");
    }

    #[test]
    fn static_manifests_dirs_are_read_from_the_admission_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("m");
        std::fs::create_dir(&manifests).unwrap();
        let file = dir.path().join("admission.yaml");
        let write = |text: String| std::fs::write(&file, text).unwrap();
        write(format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: ValidatingAdmissionPolicy\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: ValidatingAdmissionPolicyConfiguration\n    staticManifestsDir: {m}\n\
             - name: ValidatingAdmissionWebhook\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: WebhookAdmissionConfiguration\n    staticManifestsDir: {m}\n",
            m = manifests.display()
        ));
        let config = plugin_config(&file).unwrap();
        assert_eq!(config.policy_manifests.as_deref(), Some(manifests.as_path()));
        assert_eq!(config.webhooks.validating_manifests.as_deref(), Some(manifests.as_path()));
        assert!(!config.webhooks.validating.has_credentials(), "no kubeConfigFile: none needed");

        write(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: ValidatingAdmissionPolicy\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: ValidatingAdmissionPolicyConfiguration\n    staticManifestsDir: relative/dir\n"
                .into(),
        );
        let e = format!("{:#}", plugin_config(&file).unwrap_err());
        assert!(
            e.ends_with("staticManifestsDir: Invalid value: \"relative/dir\": must be an absolute file path"),
            "{e}"
        );
        write(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: ValidatingAdmissionPolicy\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: ValidatingAdmissionPolicyConfiguration\n    staticManifestDir: /x\n"
                .into(),
        );
        assert!(format!("{:#}", plugin_config(&file).unwrap_err()).contains("unknown field `staticManifestDir`"));

        // MutatingAdmissionPolicy's directory is its own; its configuration's kind is its own too.
        let plugin = |kind: &str| {
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
                 - name: MutatingAdmissionPolicy\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
                 kind: {kind}\n    staticManifestsDir: {m}\n",
                m = manifests.display()
            )
        };
        write(plugin("MutatingAdmissionPolicyConfiguration"));
        let config = plugin_config(&file).unwrap();
        assert_eq!(config.mutating_policy_manifests.as_deref(), Some(manifests.as_path()));
        assert_eq!(config.policy_manifests, None);
        write(plugin("ValidatingAdmissionPolicyConfiguration"));
        let e = format!("{:#}", plugin_config(&file).unwrap_err());
        assert!(e.contains("expected a MutatingAdmissionPolicyConfiguration of apiserver.config.k8s.io/v1"), "{e}");
    }
}
