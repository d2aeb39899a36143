//! From flags to a running server: storage, then the registry over it, then HTTP and the controller on the
//! registry. Everything but this wiring reaches PodSets through the registry.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::options::{client_from, in_cluster, Options};
use crate::admission::Admission;
use crate::admission::Chain;
use crate::api::resource::ResourceInfo;
use crate::apiserver::auth::{DynamicTrust, ExpressionAuthorizer};
use crate::apiserver::filters::MaxInFlight;
use crate::apiserver::health::{self, named_check, Endpoint, HealthChecks};
use crate::apiserver::{tls, Server, ServerConfig};
use crate::controller::InformerSync;
use crate::registry::{Registry as GenericRegistry, RestStorage, Strategy};
use crate::resources::podset;
use crate::resources::podset::PodSets as Registry;
use crate::storage::{Revision, Store};

/// The resources this server serves, each stored in its group's store, encrypted by its own providers.
pub(super) static SERVED: [&ResourceInfo; 1] = [&podset::INFO];

/// A resource served beside PodSets (a test's second kind, say): stored in its group's store, encrypted by its own
/// providers, written through the same admission, discovered and published with them. PodSets' controller,
/// storage version flag, metrics and tools stay theirs.
pub struct Extra {
    pub resource: &'static ResourceInfo,
    build: BuildStorage,
}

/// A resource's storage over its group's store, with the server's admission.
type BuildStorage = fn(Arc<dyn Store>, Arc<dyn Admission>) -> Arc<dyn RestStorage>;

