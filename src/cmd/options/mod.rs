//! Flags, named as k8s.io/apiserver names them, one group per concern; each group builds its part of the server.

mod admission;
mod audit;
mod authentication;
mod authorization;
mod controller;
mod server_run;
pub(crate) mod serving;
mod storage;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

pub use admission::AdmissionOptions;
pub use audit::AuditOptions;
pub use authentication::AuthenticationOptions;
pub use authorization::AuthorizationOptions;
pub use controller::ControllerOptions;
pub use server_run::ServerRunOptions;
pub use serving::ServingOptions;
pub use storage::{StorageBackend, StorageOptions};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// podset-apiserver serves the PodSet API (demo.k8s.io/v1beta1, preferred, and v1alpha1) to a Kubernetes cluster as
/// an aggregated API server: deploy it with `kubectl apply -k deploy/overlays/self-signed` (or `.../cert-manager`,
/// or `.../ha-etcd` for several replicas), and kube-apiserver forwards /apis/demo.k8s.io/v1beta1 and
/// /apis/demo.k8s.io/v1alpha1 here. PodSets are stored in this
/// server's own database (--data-dir), or with --storage-backend=etcd in an etcd (--etcd-servers).
#[derive(Debug, Clone, Parser)]
#[command(name = "podset-apiserver", version = crate::version::GIT_VERSION, long_version = crate::version::LONG_VERSION)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Options {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub serving: ServingOptions,

    #[command(flatten)]
    pub server_run: ServerRunOptions,

    #[command(flatten)]
    pub authentication: AuthenticationOptions,

    #[command(flatten)]
    pub authorization: AuthorizationOptions,

    #[command(flatten)]
    pub storage: StorageOptions,

    #[command(flatten)]
    pub controller: ControllerOptions,

    #[command(flatten)]
    pub audit: AuditOptions,

    #[command(flatten)]
    pub admission: AdmissionOptions,

    /// Kubeconfig of the main API server: for the embedded controller, and for authentication and authorization
    /// unless their own kubeconfig flags say otherwise. In a cluster, the in-cluster config is used.
    #[arg(long, env = "KUBECONFIG", help_heading = "Main API server")]
    pub kubeconfig: Option<PathBuf>,

    /// DEVELOPMENT ONLY: no delegated authentication or authorization; every request is allowed, as an
    /// administrator unless a front proxy names someone. Never use on a reachable network.
    #[arg(long, help_heading = "Authentication")]
    pub insecure_allow_all: bool,

    /// Turns on a bug planted on purpose (only in a build with the `planted-bugs` feature, for the fault
    /// harness's own test); may be repeated.
    #[cfg(feature = "planted-bugs")]
    #[arg(long, value_enum, hide = true)]
    pub planted_bug: Vec<crate::planted::Bug>,

    /// An apiserver.config.k8s.io TracingConfiguration (v1, v1beta1 or v1alpha1), as kube-apiserver takes: spans
    /// are exported over OTLP/gRPC to its `endpoint` (default localhost:4317), `samplingRatePerMillion` of new
    /// traces sampled. Without it, no span is made.
    #[arg(long, help_heading = "Tracing")]
    pub tracing_config_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, value_enum, default_value = "text", help_heading = "Logging")]
    pub log_format: LogFormat,
}

/// What else the binary does besides serving.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Restores PodSets from a backup into an empty store (either backend), keeping uid, creationTimestamp,
    /// generation, finalizers, owner references, managedFields and status, then exits. resourceVersions are new.
    Restore(Box<crate::cmd::RestoreOptions>),
    /// Backs up every PodSet through the main API server into a file `restore` reads (what an in-cluster CronJob
    /// runs: deploy/backup), as one consistent snapshot, then exits.
    #[command(next_line_help = true)]
    Backup(crate::cmd::BackupOptions),
    /// Checks an install through the main API server: the APIServices are Available, discovery lists podsets,
    /// a dry-run create of a PodSet is admitted, and each replica is ready. One line per check; exits 1 if any
    /// failed.
    #[command(next_line_help = true)]
    Check(crate::cmd::CheckOptions),
    /// Rotates the self-signed CA under the server's data directory in two steps, printing the CA bundle to pin:
    /// first the current and a next CA, then (--finish) a certificate of the next one is served and only it is
    /// printed. Run it in the server's Pod (`kubectl exec`).
    #[command(name = "rotate-ca", next_line_help = true)]
    RotateCa(crate::cmd::RotateCaOptions),
}

pub(crate) use crate::api::duration::parse as duration;

