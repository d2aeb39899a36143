//! Delegated authorization: SubjectAccessReviews to the main API server, as k8s.io/apiserver's
//! `DelegatingAuthorizationOptions`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::{client_from, duration, no_main_api_server};
use crate::apiserver::auth::{AlwaysAllowPaths, Authorizer, AuthorizerConfig, CacheLimits};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Authorization")]
pub struct AuthorizationOptions {
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
}

impl AuthorizationOptions {
    /// The authorizer; `kubeconfig` is the fallback for --authorization-kubeconfig.
    pub async fn build(&self, kubeconfig: Option<&Path>, insecure_allow_all: bool) -> anyhow::Result<Authorizer> {
        if insecure_allow_all {
            return Ok(Authorizer::allow_all());
        }
        let path = self.authorization_kubeconfig.as_deref().or(kubeconfig);
        let client = client_from(path, false).await?.ok_or_else(no_main_api_server)?;
        let always_allow_paths = AlwaysAllowPaths::new(&self.authorization_always_allow_paths)
            .map_err(|e| anyhow::anyhow!("--authorization-always-allow-paths: {e}"))?;
        Ok(Authorizer::new(
            Some(client),
            AuthorizerConfig {
                always_allow_paths,
                cache: CacheLimits {
                    allowed_ttl: self.authorization_webhook_cache_authorized_ttl,
                    denied_ttl: self.authorization_webhook_cache_unauthorized_ttl,
                    capacity: 10_000,
                },
                timeout: Duration::from_secs(10),
            },
        ))
    }
}