impl Extra {
    /// The resource `S` describes, served by its registry.
    pub fn of<S: Strategy>() -> Self {
        Self {
            resource: S::INFO,
            build: |store, admission| Arc::new(GenericRegistry::<S>::new(store).with_admission(admission)),
        }
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    run_with(opts, Vec::new()).await
}

/// [`run`], serving `extra` resources beside PodSets.
pub async fn run_with(mut opts: Options, extra: Vec<Extra>) -> anyhow::Result<()> {
    // One rustls provider for every TLS client and server of the process, subcommands' too.
    tls::provider();
    #[cfg(feature = "planted-bugs")]
    crate::planted::plant(&opts.planted_bug);
    match opts.command.take() {
        Some(super::Command::Restore(restore)) => return super::restore::run(*restore).await,
        Some(super::Command::Backup(backup)) => return super::backup::run(backup).await,
        Some(super::Command::Check(check)) => return super::check::run(check).await,
        Some(super::Command::RotateCa(rotate)) => return super::rotate_ca::run(rotate),
        None => {}
    }
    opts.server_run.validate()?;
    opts.storage.validate()?;
    let audit = opts.audit.build()?;
    let data_dir = &opts.storage.data_dir;
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating --data-dir {}", data_dir.display()))?;
    let tls = opts.serving.tls_config(data_dir)?;

    let shutdown = CancellationToken::new();
    let kubeconfig = opts.kubeconfig.as_deref();
    let authenticator = opts.authentication.build(kubeconfig, opts.insecure_allow_all, &shutdown).await?;
    let authorizer = Arc::new(opts.authorization.build(kubeconfig, opts.insecure_allow_all).await?);

    // The main API server, for admission (namespaces, webhook configurations) and the controller.
    let main_client = match (kubeconfig, in_cluster()) {
        (None, false) => None,
        (path, _) => client_from(path, true).await?,
    };
    let controller_client = match (&main_client, opts.controller.enable_controller) {
        (_, false) => {
            tracing::info!("--enable-controller=false: PodSets are stored and served, no Pods are made");
            None
        }
        (None, true) => {
            tracing::info!("no --kubeconfig and not in a cluster: running without the embedded controller");
            None
        }
        (Some(client), true) => Some(client.clone()),
    };
    let expression_authorizer = Arc::new(ExpressionAuthorizer::new(authorizer.clone()));
    let admission = opts.admission.build(main_client, Some(expression_authorizer), shutdown.clone())?;

    let served: Vec<&'static ResourceInfo> = SERVED.iter().copied().chain(extra.iter().map(|e| e.resource)).collect();
    let (values, encryption) = opts.storage.transformer(&served)?;
    super::encryption::wait_for_providers(&values).await;
    let stores = opts.storage.factory(values.clone()).open(&served).await?;
    let store = stores.get(podset::GROUP).cloned().context("PodSets' store")?;
    let others: Vec<Arc<dyn Store>> =
        stores.iter().filter(|(g, _)| *g != podset::GROUP).map(|(_, s)| s.clone()).collect();
    if let (Some(client), true, false) =
        (&controller_client, opts.storage.looks_new(store.as_ref()), opts.storage.allow_empty_store)
    {
        refuse_if_pods_are_orphaned(client, &opts.storage.location(podset::GROUP)).await?;
    }

    let informers = InformerSync::default();
    // SIGTERM fails /readyz at once; serving stops only after --shutdown-delay-duration.
    let shutdown_initiated = CancellationToken::new();
    let every_store: Vec<Arc<dyn Store>> = std::iter::once(store.clone()).chain(others).collect();
    let mut health = health_checks(
        opts.storage.check_name(),
        &every_store,
        &authenticator.trust,
        (&informers, &admission),
        &shutdown_initiated,
    );
    if encryption.as_ref().is_some_and(|c| c.kms_providers().next().is_some())
        || opts.storage.encryption_provider_config_automatic_reload
    {
        // One check for every plugin, as kube-apiserver names it when it reloads or uses KMS v2 only.
        let kms = super::encryption::kms_check(&values);
        health.add(Endpoint::Healthz, kms.clone()).add(Endpoint::Readyz, kms);
    }
    let cfg = ServerConfig {
        health,
        tls,
        authenticator,
        authorizer,
        bookmark_interval: opts.serving.bookmark_interval(),
        shutdown_grace: opts.serving.shutdown_grace(),
        http2_max_streams: opts.serving.http2_max_streams(),
        goaway_chance: opts.serving.goaway_chance,
        max_in_flight: MaxInFlight::new(
            opts.server_run.max_requests_inflight,
            opts.server_run.max_mutating_requests_inflight,
        ),
        request_timeout: opts.server_run.request_timeout,
        min_request_timeout: opts.server_run.min_request_timeout(),
        audit,
    };
    register_metrics();
    crate::metrics::register_collector(Box::new(crate::metrics::ScrapeGauges(store_gauges(store.clone()))));
    let admission: Arc<dyn Admission> = Arc::new(admission);
    let registry = Registry::new(store.clone())
        .with_admission(admission.clone())
        .with_storage_version(opts.storage.storage_version);
    let mut storages: Vec<Arc<dyn RestStorage>> = vec![Arc::new(registry.clone())];
    for e in &extra {
        let store = stores.get(e.resource.group).cloned().context("an extra resource's store")?;
        storages.push((e.build)(store, admission.clone()));
    }
    drop(stores);
    let addr = opts.serving.address();
    let routes = crate::apiserver::routes::Routes::new(storages.clone());
    let server =
        Server::bind(addr, routes, cfg, shutdown.clone()).await.with_context(|| format!("listening on {addr}"))?;
    tracing::info!(
        address = %server.local_addr()?,
        storage_version = %opts.storage.storage_version,
        "serving demo.k8s.io (v1beta1, v1alpha1) over HTTPS"
    );
    let migrations = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(migrate_storage(storages, migrations.clone(), shutdown.clone()));
    if let Some(config) = encryption {
        super::encryption::record_config(&config);
        if opts.storage.encryption_provider_config_automatic_reload {
            let path = opts.storage.encryption_provider_config.clone().unwrap_or_default();
            let interval = opts.storage.encryption_provider_config_reload_interval;
            // A new writing provider: the migration moves every object to it.
            let changed = move || migrations.notify_one();
            let served = super::encryption::Served { resources: served.clone(), timing: opts.storage.kms_timing() };
            let content = config.content.clone();
            let reload = super::encryption::reload(path, interval, served, values, content, changed, shutdown.clone());
            tokio::spawn(reload);
        }
    }
    tokio::spawn(count_storage_versions(registry.clone(), shutdown.clone()));

    if let Some(client) = controller_client {
        opts.controller.spawn(registry, client, informers, opts.serving.namespace(), shutdown.clone());
    }

    let signal = shutdown.clone();
    let delay = opts.server_run.shutdown_delay_duration;
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(?delay, "signal received: /readyz fails from now on, serving stops after the shutdown delay");
        shutdown_initiated.cancel();
        tokio::time::sleep(delay).await;
        tracing::info!("shutting down");
        signal.cancel();
    });
    server.serve().await;
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    tracing::info!("stopped");
    Ok(())
}

/// Rewrites every resource's objects stored in another version (or by another encryption provider) at start and
/// after each encryption configuration reload (`again`); a pass that fails (the store unavailable) or leaves
/// objects behind (refused by admission or validation) is tried again a minute later, resuming where the objects
/// left off.
async fn migrate_storage(
    storages: Vec<Arc<dyn RestStorage>>,
    again: Arc<tokio::sync::Notify>,
    shutdown: CancellationToken,
) {
    loop {
        let mut wait = None;
        for s in &storages {
            if !matches!(s.migrate_storage().await, Ok(pass) if pass.refused == 0) {
                wait = Some(std::time::Duration::from_secs(60));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = again.notified() => {}
            _ = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
        }
    }
}

/// Keeps the whole store's count by stored version current: counted again a second after any change, and every
/// 30 s (a KMS plugin's new key makes objects stale without a change to the store).
async fn count_storage_versions(registry: Registry, shutdown: CancellationToken) {
    let mut counted: Option<(Revision, std::time::Instant)> = None;
    loop {
        let revision = registry.current_revision();
        let due = counted.is_none_or(|(r, at)| r != revision || at.elapsed() > std::time::Duration::from_secs(30));
        if due && registry.count_storage_versions().await.is_ok() {
            counted = Some((revision, std::time::Instant::now()));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// An empty store while Pods still name PodSets as their controller means the data is missing, not new: serving
/// would tell the garbage collector their owners are gone, and it would delete them.
async fn refuse_if_pods_are_orphaned(client: &kube::Client, place: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = kube::Api::all(client.clone());
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = match pods.list_metadata(&params).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the main API server for Pods owned by PodSets");
                return Ok(());
            }
        };
        let owned = page.items.iter().find(|p| {
            p.metadata.owner_references.iter().flatten().any(|r| {
                r.controller == Some(true)
                    && r.kind == crate::api::KIND
                    && crate::api::Version::of_api_version(&r.api_version).is_some()
            })
        });
        if let Some(p) = owned {
            anyhow::bail!(
                "{place} is empty, but Pod {}/{} in the main API server is owned by a PodSet: refusing to \
                 start, because the garbage collector would delete such Pods. Restore the data, or pass \
                 --allow-empty-store if the PodSets are really gone.",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            );
        }
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(()),
        }
    }
}