/// A client for the main API server from a kubeconfig, else in-cluster, else none. `retry: false` leaves retries
/// to the caller: a request waiting on a TokenReview or SubjectAccessReview must not sit through kube's long backoff.
pub(crate) async fn client_from(path: Option<&Path>, retry: bool) -> anyhow::Result<Option<kube::Client>> {
    let (mut cfg, origin) = match path {
        Some(path) => {
            let origin = format!("kubeconfig {}", path.display());
            let kc = kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {origin}"))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("loading {origin}"))?;
            (cfg, origin)
        }
        None if in_cluster() => {
            (kube::Config::incluster().context("loading the in-cluster config")?, "the in-cluster config".to_owned())
        }
        None => return Ok(None),
    };
    cfg.default_retry = retry;
    let auth = cfg.auth_info.clone();
    // Each request a client span, carrying the trace context of the request or reconcile that makes it.
    match kube::client::ClientBuilder::try_from(cfg) {
        Ok(builder) => Ok(Some(builder.with_layer(&crate::trace::ClientTracing).build())),
        Err(e) => {
            check_client_certificate(&auth, &origin)?;
            Err(anyhow::Error::new(e).context(format!("a client from {origin}")))
        }
    }
}

/// Says what is wrong with a kubeconfig's client certificate in words a user can act on. rustls (through kube)
/// reports an X.509 v1 certificate, which `openssl x509 -req` makes unless given extensions, as "invalid private
/// key: invalid peer certificate: UnsupportedCertVersion", naming neither the file nor the fix.
fn check_client_certificate(auth: &kube::config::AuthInfo, origin: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    let (pem, what) = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => {
            let what = format!("the client-certificate-data in {origin}");
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| anyhow::anyhow!("{what} is not base64: {e}"))?;
            (pem, what)
        }
        (None, Some(file)) => {
            let what = format!("the client certificate {file} (from {origin})");
            (std::fs::read(file).with_context(|| format!("reading {what}"))?, what)
        }
        (None, None) => return Ok(()),
    };
    let mut found = false;
    for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
        let block = block.map_err(|e| anyhow::anyhow!("{what} is not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        found = true;
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
            .map_err(|e| anyhow::anyhow!("{what} is not an X.509 certificate: {e}"))?;
        let version = cert.version().0 + 1;
        if version != 3 {
            anyhow::bail!(
                "{what} (subject {}) is an X.509 v{version} certificate, and TLS clients here (rustls) accept only \
                 v3. `openssl x509 -req` makes v1 unless given extensions: sign it again with, for example, \
                 `-extfile <(printf 'keyUsage=critical,digitalSignature,keyEncipherment\\nextendedKeyUsage=clientAuth')`",
                cert.subject()
            );
        }
    }
    if !found {
        anyhow::bail!("{what} holds no PEM CERTIFICATE block");
    }
    Ok(())
}

