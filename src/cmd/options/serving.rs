//! Secure serving: where to listen, the serving certificate, and how requests end.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;

use crate::apiserver::tls;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Secure serving")]
pub struct ServingOptions {
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

    /// Namespace of the Service in front of this server: the self-signed certificate is made for
    /// podset-apiserver.<namespace>.svc. Default: the Pod's own (from POD_NAMESPACE, which deploy/ sets from the
    /// downward API, or the service account's namespace file), else podset-system.
    #[arg(long, env = "POD_NAMESPACE")]
    pub service_namespace: Option<String>,

    /// Extra host names or IPs for the self-signed serving certificate (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub tls_sans: Vec<String>,

    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 60)]
    pub watch_bookmark_interval: u64,

    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
}

/// Where a Pod finds its namespace when the downward API does not say.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The names a client may use for the Service `podset-apiserver` in `namespace`.
fn service_names(namespace: &str) -> Vec<String> {
    let svc = format!("podset-apiserver.{namespace}");
    vec![format!("{svc}.svc"), format!("{svc}.svc.cluster.local"), svc, "podset-apiserver".to_owned()]
}

impl ServingOptions {
    /// --service-namespace, else the service account's namespace, else podset-system.
    pub fn namespace(&self) -> String {
        if let Some(ns) = self.service_namespace.as_deref().map(str::trim).filter(|ns| !ns.is_empty()) {
            return ns.to_owned();
        }
        std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
            .ok()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "podset-system".to_owned())
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(self.bind_address, self.secure_port)
    }

    pub fn bookmark_interval(&self) -> Duration {
        Duration::from_secs(self.watch_bookmark_interval.max(1))
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout)
    }

    /// The rustls configuration: the given certificate, else a self-signed one kept under --cert-dir (default
    /// `<data_dir>/certs`).
    pub fn tls_config(&self, data_dir: &Path) -> anyhow::Result<rustls::ServerConfig> {
        let (certs, key) = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(c), Some(k)) => (tls::read_certs(c)?, tls::read_key(k)?),
            _ => {
                let dir = self.cert_dir.clone().unwrap_or_else(|| data_dir.join("certs"));
                let mut hosts = service_names(&self.namespace());
                hosts.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
                if !self.bind_address.is_unspecified() {
                    hosts.push(self.bind_address.to_string());
                }
                hosts.extend(self.tls_sans.iter().cloned());
                let s = tls::ensure_self_signed(&dir, &hosts)?;
                // The CA itself too: in a container without a shell, the log is where an admin can read it.
                let ca_bundle = std::fs::read(&s.ca)
                    .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem))
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", s.ca.display()))?;
                tracing::info!(ca = %s.ca.display(), cert = %s.cert.display(), %ca_bundle, "serving with a self-signed certificate; use this CA (ca_bundle) as the APIService caBundle");
                (tls::read_certs(&s.cert)?, tls::read_key(&s.key)?)
            }
        };
        Ok(tls::server_config(certs, key)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn self_signed_names_follow_the_namespace() {
        let opts = crate::cmd::Options::try_parse_from(["podset-apiserver", "--service-namespace=ops"]).unwrap();
        assert_eq!(opts.serving.namespace(), "ops");
        assert_eq!(
            service_names(&opts.serving.namespace()),
            [
                "podset-apiserver.ops.svc",
                "podset-apiserver.ops.svc.cluster.local",
                "podset-apiserver.ops",
                "podset-apiserver"
            ]
        );
    }
}
