//! Command-line flags (named as k8s.io/apiserver names them) and the wiring from flags to a running server.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::apiserver::cache::CacheLimits;
use crate::apiserver::delegation::{self, TrustSources};
use crate::apiserver::health::{named_check, Endpoint, HealthChecks};
use crate::apiserver::tls::{self, ClientCa};
use crate::apiserver::{
    AlwaysAllowPaths, Authenticator, Authorizer, AuthorizerConfig, DynamicTrust, RequestHeader, Server, ServerConfig,
    TokenReviewer, Trust,
};
use crate::controller::leader::{self, LeaseConfig};
use crate::controller::{self, ControllerConfig};
use crate::registry::Registry;
use crate::storage::{Cacher, HistoryLimits, SledBackend, SledOptions, StorageError, Store};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// podset-apiserver serves the PodSet API (demo.k8s.io/v1alpha1) to a Kubernetes cluster as an aggregated API
/// server: register it with deploy/apiservice.yaml and kube-apiserver forwards /apis/demo.k8s.io/v1alpha1 here.
/// PodSets are stored in this server's own database (--data-dir), not in the cluster's etcd.
#[derive(Debug, Clone, Parser)]
#[command(name = "podset-apiserver", version)]
pub struct Options {
    /// IP address to listen on for HTTPS.
    #[arg(long, default_value = "0.0.0.0", env = "PODSET_BIND_ADDRESS")]
    pub bind_address: IpAddr,

    /// Port to serve HTTPS on (0 picks a free one and logs it).
    #[arg(long, default_value_t = 8443, env = "PODSET_SECURE_PORT")]
    pub secure_port: u16,

    /// Serving certificate (PEM). Without it, a self-signed CA and certificate are made under --cert-dir and the CA's
    /// path is logged: put that CA in the APIService's caBundle.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key for --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Where self-signed certificates are written. Default: <data-dir>/certs.
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,

    /// Extra host names or IPs for the self-signed serving certificate (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub tls_sans: Vec<String>,

    /// CA bundle that signs the front proxy's client certificate (kube-apiserver's --proxy-client-cert-file).
    /// X-Remote-* identity headers are believed only on connections presenting a certificate it verifies.
    /// Default: read (and followed) from the ConfigMap kube-system/extension-apiserver-authentication. The file is
    /// re-read when it changes.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// CA bundle for client certificates (user = CN, groups = O), re-read when it changes. Default: from the same
    /// ConfigMap.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,

    /// Kubeconfig for TokenReviews and the authentication ConfigMap. Default: --kubeconfig, else in-cluster.
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,

    /// Do not read the authentication ConfigMap; only the flags count.
    #[arg(long)]
    pub authentication_skip_lookup: bool,

    /// Start even if the authentication ConfigMap cannot be read (requests may then be treated as anonymous).
    #[arg(long)]
    pub authentication_tolerate_lookup_failure: bool,

    /// How long a TokenReview answer is cached (a rejection for at most 2s).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authentication_token_webhook_cache_ttl: Duration,

    /// Kubeconfig for SubjectAccessReviews. Default: --kubeconfig, else in-cluster.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,

    /// How long an allowing SubjectAccessReview is cached.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,

    /// How long a denying SubjectAccessReview is cached.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,

    /// Paths anyone may reach without a SubjectAccessReview (exact, or a prefix ending in *).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,

    /// Common names allowed for the front proxy's client certificate (comma-separated; empty allows any).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,

    /// Headers carrying the user name, first match wins.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,

    /// Headers carrying the user's groups.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,

    /// Header prefixes carrying extra user attributes.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,

    /// Directory of the embedded database (sled) and self-signed certificates.
    #[arg(long, default_value = "podset-data", env = "PODSET_DATA_DIR")]
    pub data_dir: PathBuf,

    /// Kubeconfig of the main API server, for the embedded controller. In a cluster, the in-cluster config is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Run the embedded controller, which makes each PodSet's Pods in the main API server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_controller: bool,

    /// PodSets the controller reconciles at once.
    #[arg(long, default_value_t = 8)]
    pub controller_workers: usize,

    /// Seconds between full resyncs of every PodSet.
    #[arg(long, default_value_t = 300)]
    pub controller_resync_seconds: u64,

    /// Sustained writes per second the controller sends the main API server (0: no client-side limit).
    #[arg(long, default_value_t = 500)]
    pub controller_qps: u32,