/// The named checks, as k8s.io/apiserver arranges them: `ping` and `storage` everywhere; on /readyz also
/// `informer-sync` (the controller's and admission's caches), `delegation` (trust anchors loaded) and, last,
/// `shutdown`.
/// `storage` on /readyz (and /healthz): the store takes writes now, or has just recovered. On /livez: it can still
/// recover in place; when it cannot, the kubelet restarts the pod.
fn health_checks(
    storage_check: &'static str,
    stores: &[Arc<dyn Store>],
    trust: &Arc<DynamicTrust>,
    (informers, admission): (&InformerSync, &Chain),
    shutdown_initiated: &CancellationToken,
) -> HealthChecks {
    let mut checks = HealthChecks::default();
    // One check over every group's store, as kube-apiserver's one `etcd` check covers every resource.
    let writable = |stores: Vec<Arc<dyn Store>>| {
        named_check(storage_check, move || {
            let stores = stores.clone();
            async move {
                for store in stores {
                    store.check_writable().await.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
        })
    };
    let alive = stores.to_vec();
    let trust = trust.clone();
    let delegation = named_check("delegation", move || {
        std::future::ready(if trust.is_loaded() {
            Ok(())
        } else {
            Err("the trust anchors from kube-system/extension-apiserver-authentication have not been read yet".into())
        })
    });
    checks
        .add(Endpoint::Healthz, health::ping())
        .add(Endpoint::Healthz, writable(stores.to_vec()))
        .add(Endpoint::Livez, health::ping())
        .add(
            Endpoint::Livez,
            named_check(storage_check, move || {
                std::future::ready(alive.iter().try_for_each(|s| s.check_alive()).map_err(|e| e.to_string()))
            }),
        )
        .add(Endpoint::Readyz, health::ping())
        .add(Endpoint::Readyz, writable(stores.to_vec()))
        .add(Endpoint::Readyz, {
            // The controller's caches, and admission's namespaces, webhook configurations, policies and quotas.
            let (informers, admission) = (informers.clone(), admission.clone());
            named_check("informer-sync", move || {
                std::future::ready(informers.check().and_then(|()| match admission.has_synced() {
                    true => Ok(()),
                    false => {
                        Err("admission: namespaces, webhook configurations, policies or quotas not yet listed".into())
                    }
                }))
            })
        })
        .add(Endpoint::Readyz, delegation)
        .add(Endpoint::Readyz, health::shutdown(shutdown_initiated.clone()));
    checks
}

/// Every part's metric families, registered before the first scrape: each registers its own on first use, and a
/// family that is a plain counter or histogram shows (at 0) from the start, as a dashboard expects.
fn register_metrics() {
    crate::apiserver::metrics::metrics();
    crate::apiserver::auth::metrics::metrics();
    crate::apiserver::audit::metrics::metrics();
    crate::admission::metrics::metrics();
    crate::storage::value::metrics::metrics();
    crate::storage::sled_metrics();
    crate::controller::metrics::metrics();
    crate::resources::podset::metrics::metrics();
}

/// The store's revisions and sizes, read at each scrape.
fn store_gauges(store: Arc<dyn Store>) -> impl Fn() -> Vec<(&'static str, &'static str, i64)> + Send + Sync {
    move || {
        let stats = store.stats();
        let mut gauges = vec![
            (
                "podset_storage_current_revision",
                "The store's newest revision (resourceVersion).",
                store.current_revision() as i64,
            ),
            (
                "podset_storage_compacted_revision",
                "The oldest revision reads and watches can start from; older ones get 410 Gone.",
                store.compacted_revision() as i64,
            ),
            ("podset_storage_history_events", "Changes kept for watches to resume from.", stats.history_events as i64),
            (
                "podset_storage_history_bytes",
                "Serialized bytes of the objects the kept changes carry.",
                stats.history_bytes as i64,
            ),
        ];
        if let Some(bytes) = stats.data_bytes {
            gauges.push(("podset_storage_data_bytes", "Bytes the embedded store's files take on disk.", bytes as i64));
        }
        gauges
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
