//! Secure serving: where to listen, the serving certificate, and how requests end.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;

use crate::apiserver::serving_cert::DynamicServingCert;
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

    /// Minimum TLS version: VersionTLS12 (default) or VersionTLS13, as k8s.io/apiserver names them.
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,

    /// TLS 1.2 cipher suites, comma-separated, with Go's names as k8s.io/apiserver takes them (e.g.
    /// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256). Default: rustls' (ECDHE with AES-GCM or ChaCha20-Poly1305). TLS
    /// 1.3's suites are always all offered, as in Go.
    #[arg(long, value_delimiter = ',', value_name = "SUITES")]
    pub tls_cipher_suites: Vec<String>,

    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 60)]
    pub watch_bookmark_interval: u64,

    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,

    /// The most concurrent HTTP/2 streams (requests, watches) one client connection may open; kube-apiserver's
    /// proxy carries every watch its clients hold on this server over few connections. Zero means 100, Go's
    /// client default, as in k8s.io/apiserver, whose aggregated servers default to 1000.
    #[arg(long, default_value_t = 1000)]
    pub http2_max_streams_per_connection: u32,

    /// To keep HTTP/2 clients (kube-apiserver's proxy among them) from sticking to one replica, send a GOAWAY after
    /// this share of their requests: the client's requests in flight go on, its next ones reconnect and likely land
    /// on another replica behind the Service. Watches never get one. 0 (off) to 0.02 (1 in 50); 0.001 is a good
    /// start. Leave it off with one replica, or without a Service spreading connections.
    #[arg(long, default_value_t = 0.0, value_parser = goaway_chance)]
    pub goaway_chance: f64,
}

fn goaway_chance(s: &str) -> Result<f64, String> {
    let chance: f64 = s.parse().map_err(|e| format!("{e}"))?;
    let max = crate::apiserver::filters::goaway::MAX_CHANCE;
    if !(0.0..=max).contains(&chance) {
        return Err(format!("--goaway-chance can not be less than 0 or greater than {max}"));
    }
    Ok(chance)
}

/// Where a Pod finds its namespace when the downward API does not say.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The names a client may use for the Services in front of this server in `namespace`: `podset-apiserver`, and
/// `podset-apiserver-v1beta1`, which v1beta1's APIService names (deploy/base/service.yaml).
pub(crate) fn service_names(namespace: &str) -> Vec<String> {
    ["podset-apiserver", "podset-apiserver-v1beta1"]
        .into_iter()
        .flat_map(|name| {
            let svc = format!("{name}.{namespace}");
            [format!("{svc}.svc"), format!("{svc}.svc.cluster.local"), svc, name.to_owned()]
        })
        .collect()
}

/// --service-namespace (`flag`), else the service account's namespace, else podset-system.
pub(crate) fn service_namespace(flag: Option<&str>) -> String {
    if let Some(ns) = flag.map(str::trim).filter(|ns| !ns.is_empty()) {
        return ns.to_owned();
    }
    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "podset-system".to_owned())
}

impl ServingOptions {
    pub fn namespace(&self) -> String {
        service_namespace(self.service_namespace.as_deref())
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(self.bind_address, self.secure_port)
    }

    pub fn bookmark_interval(&self) -> Duration {
        Duration::from_secs(self.watch_bookmark_interval.max(1))
    }

    pub fn http2_max_streams(&self) -> u32 {
        match self.http2_max_streams_per_connection {
            0 => 100,
            n => n,
        }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout)
    }

    /// The rustls configuration: the given certificate, else a self-signed one kept under --cert-dir (default
    /// `<data_dir>/certs`). Either way the files are followed: replaced files are served without a restart.
    pub fn tls_config(&self, data_dir: &Path) -> anyhow::Result<rustls::ServerConfig> {
        let params = tls::TlsParams::new(self.tls_min_version.as_deref(), &self.tls_cipher_suites)?;
        let (cert, key) = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(c), Some(k)) => (c.clone(), k.clone()),
            _ => {
                let dir = self.cert_dir.clone().unwrap_or_else(|| data_dir.join("certs"));
                let mut hosts = service_names(&self.namespace());
                hosts.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
                if !self.bind_address.is_unspecified() {
                    hosts.push(self.bind_address.to_string());
                }
                hosts.extend(self.tls_sans.iter().cloned());
                let s = crate::apiserver::self_signed::ensure_self_signed(&dir, &hosts)?;
                // The CA itself too: in a container without a shell, the log is where an admin can read it.
                let ca_bundle = std::fs::read(&s.ca)
                    .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem))
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", s.ca.display()))?;
                tracing::info!(ca = %s.ca.display(), cert = %s.cert.display(), %ca_bundle, "serving with a self-signed certificate; use this CA (ca_bundle) as the APIService caBundle");
                (s.cert, s.key)
            }
        };
        let serving = DynamicServingCert::load(&cert, &key)?;
        serving.spawn_reloader();
        Ok(tls::server_config(serving, &params)?)
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
                "podset-apiserver",
                "podset-apiserver-v1beta1.ops.svc",
                "podset-apiserver-v1beta1.ops.svc.cluster.local",
                "podset-apiserver-v1beta1.ops",
                "podset-apiserver-v1beta1"
            ]
        );
    }
}