    /// Writes the controller may send at once above --controller-qps.
    #[arg(long, default_value_t = 1000)]
    pub controller_burst: u32,

    /// Watch only Pods matching this label selector (default: all Pods, so any matching orphan can be adopted).
    #[arg(long)]
    pub controller_pod_selector: Option<String>,

    /// Start even when the store is empty while Pods in the main API server are still owned by PodSets (which
    /// looks like a lost or unmounted data dir, and would let the garbage collector delete those Pods).
    #[arg(long)]
    pub allow_empty_store: bool,

    /// With several replicas, run the controller only on the holder of a Lease in the main API server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease. Default: the pod's namespace in a cluster, else podset-system.
    #[arg(long)]
    pub leader_election_namespace: Option<String>,

    /// DEVELOPMENT ONLY: no delegated authentication or authorization; every request is allowed, as an
    /// administrator unless a front proxy names someone. Never use on a reachable network.
    #[arg(long)]
    pub insecure_allow_all: bool,

    /// Keep at least this many of the newest changes for watches to resume from.
    #[arg(long, default_value_t = 10_000)]
    pub watch_history_events: usize,

    /// Also keep every change younger than this many seconds (up to --watch-history-max-events).
    #[arg(long, default_value_t = 300)]
    pub watch_history_seconds: u64,

    /// Hard cap on kept changes.
    #[arg(long, default_value_t = 200_000)]
    pub watch_history_max_events: usize,

    /// Hard cap on the serialized size of kept changes, in bytes (the newest change is always kept).
    #[arg(long, default_value_t = HistoryLimits::default().max_bytes)]
    pub watch_history_max_bytes: usize,

    /// sled's page cache, in bytes. Objects are served from the server's own cache; sled reads only to check
    /// writes and at start.
    #[arg(long, default_value_t = SledOptions::default().cache_capacity)]
    pub storage_sled_cache_bytes: u64,

    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 60)]
    pub watch_bookmark_interval: u64,

    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// A Go-style duration as k8s.io/apiserver's flags take it ("10s", "1m30s", "500ms"), or plain seconds.
fn duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("{s:?} is not a duration like 10s or 1m: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
}

/// A client for the main API server. `retry: false` leaves retries to the caller: a request waiting on a
/// TokenReview or SubjectAccessReview must not sit through kube's long backoff.
async fn client_from(path: Option<&std::path::Path>, retry: bool) -> anyhow::Result<Option<kube::Client>> {
    let mut cfg = match path {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None if in_cluster() => kube::Config::incluster()?,
        None => return Ok(None),
    };
    cfg.default_retry = retry;
    Ok(Some(kube::Client::try_from(cfg)?))
}

