//! Encryption at rest, wired: the providers --encryption-provider-config gives each served resource, and, with
//! --encryption-provider-config-automatic-reload, kube-apiserver's reload controller: the file is read again when
//! its contents change, a configuration that loads replaces the running one (whose objects the storage migration
//! then moves to the new writing provider), and one that does not is logged and counted, the old one kept. The
//! file itself is read by `config`, as kube-apiserver's `encryptionconfig` reads it.

pub mod config;

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use self::config::{ConfigError, EncryptionConfig, KmsConfiguration};
use crate::api::resource::ResourceInfo;
use crate::storage::value::kmsv2::{KmsV2, Timing};
use crate::storage::value::{Provider, ProviderTable, Providers, Transformer};

/// The providers the configuration gives each of `resources`, by the root its objects are kept under; a resource
/// it names in no entry is left out, stored plainly. A `kms` provider connects to its plugin (paced by `timing`)
/// once, however many resources its entry serves.
pub fn providers(
    config: &EncryptionConfig,
    resources: &[&'static ResourceInfo],
    timing: Timing,
) -> Result<ProviderTable, ConfigError> {
    let id = apiserver_id_hash();
    let kms = |c: &KmsConfiguration| {
        let timeout = c.timeout.unwrap_or(Duration::from_secs(3));
        let plugin = KmsV2::new(&c.name, &c.endpoint, timeout, timing, &id)?;
        Ok(Provider::new(format!("k8s:enc:kms:v2:{}:", c.name), None, Box::new(plugin)))
    };
    let mut table = ProviderTable::new();
    for (resource, providers) in resources.iter().zip(config.providers_for_each(resources, &kms)?) {
        if let Some(providers) = providers {
            table.insert(resource.key_root, providers);
        }
    }
    Ok(table)
}

/// `table`, with each of `resources` it leaves out stored plainly by providers a reload can replace.
pub fn or_identity(mut table: ProviderTable, resources: &[&'static ResourceInfo]) -> ProviderTable {
    for resource in resources {
        if table.get(resource.key_root).is_none() {
            table.insert(resource.key_root, Providers::new(&resource.to_string(), vec![Provider::identity()]));
        }
    }
    table
}

/// What a configuration is read for: the served resources, and how their KMS plugins are paced.
#[derive(Debug, Clone)]
pub struct Served {
    pub resources: Vec<&'static ResourceInfo>,
    pub timing: Timing,
}

/// `/healthz/kms-providers` (and /readyz): every KMS plugin the providers of every resource use answers `Status`
/// as healthy.
pub fn kms_check(values: &Transformer) -> std::sync::Arc<dyn crate::apiserver::health::HealthCheck> {
    let values = values.clone();
    crate::apiserver::health::named_check("kms-providers", move || {
        let probes = values.kms_probes();
        async move {
            let mut errors = Vec::new();
            for (name, probe) in probes {
                if let Err(e) = probe.await {
                    errors.push(format!("{name}: {e}"));
                }
            }
            match errors.is_empty() {
                true => Ok(()),
                false => Err(errors.join("\n")),
            }
        }
    })
}

/// `sha256:<hex>` of a file's bytes or of this server's identity, as kube-apiserver's metrics label them.
fn hash(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// This replica's `apiserver_id_hash`: its host name (the Pod's name in a cluster).
pub fn apiserver_id_hash() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default();
    hash(format!("podset-apiserver-{}", host.trim()).as_bytes())
}

/// Records the configuration in use (`apiserver_encryption_config_controller_last_config_info`).
pub fn record_config(config: &EncryptionConfig) {
    let hash = hash(&config.content);
    crate::storage::value::metrics::metrics().config.loaded(&apiserver_id_hash(), &hash);
    // The hash in the log too: with one replica, `kubectl logs` shows which file it runs without a metrics reader.
    tracing::info!(%hash, "encryption configuration loaded");
}

/// Watches `path` every `interval` until `shutdown`; on a change that loads, `values` take the new providers of
/// every served resource at once and `changed` runs.
pub async fn reload(
    path: PathBuf,
    interval: Duration,
    served: Served,
    values: Transformer,
    mut last: Vec<u8>,
    changed: impl Fn() + Send + 'static,
    shutdown: CancellationToken,
) {
    let metrics = &crate::storage::value::metrics::metrics().config;
    let id = apiserver_id_hash();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Ok(content) = std::fs::read(&path) else {
            // Unreadable now (being replaced, say): the load below says why once it is tried on a change.
            tracing::warn!(file = %path.display(), "cannot read --encryption-provider-config; keeping the running configuration");
            metrics.reloaded(&id, false);
            continue;
        };
        if content == last {
            continue;
        }
        // Building KMS providers waits for their plugins' first answer: not on the runtime's workers.
        let (file, handle, served) = (path.clone(), values.clone(), served.clone());
        let loaded = tokio::task::spawn_blocking(move || load(&file, &handle, &served)).await;
        let loaded = loaded.unwrap_or_else(|e| Err(ConfigError(format!("loading the configuration: {e}"))));
        match loaded {
            Ok(config) => {
                last = config.content.clone();
                let hash = hash(&config.content);
                metrics.loaded(&id, &hash);
                metrics.reloaded(&id, true);
                tracing::info!(file = %path.display(), %hash, "encryption configuration reloaded");
                changed();
            }
            Err(e) => {
                last = content;
                metrics.reloaded(&id, false);
                tracing::error!(error = %e, file = %path.display(), "error processing encryption config file; keeping the running configuration");
            }
        }
    }
}

/// Loads `path` and hands the providers it gives the served resources to `values`, all at once.
fn load(path: &Path, values: &Transformer, served: &Served) -> Result<EncryptionConfig, ConfigError> {
    let config = EncryptionConfig::load(path)?;
    // A resource the configuration no longer names is stored plainly from now on, as kube-apiserver's is.
    let table = providers(&config, &served.resources, served.timing)?;
    values.replace(or_identity(table, &served.resources));
    Ok(config)
}

/// Waits until every KMS plugin has answered once, so the store's load reads what they encrypted (as the cache
/// waits for etcd). Logged every 10 s meanwhile.
pub async fn wait_for_providers(values: &Transformer) {
    let started = std::time::Instant::now();
    let mut next_log = started;
    while !values.ready() {
        if std::time::Instant::now() >= next_log {
            tracing::warn!(waited = ?started.elapsed(), "waiting for the KMS v2 plugins to answer before loading the store");
            next_log += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests;
