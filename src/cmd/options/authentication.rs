//! Delegated authentication: the front proxy's headers, client certificates and TokenReviews, with trust anchors
//! from flags or the cluster's ConfigMap, as k8s.io/apiserver's `DelegatingAuthenticationOptions`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{client_from, duration, no_main_api_server};
use crate::apiserver::auth::delegation::{self, TrustSources};
use crate::apiserver::auth::{Authenticator, CacheLimits, DynamicTrust, RequestHeader, TokenReviewer, Trust};
use crate::apiserver::tls::ClientCa;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthenticationOptions {
    /// CA bundle that signs the front proxy's client certificate (kube-apiserver's --proxy-client-cert-file).
    /// X-Remote-* identity headers are believed only on connections presenting a certificate it verifies.
    /// Default: read (and followed) from the ConfigMap kube-system/extension-apiserver-authentication. The file is
    /// re-read when it changes.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// Common names allowed for the front proxy's client certificate (comma-separated; empty allows any).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,

    /// Headers carrying the user name, first match wins.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,

    /// Headers carrying the user's UID, first match wins (kube-apiserver 1.33+ sends X-Remote-Uid). Empty by default,
    /// as in k8s.io/apiserver; when set, it must name X-Remote-Uid.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_uid_headers: Vec<String>,

    /// Headers carrying the user's groups.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,

    /// Header prefixes carrying extra user attributes.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,

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
}

impl AuthenticationOptions {
    fn request_header(&self) -> anyhow::Result<Option<RequestHeader>> {
        let uid = &self.requestheader_uid_headers;
        if !uid.is_empty() && !uid.iter().any(|h| h.eq_ignore_ascii_case("X-Remote-Uid")) {
            anyhow::bail!(
                "--requestheader-uid-headers is set without specifying the standard X-Remote-Uid header - API \
                 aggregation will not work"
            );
        }
        let Some(path) = &self.requestheader_client_ca_file else { return Ok(None) };
        Ok(Some(
            RequestHeader::new(
                ClientCa::from_file(path)?,
                self.requestheader_allowed_names.clone(),
                &self.requestheader_username_headers,
                &self.requestheader_group_headers,
                &self.requestheader_extra_headers_prefix,
            )
            .with_uid_headers(uid),
        ))
    }

    /// The authenticator, with its trust anchors followed until `stop`; `kubeconfig` is the fallback for
    /// --authentication-kubeconfig.
    pub async fn build(
        &self,
        kubeconfig: Option<&Path>,
        insecure_allow_all: bool,
        stop: &CancellationToken,
    ) -> anyhow::Result<Authenticator> {
        let flags = Trust {
            request_header: self.request_header()?,
            client_ca: self.client_ca_file.as_deref().map(ClientCa::from_file).transpose()?,
        };
        let flags_fix_everything = flags.request_header.is_some() && flags.client_ca.is_some();
        let trust = Arc::new(DynamicTrust::default());
        let sources = TrustSources::new(trust.clone(), flags);
        delegation::follow_flag_files(
            sources.clone(),
            self.requestheader_client_ca_file.clone(),
            self.client_ca_file.clone(),
            Duration::from_secs(10),
            stop.clone(),
        );
        if insecure_allow_all {
            tracing::warn!(
                "--insecure-allow-all: EVERY REQUEST IS ALLOWED, AS AN ADMINISTRATOR. For local development and tests \
                 only."
            );
            trust.mark_loaded();
            return Ok(Authenticator { trust, tokens: None, insecure_allow_all: true });
        }
        let path = self.authentication_kubeconfig.as_deref().or(kubeconfig);
        let client = client_from(path, false).await?.ok_or_else(no_main_api_server)?;

        if self.authentication_skip_lookup || flags_fix_everything {
            trust.mark_loaded();
        } else {
            let first = delegation::follow_cluster_trust(client.clone(), sources, stop.clone());
            if let Err(e) = first.await {
                if !self.authentication_tolerate_lookup_failure {
                    anyhow::bail!(
                        "reading {}/{}: {e} (the server needs the RoleBinding to \
                         extension-apiserver-authentication-reader in deploy/base/rbac.yaml; \
                         --authentication-tolerate-lookup-failure starts anyway)",
                        delegation::CONFIGMAP_NAMESPACE,
                        delegation::CONFIGMAP_NAME
                    );
                }
                tracing::warn!(error = %e, "cannot read the authentication ConfigMap; continuing with the flags only");
            }
        }
        let ttl = self.authentication_token_webhook_cache_ttl;
        let tokens = TokenReviewer::new(
            client,
            CacheLimits { allowed_ttl: ttl, denied_ttl: ttl.min(Duration::from_secs(2)), capacity: 10_000 },
            Duration::from_secs(10),
        );
        Ok(Authenticator { trust, tokens: Some(tokens), insecure_allow_all: false })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        authentication: AuthenticationOptions,
    }

    fn request_header(args: &[&str]) -> anyhow::Result<Option<RequestHeader>> {
        let argv = std::iter::once("podset-apiserver").chain(args.iter().copied());
        Flags::try_parse_from(argv).unwrap().authentication.request_header()
    }

    #[test]
    fn uid_headers_must_name_x_remote_uid_as_k8s_io_apiserver_requires() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("front-proxy-ca.crt");
        std::fs::write(&ca, crate::apiserver::tls::make_ca("front-proxy-ca").unwrap().0).unwrap();
        let ca_flag = format!("--requestheader-client-ca-file={}", ca.display());

        let Err(e) = request_header(&[&ca_flag, "--requestheader-uid-headers=X-User-Id"]) else {
            panic!("a UID header list without X-Remote-Uid was taken")
        };
        assert_eq!(
            e.to_string(),
            "--requestheader-uid-headers is set without specifying the standard X-Remote-Uid header - API aggregation \
             will not work"
        );
        assert!(request_header(&["--requestheader-uid-headers=X-User-Id"]).is_err(), "refused without a CA file too");

        let rh = request_header(&[&ca_flag, "--requestheader-uid-headers=X-User-Id,x-remote-uid"]).unwrap().unwrap();
        assert_eq!(rh.uid_headers, ["x-user-id", "x-remote-uid"]);
        let rh = request_header(&[&ca_flag]).unwrap().unwrap();
        assert!(rh.uid_headers.is_empty(), "none unless configured, as upstream");
    }
}
