//! TLS: the serving certificate (given, or self-signed on first start), and client certificates, which are requested
//! but not required. A presented chain is checked after the handshake against the request-header CA, so a
//! connection knows whether its `X-Remote-*` headers may be believed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no usable {what}")]
    Pem { path: PathBuf, what: &'static str },
    #[error("{path}: the private key cannot be used: {source}")]
    Key { path: PathBuf, source: rustls::Error },
    #[error("{path}: the certificate cannot be used: {source}")]
    Cert { path: PathBuf, source: rustls::Error },
    #[error("{cert} and {key} do not belong together: the key is not the certificate's")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("{0}")]
    Options(String),
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA {path}: {source}")]
    Verifier { path: PathBuf, source: rustls::server::VerifierBuilderError },
}

/// The process-wide crypto provider (ring, as kube and rcgen use).
pub fn provider() -> Arc<CryptoProvider> {
    if let Some(p) = CryptoProvider::get_default() {
        return p.clone();
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })?;
    certs_from_pem(&pem, path)
}

/// Every certificate in `pem`, at least one; `origin` names where it came from, for errors.
fn certs_from_pem(pem: &[u8], origin: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::Pem { path: origin.into(), what: "certificate" });
    }
    Ok(certs)
}

pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::Pem { path: path.into(), what: "private key" })
}

/// A self-signed CA: its PEM, key and parameters (for signing).
pub fn make_ca(common_name: &str) -> Result<(String, KeyPair, CertificateParams), TlsError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key, params))
}

/// A serving certificate for `hosts` (DNS names or IP addresses), signed by `issuer`: (cert PEM, key PEM).
pub fn make_serving_cert(issuer: &Issuer<'_, &KeyPair>, hosts: &[String]) -> Result<(String, String), TlsError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, hosts.first().map(String::as_str).unwrap_or("podset-apiserver"));
    params.subject_alt_names = hosts
        .iter()
        .map(|h| match h.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => h.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Requests a client certificate and accepts any chain at handshake time, only checking that the peer holds the
/// key; which CA (if any) vouches for the chain is decided per connection afterwards.
#[derive(Debug)]
struct RequestClientCert {
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// `--tls-min-version` and `--tls-cipher-suites`, with k8s.io/apiserver's names, checked.
#[derive(Debug, Clone, Default)]
pub struct TlsParams {
    /// TLS 1.3 only (`VersionTLS13`); otherwise 1.2 and 1.3.
    pub tls13_only: bool,
    /// The TLS 1.2 suites to offer, in order; empty: rustls' defaults. TLS 1.3's are always all offered, as in Go.
    pub tls12_suites: Vec<rustls::SupportedCipherSuite>,
}

/// Go's names (crypto/tls, as k8s.io/component-base/cli/flag lists them) of the suites rustls offers.
const CIPHER_SUITES: &[(&str, rustls::CipherSuite)] = {
    use rustls::CipherSuite::*;
    &[
        ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
        ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
        ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
        ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
        ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
        ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
        ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
        ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ]
};

/// TLS 1.3's suites: Go (and so kube-apiserver) accepts their names and always offers them all; so do we.
const TLS13_SUITES: &[&str] = &["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"];

impl TlsParams {
    /// From the flags' values: `min_version` `VersionTLS12` or `VersionTLS13` (or unset), `cipher_suites` Go's names.
    pub fn new(min_version: Option<&str>, cipher_suites: &[String]) -> Result<Self, TlsError> {
        let tls13_only = match min_version {
            None | Some("VersionTLS12") => false,
            Some("VersionTLS13") => true,
            Some(v @ ("VersionTLS10" | "VersionTLS11")) => {
                return Err(TlsError::Options(format!(
                    "--tls-min-version={v}: TLS 1.0 and 1.1 are not offered by this server (rustls); use VersionTLS12 \
                     or VersionTLS13"
                )))
            }
            Some(v) => {
                return Err(TlsError::Options(format!(
                    "--tls-min-version={v:?}: not a TLS version; use VersionTLS12 or VersionTLS13"
                )))
            }
        };
        let available = provider().cipher_suites.clone();
        let mut tls12_suites: Vec<rustls::SupportedCipherSuite> = Vec::new();
        for name in cipher_suites.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if TLS13_SUITES.contains(&name) {
                continue;
            }
            let Some((_, id)) = CIPHER_SUITES.iter().find(|(n, _)| *n == name) else {
                let known: Vec<&str> =
                    CIPHER_SUITES.iter().map(|(n, _)| *n).chain(TLS13_SUITES.iter().copied()).collect();
                let why = if name.starts_with("TLS_")
                    && (name.contains("_CBC_")
                        || name.contains("_RC4_")
                        || name.contains("3DES")
                        || name.starts_with("TLS_RSA_"))
                {
                    "k8s.io/apiserver knows it, but this server (rustls) offers no CBC, RC4, 3DES or RSA key exchange suites"
                } else {
                    "not a cipher suite name"
                };
                return Err(TlsError::Options(format!(
                    "--tls-cipher-suites: {name}: {why}. Supported: {}",
                    known.join(", ")
                )));
            };
            let suite = available.iter().find(|s| s.suite() == *id).copied().ok_or_else(|| {
                TlsError::Options(format!("--tls-cipher-suites: {name} is not in this build's crypto provider"))
            })?;
            if !tls12_suites.iter().any(|s| s.suite() == suite.suite()) {
                tls12_suites.push(suite);
            }
        }
        if tls13_only && !tls12_suites.is_empty() {
            tracing::warn!(
                "--tls-cipher-suites names TLS 1.2 suites, but --tls-min-version=VersionTLS13 turns TLS 1.2 off"
            );
        }
        Ok(Self { tls13_only, tls12_suites })
    }

    fn provider(&self) -> Arc<CryptoProvider> {
        let base = provider();
        if self.tls12_suites.is_empty() {
            return base;
        }
        let mut p = (*base).clone();
        p.cipher_suites = base
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS13)
            .chain(self.tls12_suites.iter())
            .copied()
            .collect();
        Arc::new(p)
    }

    fn versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        if self.tls13_only {
            &TLS13_ONLY
        } else {
            rustls::DEFAULT_VERSIONS
        }
    }
}