/// Delegated authentication and authorization, as k8s.io/apiserver sets them up for sample-apiserver.
async fn delegated_auth(
    opts: &Options,
    request_header: Option<RequestHeader>,
    stop: &CancellationToken,
) -> anyhow::Result<(Authenticator, Authorizer)> {
    let flags =
        Trust { request_header, client_ca: opts.client_ca_file.as_deref().map(ClientCa::from_file).transpose()? };
    let flags_fix_everything = flags.request_header.is_some() && flags.client_ca.is_some();
    let trust = Arc::new(DynamicTrust::default());
    let sources = TrustSources::new(trust.clone(), flags);
    delegation::follow_flag_files(
        sources.clone(),
        opts.requestheader_client_ca_file.clone(),
        opts.client_ca_file.clone(),
        Duration::from_secs(10),
        stop.clone(),
    );
    if opts.insecure_allow_all {
        tracing::warn!(
            "--insecure-allow-all: EVERY REQUEST IS ALLOWED, AS AN ADMINISTRATOR. For local development and tests only."
        );
        let authn = Authenticator { trust, tokens: None, insecure_allow_all: true };
        return Ok((authn, Authorizer::allow_all()));
    }
    let fallback = opts.kubeconfig.as_deref();
    let no_client = || {
        anyhow::anyhow!(
            "delegated authentication and authorization need the main API server: pass --kubeconfig (or \
             --authentication-kubeconfig and --authorization-kubeconfig), or run in a cluster. \
             --insecure-allow-all serves without them, for development only."
        )
    };
    let (authn_path, authz_path) =
        (opts.authentication_kubeconfig.as_deref().or(fallback), opts.authorization_kubeconfig.as_deref().or(fallback));
    let authn_client = client_from(authn_path, false).await?.ok_or_else(no_client)?;
    let authz_client = if authz_path == authn_path {
        authn_client.clone()
    } else {
        client_from(authz_path, false).await?.ok_or_else(no_client)?
    };

    if !opts.authentication_skip_lookup && !flags_fix_everything {
        let first = delegation::follow_cluster_trust(authn_client.clone(), sources, stop.clone());
        if let Err(e) = first.await {
            if !opts.authentication_tolerate_lookup_failure {
                anyhow::bail!(
                    "reading {}/{}: {e} (the server needs the RoleBinding to extension-apiserver-authentication-reader \
                     in deploy/rbac.yaml; --authentication-tolerate-lookup-failure starts anyway)",
                    delegation::CONFIGMAP_NAMESPACE,
                    delegation::CONFIGMAP_NAME
                );
            }
            tracing::warn!(error = %e, "cannot read the authentication ConfigMap; continuing with the flags only");
        }
    }
    let token_ttl = opts.authentication_token_webhook_cache_ttl;
    let tokens = TokenReviewer::new(
        authn_client,
        CacheLimits { allowed_ttl: token_ttl, denied_ttl: token_ttl.min(Duration::from_secs(2)), capacity: 10_000 },
        Duration::from_secs(10),
    );
    let authorizer = Authorizer::new(
        Some(authz_client),
        AuthorizerConfig {
            always_allow_paths: AlwaysAllowPaths::new(&opts.authorization_always_allow_paths)
                .map_err(|e| anyhow::anyhow!("--authorization-always-allow-paths: {e}"))?,
            cache: CacheLimits {
                allowed_ttl: opts.authorization_webhook_cache_authorized_ttl,
                denied_ttl: opts.authorization_webhook_cache_unauthorized_ttl,
                capacity: 10_000,
            },
            timeout: Duration::from_secs(10),
        },
    );
    Ok((Authenticator { trust, tokens: Some(tokens), insecure_allow_all: false }, authorizer))
}

pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// An empty store while Pods still name PodSets as their controller means the data is missing, not new: serving
/// would tell the garbage collector their owners are gone, and it would delete them.
async fn refuse_if_pods_are_orphaned(client: &kube::Client, data_dir: &std::path::Path) -> anyhow::Result<()> {
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
                r.controller == Some(true) && r.kind == crate::api::KIND && r.api_version == crate::api::API_VERSION
            })
        });
        if let Some(p) = owned {
            anyhow::bail!(
                "the store in {} is empty, but Pod {}/{} in the main API server is owned by a PodSet: refusing to \
                 start, because the garbage collector would delete such Pods. Restore the data directory, or pass \
                 --allow-empty-store if the PodSets are really gone.",
                data_dir.display(),
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

/// The pod's namespace in a cluster, else `podset-system`.
fn own_namespace() -> String {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "podset-system".into())
}

fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    tls::provider();
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("creating --data-dir {}", opts.data_dir.display()))?;

    let (certs, key) = match (&opts.tls_cert_file, &opts.tls_private_key_file) {
        (Some(c), Some(k)) => (tls::read_certs(c)?, tls::read_key(k)?),
        _ => {
            let dir = opts.cert_dir.clone().unwrap_or_else(|| opts.data_dir.join("certs"));
            let mut hosts = vec![
                "podset-apiserver.podset-system.svc".to_owned(),
                "podset-apiserver.podset-system.svc.cluster.local".to_owned(),
                "podset-apiserver.podset-system".to_owned(),
                "podset-apiserver".to_owned(),
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
            ];
            if !opts.bind_address.is_unspecified() {
                hosts.push(opts.bind_address.to_string());
            }
            hosts.extend(opts.tls_sans.iter().cloned());
            let s = tls::ensure_self_signed(&dir, &hosts)?;
            tracing::info!(ca = %s.ca.display(), cert = %s.cert.display(), "serving with a self-signed certificate; use this CA as the APIService caBundle");
            (tls::read_certs(&s.cert)?, tls::read_key(&s.key)?)
        }
    };

    let request_header = match &opts.requestheader_client_ca_file {
        Some(path) => Some(RequestHeader::new(
            ClientCa::from_file(path)?,
            opts.requestheader_allowed_names.clone(),
            &opts.requestheader_username_headers,
            &opts.requestheader_group_headers,
            &opts.requestheader_extra_headers_prefix,
        )),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let (authenticator, authorizer) = delegated_auth(&opts, request_header, &shutdown).await?;

    let controller_client = match (&opts.kubeconfig, in_cluster(), opts.enable_controller) {
        (_, _, false) => {
            tracing::info!("--enable-controller=false: PodSets are stored and served, no Pods are made");
            None
        }
        (None, false, true) => {
            tracing::info!("no --kubeconfig and not in a cluster: running without the embedded controller");
            None
        }
        (path, _, true) => client_from(path.as_deref(), true).await?,
    };

    let limits = HistoryLimits {
        min_events: opts.watch_history_events,
        min_age: Duration::from_secs(opts.watch_history_seconds),
        max_events: opts.watch_history_max_events.max(opts.watch_history_events),
        max_bytes: opts.watch_history_max_bytes,
    };
    let db_dir = opts.data_dir.join("db");
    let sled = SledOptions { cache_capacity: opts.storage_sled_cache_bytes };
    let store = tokio::task::spawn_blocking(move || -> Result<Cacher, StorageError> {
        Cacher::new(Arc::new(SledBackend::open(&db_dir, sled)?), limits)
    })
    .await??;
    let store: Arc<dyn Store> = Arc::new(store);
    if let (Some(client), true, false) = (&controller_client, store.current_revision() == 0, opts.allow_empty_store) {
        refuse_if_pods_are_orphaned(client, &opts.data_dir).await?;
    }

    let cfg = ServerConfig {
        health: storage_health_checks(&store),
        tls: tls::server_config(certs, key)?,
        authenticator,
        authorizer,
        bookmark_interval: Duration::from_secs(opts.watch_bookmark_interval.max(1)),
        shutdown_grace: Duration::from_secs(opts.shutdown_timeout),
    };
    // Everything else reaches PodSets through the registry.
    let registry = Registry::new(store.clone());
    let addr = SocketAddr::new(opts.bind_address, opts.secure_port);
    let server = Server::bind(addr, registry.clone(), cfg, shutdown.clone())
        .await
        .with_context(|| format!("listening on {addr}"))?;
    tracing::info!(address = %server.local_addr()?, "serving demo.k8s.io/v1alpha1 over HTTPS");

    if let Some(client) = controller_client {
        let cfg = ControllerConfig {
            workers: opts.controller_workers,
            resync: Duration::from_secs(opts.controller_resync_seconds.max(1)),
            qps: opts.controller_qps,
            burst: opts.controller_burst,
            pod_selector: opts.controller_pod_selector.clone(),
            ..Default::default()
        };
        if opts.leader_elect {
            let namespace = opts.leader_election_namespace.clone().unwrap_or_else(own_namespace);
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "podset-apiserver".into());
            let identity = format!("{host}_{}", uuid::Uuid::new_v4());
            let lease = LeaseConfig::new(&namespace, identity);
            tokio::spawn(leader::run(client.clone(), lease, shutdown.clone(), move |term| {
                controller::run(registry.clone(), client.clone(), cfg.clone(), term)
            }));
        } else {
            tokio::spawn(controller::run(registry, client, cfg, shutdown.clone()));
        }
    }

    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received, shutting down");
        signal.cancel();
    });
    server.serve().await;
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    tracing::info!("stopped");
    Ok(())
}

/// `storage` on /readyz (and /healthz): the store takes writes now, or has just recovered. On /livez: it can
/// still recover in place; when it cannot, the kubelet restarts the pod.
fn storage_health_checks(store: &Arc<dyn Store>) -> HealthChecks {
    let mut checks = HealthChecks::default();
    let writable = |store: Arc<dyn Store>| {
        named_check("storage", move || {
            let store = store.clone();
            async move { store.check_writable().await.map_err(|e| e.to_string()) }
        })
    };
    let alive = store.clone();
    checks.add(Endpoint::Healthz, writable(store.clone())).add(Endpoint::Readyz, writable(store.clone())).add(
        Endpoint::Livez,
        named_check("storage", move || std::future::ready(alive.check_alive().map_err(|e| e.to_string()))),
    );
    checks
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

#[cfg(test)]
mod tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn durations_read_as_kubernetes_flags_write_them() {
        assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("7"), Ok(Duration::from_secs(7)));
        assert!(duration("-5s").is_err());
        assert!(duration("soon").is_err());
    }
}