pub(crate) fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// The error when delegated auth has no way to reach the main API server.
pub(crate) fn no_main_api_server() -> anyhow::Error {
    anyhow::anyhow!(
        "delegated authentication and authorization need the main API server: pass --kubeconfig (or \
         --authentication-kubeconfig and --authorization-kubeconfig), or run in a cluster. \
         --insecure-allow-all serves without them, for development only."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    /// `openssl x509 -req -signkey` without extensions: X.509 v1.
    const V1_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBNjCB3QIUW2GC0um++kgjK42mI2EhI+USIzowCgYIKoZIzj0EAwIwHTENMAsG\nA1UEAwwEamFuZTEMMAoGA1UECgwDZGV2MCAXDTI2MTEyMzExMTYxNFoYDzIxMjYx\nMDMwMTExNjE0WjAdMQ0wCwYDVQQDDARqYW5lMQwwCgYDVQQKDANkZXYwWTATBgcq\nhkjOPQIBBggqhkjOPQMBBwNCAARDoHI4q06Ob1JNWxiibF2zye+KXuPx2yVKaIES\n8yOb7zf0pFF9k2OUrhRz+H+od9qmOXuUtLvgHzPj/giJ9lZ6MAoGCCqGSM49BAMC\nA0gAMEUCIQD3He+nKeaS3+BNHvcagZdQexQ9vPfLFWrp7D8AF8Rq1wIgX9h3vO7Q\n2vZCyzVw8zCsm4IrRzz57CHyBIRztI5Vj6I=\n-----END CERTIFICATE-----\n";

    #[test]
    fn a_v1_client_certificate_is_named_with_what_to_do() {
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jane.crt");
        std::fs::write(&file, V1_CERT).unwrap();
        let auth =
            kube::config::AuthInfo { client_certificate: Some(file.display().to_string()), ..Default::default() };
        let e = check_client_certificate(&auth, "kubeconfig /k").unwrap_err().to_string();
        assert!(e.contains(&format!("the client certificate {} (from kubeconfig /k)", file.display())), "{e}");
        assert!(e.contains("CN=jane") && e.contains("X.509 v1 certificate") && e.contains("-extfile"), "{e}");

        let data = base64::engine::general_purpose::STANDARD.encode(V1_CERT);
        let auth = kube::config::AuthInfo { client_certificate_data: Some(data), ..Default::default() };
        let e = check_client_certificate(&auth, "kubeconfig /k").unwrap_err().to_string();
        assert!(
            e.starts_with("the client-certificate-data in kubeconfig /k (subject CN=jane, O=dev) is an X.509 v1"),
            "{e}"
        );

        let auth =
            kube::config::AuthInfo { client_certificate_data: Some("bm90IGEgY2VydA==".into()), ..Default::default() };
        let e = check_client_certificate(&auth, "kubeconfig /k").unwrap_err().to_string();
        assert!(e.contains("no PEM CERTIFICATE"), "{e}");
        let auth = kube::config::AuthInfo { client_certificate: Some("/nonexistent.crt".into()), ..Default::default() };
        let e = format!("{:#}", check_client_certificate(&auth, "kubeconfig /k").unwrap_err());
        assert!(e.contains("reading the client certificate /nonexistent.crt (from kubeconfig /k)"), "{e}");
    }

    #[test]
    fn flag_groups_make_one_consistent_command_line() {
        Options::command().debug_assert();
        let o = Options::try_parse_from([
            "podset-apiserver",
            "--secure-port=0",
            "--requestheader-allowed-names=front-proxy-client,aggregator",
            "--authorization-webhook-cache-authorized-ttl=1m",
            "--data-dir=/tmp/x",
            "--controller-workers=3",
            "--leader-elect=false",
            "--request-timeout=30s",
            "--max-mutating-requests-inflight=7",
            "--audit-log-path=-",
            "--audit-log-maxsize=100",
            "--disable-admission-plugins=ValidatingAdmissionWebhook",
        ])
        .unwrap();
        assert_eq!(o.serving.secure_port, 0);
        assert_eq!(o.authentication.requestheader_allowed_names, ["front-proxy-client", "aggregator"]);
        assert_eq!(o.authorization.authorization_webhook_cache_authorized_ttl, Duration::from_secs(60));
        assert_eq!(o.storage.data_dir, Path::new("/tmp/x"));
        assert_eq!(o.controller.controller_workers, 3);
        assert!(!o.controller.leader_elect);
        assert_eq!(o.server_run.request_timeout, Duration::from_secs(30));
        assert_eq!((o.server_run.max_requests_inflight, o.server_run.max_mutating_requests_inflight), (400, 7));
        assert_eq!(o.server_run.min_request_timeout(), Duration::from_secs(1800));
        assert_eq!(o.audit.audit_log_path.as_deref(), Some(Path::new("-")));
        assert_eq!((o.audit.audit_log_maxsize, o.audit.audit_log_maxbackup, o.audit.audit_log_maxage), (100, 0, 0));
        assert_eq!(o.admission.disable_admission_plugins, ["ValidatingAdmissionWebhook"]);
        assert!(Options::try_parse_from(["podset-apiserver", "--tls-cert-file=a.crt"]).is_err(), "key required too");
    }

    #[test]
    fn restore_takes_the_storage_flags_and_no_serving_flags() {
        let o = Options::try_parse_from([
            "podset-apiserver",
            "restore",
            "--from=-",
            "--storage-backend=etcd",
            "--etcd-servers=https://etcd:2379",
        ])
        .unwrap();
        let Some(Command::Restore(r)) = o.command else { panic!("restore: {:?}", o.command) };
        assert_eq!(r.from, Path::new("-"));
        assert_eq!(r.storage.etcd_servers, ["https://etcd:2379"]);
        r.storage.validate().unwrap();
        assert!(Options::try_parse_from(["podset-apiserver", "restore"]).is_err(), "--from is required");
        assert!(
            Options::try_parse_from(["podset-apiserver", "restore", "--from=b.json", "--secure-port=1"]).is_err(),
            "a serving flag means nothing to restore"
        );
        assert!(
            Options::try_parse_from(["podset-apiserver", "--secure-port=1", "restore", "--from=b.json"]).is_err(),
            "nor before it"
        );
    }
}