/// The rustls server configuration: the serving certificate from `cert` (looked up per handshake, so that it can
/// be replaced), HTTP/2 and HTTP/1.1 by ALPN, client certificates requested.
pub fn server_config(cert: Arc<dyn ResolvesServerCert>, params: &TlsParams) -> Result<ServerConfig, TlsError> {
    let provider = params.provider();
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(params.versions())?
        .with_client_cert_verifier(Arc::new(RequestClientCert { provider }))
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Verifies client chains against one CA bundle.
#[derive(Clone)]
pub struct ClientCa {
    verifier: Arc<dyn ClientCertVerifier>,
}

/// Who a verified client certificate names: CN is the user, O the groups (as kube-apiserver reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// Unix seconds after which the certificate is no longer valid.
    pub not_after: i64,
}

impl ClientCa {
    pub fn from_file(path: &Path) -> Result<Self, TlsError> {
        let pem = std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })?;
        Self::from_pem(&pem, path)
    }

    /// `origin` names where the PEM came from, for errors.
    pub fn from_pem(pem: &[u8], origin: &Path) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in certs_from_pem(pem, origin)? {
            roots.add(cert).map_err(|_| TlsError::Pem { path: origin.into(), what: "CA certificate" })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|source| TlsError::Verifier { path: origin.into(), source })?;
        Ok(Self { verifier })
    }

    /// The subject of the client certificate, if the chain verifies against this CA now.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Option<Subject> {
        let (leaf, intermediates) = chain.split_first()?;
        self.verifier.verify_client_cert(leaf, intermediates, UnixTime::now()).ok()?;
        subject(leaf)
    }
}

/// The `hosts` the certificate in `path` does not name (all of them when it cannot be read).
pub fn subject(cert: &CertificateDer<'_>) -> Option<Subject> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed.subject();
    let common_name = name.iter_common_name().next()?.as_str().ok()?.to_owned();
    let organizations = name.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Some(Subject { common_name, organizations, not_after: parsed.validity().not_after.timestamp() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(min: Option<&str>, suites: &[&str]) -> Result<TlsParams, String> {
        TlsParams::new(min, &suites.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map_err(|e| e.to_string())
    }

    #[test]
    fn tls_flags_take_kubernetes_names() {
        let p = params(None, &[]).unwrap();
        assert!(!p.tls13_only && p.tls12_suites.is_empty());
        assert!(params(Some("VersionTLS13"), &[]).unwrap().tls13_only);
        assert!(!params(Some("VersionTLS12"), &[]).unwrap().tls13_only);
        let e = params(Some("VersionTLS11"), &[]).unwrap_err();
        assert!(e.contains("--tls-min-version=VersionTLS11: TLS 1.0 and 1.1 are not offered"), "{e}");
        assert!(params(Some("1.2"), &[]).unwrap_err().contains("not a TLS version"));

        let p = params(
            None,
            &[
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_GCM_SHA256",
            ],
        )
        .unwrap();
        let ids: Vec<_> = p.tls12_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(
            ids,
            [
                rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            ]
        );
        // TLS 1.3's suites stay, as in Go; only the named TLS 1.2 ones are added.
        let provider = p.provider();
        assert_eq!(provider.cipher_suites.len(), 3 + 2, "{:?}", provider.cipher_suites);

        let e = params(None, &["TLS_RSA_WITH_AES_128_CBC_SHA"]).unwrap_err();
        assert!(e.contains("TLS_RSA_WITH_AES_128_CBC_SHA: k8s.io/apiserver knows it, but this server"), "{e}");
        let e = params(None, &["AES"]).unwrap_err();
        assert!(e.contains("AES: not a cipher suite name. Supported: TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"), "{e}");
    }
}
