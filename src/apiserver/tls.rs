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
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no usable {what}")]
    Pem { path: PathBuf, what: &'static str },
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

fn write(path: &Path, contents: &str) -> Result<(), TlsError> {
    std::fs::write(path, contents).map_err(|source| TlsError::Write { path: path.into(), source })
}

/// Where a self-signed serving certificate lives under the data directory.
pub struct SelfSigned {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Makes (once) a CA and a serving certificate signed by it for `hosts`, under `dir`. Reuses them if present.
pub fn ensure_self_signed(dir: &Path, hosts: &[String]) -> Result<SelfSigned, TlsError> {
    let out = SelfSigned { ca: dir.join("ca.crt"), cert: dir.join("tls.crt"), key: dir.join("tls.key") };
    if out.ca.exists() && out.cert.exists() && out.key.exists() {
        return Ok(out);
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.into(), source })?;
    let (ca_pem, ca_key, ca_params) = make_ca("podset-apiserver-ca")?;
    let issuer = Issuer::new(ca_params, &ca_key);
    let (cert_pem, key_pem) = make_serving_cert(&issuer, hosts)?;
    write(&out.ca, &ca_pem)?;
    write(&out.cert, &cert_pem)?;
    write(&out.key, &key_pem)?;
    restrict(&out.key);
    Ok(out)
}

#[cfg(unix)]
fn restrict(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

#[cfg(not(unix))]
fn restrict(_: &Path) {}

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

/// The rustls server configuration: HTTP/2 and HTTP/1.1 by ALPN, client certificates requested.
pub fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(RequestClientCert { provider }))
        .with_single_cert(certs, key)?;
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

pub fn subject(cert: &CertificateDer<'_>) -> Option<Subject> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed.subject();
    let common_name = name.iter_common_name().next()?.as_str().ok()?.to_owned();
    let organizations = name.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Some(Subject { common_name, organizations, not_after: parsed.validity().not_after.timestamp() })
}
