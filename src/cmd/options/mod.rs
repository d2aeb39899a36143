//! Flags, named as k8s.io/apiserver names them, one group per concern; each group builds its part of the server.

mod authentication;
mod authorization;
mod controller;
mod serving;
mod storage;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};

pub use authentication::AuthenticationOptions;
pub use authorization::AuthorizationOptions;
pub use controller::ControllerOptions;
pub use serving::ServingOptions;
pub use storage::StorageOptions;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// podset-apiserver serves the PodSet API (demo.k8s.io/v1alpha1) to a Kubernetes cluster as an aggregated API
/// server: deploy it with `kubectl apply -k deploy/overlays/self-signed` (or `.../cert-manager`), and kube-apiserver
/// forwards /apis/demo.k8s.io/v1alpha1 here. PodSets are stored in this server's own database (--data-dir), not in
/// the cluster's etcd.
#[derive(Debug, Clone, Parser)]
#[command(name = "podset-apiserver", version = crate::version::GIT_VERSION, long_version = crate::version::LONG_VERSION)]
pub struct Options {
    #[command(flatten)]
    pub serving: ServingOptions,

    #[command(flatten)]
    pub authentication: AuthenticationOptions,

    #[command(flatten)]
    pub authorization: AuthorizationOptions,

    #[command(flatten)]
    pub storage: StorageOptions,

    #[command(flatten)]
    pub controller: ControllerOptions,

    /// Kubeconfig of the main API server: for the embedded controller, and for authentication and authorization
    /// unless their own kubeconfig flags say otherwise. In a cluster, the in-cluster config is used.
    #[arg(long, env = "KUBECONFIG", help_heading = "Main API server")]
    pub kubeconfig: Option<PathBuf>,

    /// DEVELOPMENT ONLY: no delegated authentication or authorization; every request is allowed, as an
    /// administrator unless a front proxy names someone. Never use on a reachable network.
    #[arg(long, help_heading = "Authentication")]
    pub insecure_allow_all: bool,

    /// Log format.
    #[arg(long, value_enum, default_value = "text", help_heading = "Logging")]
    pub log_format: LogFormat,
}

/// A Go-style duration as k8s.io/apiserver's flags take it ("10s", "1m30s", "500ms"), or plain seconds.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("{s:?} is not a duration like 10s or 1m: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
}

/// A client for the main API server from a kubeconfig, else in-cluster, else none. `retry: false` leaves retries
/// to the caller: a request waiting on a TokenReview or SubjectAccessReview must not sit through kube's long backoff.
pub(crate) async fn client_from(path: Option<&Path>, retry: bool) -> anyhow::Result<Option<kube::Client>> {
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
        ])
        .unwrap();
        assert_eq!(o.serving.secure_port, 0);
        assert_eq!(o.authentication.requestheader_allowed_names, ["front-proxy-client", "aggregator"]);
        assert_eq!(o.authorization.authorization_webhook_cache_authorized_ttl, Duration::from_secs(60));
        assert_eq!(o.storage.data_dir, Path::new("/tmp/x"));
        assert_eq!(o.controller.controller_workers, 3);
        assert!(!o.controller.leader_elect);
        assert!(Options::try_parse_from(["podset-apiserver", "--tls-cert-file=a.crt"]).is_err(), "key required too");
    }
}
