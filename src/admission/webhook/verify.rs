//! Trusting a webhook's serving certificate as kube-apiserver does (Go's `crypto/x509` `Certificate.Verify`), not
//! as webpki's stricter defaults would: a certificate that is itself in the `caBundle` is trusted as it stands,
//! even when it is a CA certificate (what `openssl req -x509` makes, and what countless set-up scripts hand out as
//! both the serving certificate and the `caBundle`). The checks run in Go's order — validity period, name, chain,
//! key usage — and their errors carry Go's wording, which is what admins search for.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A certificate Go would refuse, in Go's words (`x509: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct X509Error(pub String);

impl X509Error {
    fn into_rustls(self) -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(self))))
    }
}

/// Verifies a server's certificate chain against one `caBundle` (or the system's roots) as Go does.
#[derive(Debug)]
pub struct GoVerifier {
    /// The bundle's own certificates: one of them presented as the server's is trusted as it stands.
    bundle: Vec<CertificateDer<'static>>,
    /// Chains through the bundle (or the system's roots), and the handshake's signatures, as webpki checks them.
    chains: Arc<WebPkiServerVerifier>,
}

impl GoVerifier {
    /// `bundle` lists the certificates of a `caBundle` (empty when `roots` are the system's).
    pub fn new(
        roots: Arc<RootCertStore>,
        bundle: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, rustls::client::VerifierBuilderError> {
        let chains = WebPkiServerVerifier::builder_with_provider(roots, provider).build()?;
        Ok(Self { bundle, chains })
    }

    /// Whether a certificate of the bundle issued `leaf` and its signature says so.
    fn signed_by_bundle(&self, leaf: &X509Certificate<'_>) -> bool {
        self.bundle.iter().any(|der| {
            X509Certificate::from_der(der).is_ok_and(|(_, ca)| {
                ca.subject() == leaf.issuer() && leaf.verify_signature(Some(ca.public_key())).is_ok()
            })
        })
    }
}

fn is_ca_as_leaf(e: &rustls::Error) -> bool {
    matches!(e, rustls::Error::InvalidCertificate(CertificateError::Other(o))
        if matches!(o.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity)))
}

const UNKNOWN_AUTHORITY: &str = "x509: certificate signed by unknown authority";
const INCOMPATIBLE_USAGE: &str = "x509: certificate specifies an incompatible key usage";

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let (_, leaf) = X509Certificate::from_der(end_entity)
            .map_err(|e| X509Error(format!("x509: malformed certificate: {e}")).into_rustls())?;
        check_validity(&leaf, now).map_err(X509Error::into_rustls)?;
        check_name(end_entity, &leaf, server_name).map_err(X509Error::into_rustls)?;
        // Go: `if opts.Roots.contains(c) { candidateChains = [][]*Certificate{{c}} }`.
        let in_bundle = self.bundle.iter().any(|c| c.as_ref() == end_entity.as_ref());
        if !in_bundle {
            match self.chains.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
                Ok(_) => {}
                // webpki refuses a CA certificate as a leaf; Go does not: one signed by a bundle certificate holds.
                Err(e) if is_ca_as_leaf(&e) && self.signed_by_bundle(&leaf) => {}
                Err(e) if is_ca_as_leaf(&e) => return Err(X509Error(UNKNOWN_AUTHORITY.into()).into_rustls()),
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer | CertificateError::BadSignature,
                )) => return Err(X509Error(UNKNOWN_AUTHORITY.into()).into_rustls()),
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
                )) => return Err(X509Error(INCOMPATIBLE_USAGE.into()).into_rustls()),
                Err(other) => return Err(other),
            }
        }
        check_key_usage(&leaf).map_err(X509Error::into_rustls)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chains.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chains.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chains.supported_verify_schemes()
    }
}

/// Go's `isValid` for the leaf: `now` within `[NotBefore, NotAfter]`.
fn check_validity(leaf: &X509Certificate<'_>, now: UnixTime) -> Result<(), X509Error> {
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = leaf.validity();
    let (from, to) = (validity.not_before.timestamp(), validity.not_after.timestamp());
    let expired = |relation: &str, bound: i64| {
        X509Error(format!(
            "x509: certificate has expired or is not yet valid: current time {} is {relation} {}",
            rfc3339(now),
            rfc3339(bound)
        ))
    };
    if now < from {
        return Err(expired("before", from));
    }
    if now > to {
        return Err(expired("after", to));
    }
    Ok(())
}

fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| secs.to_string())
}

/// Go's `VerifyHostname`: names only from the subject alternative names (never the Common Name, since Go 1.17),
/// with Go's `HostnameError` wording when none matches.
fn check_name(
    der: &CertificateDer<'_>,
    leaf: &X509Certificate<'_>,
    server_name: &ServerName<'_>,
) -> Result<(), X509Error> {
    let parsed =
        webpki::EndEntityCert::try_from(der).map_err(|e| X509Error(format!("x509: malformed certificate: {e:?}")))?;
    if parsed.verify_is_valid_for_subject_name(server_name).is_ok() {
        return Ok(());
    }
    let host = match server_name {
        ServerName::DnsName(d) => d.as_ref().to_owned(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        _ => String::new(),
    };
    Err(X509Error(hostname_error(leaf, &host, matches!(server_name, ServerName::IpAddress(_)))))
}

/// A certificate's subject alternative names: its DNS names and its IP addresses (as text); `None` without the
/// extension.
pub fn san_names(leaf: &X509Certificate<'_>) -> Option<(Vec<String>, Vec<String>)> {
    let sans = leaf.subject_alternative_name().ok().flatten()?;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for name in &sans.value.general_names {
        match name {
            GeneralName::DNSName(d) => dns.push((*d).to_owned()),
            GeneralName::IPAddress(bytes) => ips.push(ip_string(bytes)),
            _ => {}
        }
    }
    Some((dns, ips))
}

/// Go's `HostnameError.Error()`.
fn hostname_error(leaf: &X509Certificate<'_>, host: &str, is_ip: bool) -> String {
    let sans = san_names(leaf);
    if sans.is_none() {
        let cn = leaf.subject().iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or_default();
        if !is_ip && match_hostnames(cn, host) {
            return "x509: certificate relies on legacy Common Name field, use SANs instead".into();
        }
    }
    let (dns, ips) = sans.unwrap_or_default();
    let valid = if is_ip {
        if ips.is_empty() {
            return format!("x509: cannot validate certificate for {host} because it doesn't contain any IP SANs");
        }
        ips.join(", ")
    } else {
        dns.join(", ")
    };
    if valid.is_empty() {
        return format!("x509: certificate is not valid for any names, but wanted to match {host}");
    }
    format!("x509: certificate is valid for {valid}, not {host}")
}

fn ip_string(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).unwrap_or_default()).to_string(),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap_or_default()).to_string(),
        _ => format!("{bytes:?}"),
    }
}

/// Go's `matchHostnames`: case-insensitive, a `*` only as the whole leftmost label.
fn match_hostnames(pattern: &str, host: &str) -> bool {
    let (pattern, host) =
        (pattern.trim_end_matches('.').to_ascii_lowercase(), host.trim_end_matches('.').to_ascii_lowercase());
    if pattern.is_empty() || host.is_empty() {
        return false;
    }
    let (p, h): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), host.split('.').collect());
    p.len() == h.len() && p.iter().zip(&h).enumerate().all(|(i, (p, h))| (i == 0 && *p == "*") || p == h)
}

/// Go's default `KeyUsages` for a TLS client: the leaf, if it names extended key usages, must allow serverAuth.
fn check_key_usage(leaf: &X509Certificate<'_>) -> Result<(), X509Error> {
    match leaf.extended_key_usage() {
        Ok(Some(eku)) if !(eku.value.server_auth || eku.value.any) => Err(X509Error(INCOMPATIBLE_USAGE.into())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        SanType,
    };
    use std::net::{IpAddr, Ipv4Addr};

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 250, 0, 12));

    fn params(cn: &str, sans: Vec<SanType>, ca: bool) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.subject_alt_names = sans;
        if ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        }
        p
    }

    fn verifier(bundle: &[&rcgen::Certificate]) -> GoVerifier {
        let mut roots = RootCertStore::empty();
        let ders: Vec<CertificateDer<'static>> = bundle.iter().map(|c| c.der().clone()).collect();
        for d in &ders {
            roots.add(d.clone()).unwrap();
        }
        GoVerifier::new(Arc::new(roots), ders, Arc::new(rustls::crypto::ring::default_provider())).unwrap()
    }

    fn verify(
        v: &GoVerifier,
        leaf: &rcgen::Certificate,
        chain: &[&rcgen::Certificate],
        name: &str,
    ) -> Result<(), String> {
        let intermediates: Vec<CertificateDer<'static>> = chain.iter().map(|c| c.der().clone()).collect();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        v.verify_server_cert(leaf.der(), &intermediates, &name, &[], UnixTime::now()).map(|_| ()).map_err(|e| match e {
            rustls::Error::InvalidCertificate(CertificateError::Other(o)) => o.0.to_string(),
            other => format!("{other:?}"),
        })
    }

    fn ip_san() -> Vec<SanType> {
        vec![SanType::IpAddress(IP)]
    }

    #[test]
    fn a_self_signed_ca_certificate_in_the_bundle_is_trusted_as_go_trusts_it() {
        let key = KeyPair::generate().unwrap();
        let cert = params("hook", ip_san(), true).self_signed(&key).unwrap();
        let v = verifier(&[&cert]);
        assert_eq!(verify(&v, &cert, &[], "10.250.0.12"), Ok(()));
        assert_eq!(
            verify(&v, &cert, &[], "10.250.0.13"),
            Err("x509: certificate is valid for 10.250.0.12, not 10.250.0.13".into()),
            "its names are still checked"
        );
        let other = params("other", ip_san(), true).self_signed(&KeyPair::generate().unwrap()).unwrap();
        assert_eq!(
            verify(&verifier(&[&other]), &cert, &[], "10.250.0.12"),
            Err("x509: certificate signed by unknown authority".into()),
            "a self-signed certificate not in the bundle is not trusted"
        );
    }

    #[test]
    fn chains_from_the_bundle_are_trusted_and_everything_else_refused_in_gos_words() {
        let ca_key = KeyPair::generate().unwrap();
        let ca_params = params("root", vec![], true);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let root = Issuer::new(ca_params, &ca_key);
        let v = verifier(&[&ca]);

        let leaf = params("hook", ip_san(), false).signed_by(&KeyPair::generate().unwrap(), &root).unwrap();
        assert_eq!(verify(&v, &leaf, &[], "10.250.0.12"), Ok(()));

        let mid_key = KeyPair::generate().unwrap();
        let mid_params = params("intermediate", vec![], true);
        let mid = mid_params.signed_by(&mid_key, &root).unwrap();
        let mid_issuer = Issuer::new(mid_params, &mid_key);
        let deep = params("hook", ip_san(), false).signed_by(&KeyPair::generate().unwrap(), &mid_issuer).unwrap();
        assert_eq!(verify(&v, &deep, &[&mid], "10.250.0.12"), Ok(()));
        assert_eq!(
            verify(&v, &deep, &[], "10.250.0.12"),
            Err("x509: certificate signed by unknown authority".into()),
            "without its intermediate"
        );

        let mut old = params("hook", ip_san(), false);
        old.not_before = rcgen::date_time_ymd(2020, 1, 1);
        old.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let expired = old.signed_by(&KeyPair::generate().unwrap(), &root).unwrap();
        let err = verify(&v, &expired, &[], "10.250.0.12").unwrap_err();
        assert!(
            err.starts_with("x509: certificate has expired or is not yet valid: current time ")
                && err.ends_with(" is after 2021-01-01T00:00:00Z"),
            "{err}"
        );

        let dns = params("hook", vec![SanType::DnsName("hook.policy.svc".try_into().unwrap())], false)
            .signed_by(&KeyPair::generate().unwrap(), &root)
            .unwrap();
        assert_eq!(verify(&v, &dns, &[], "hook.policy.svc"), Ok(()));
        assert_eq!(
            verify(&v, &dns, &[], "10.250.0.12"),
            Err("x509: cannot validate certificate for 10.250.0.12 because it doesn't contain any IP SANs".into())
        );
        assert_eq!(
            verify(&v, &dns, &[], "other.policy.svc"),
            Err("x509: certificate is valid for hook.policy.svc, not other.policy.svc".into())
        );

        let cn_only = params("hook.policy.svc", vec![], false).signed_by(&KeyPair::generate().unwrap(), &root).unwrap();
        assert_eq!(
            verify(&v, &cn_only, &[], "hook.policy.svc"),
            Err("x509: certificate relies on legacy Common Name field, use SANs instead".into())
        );

        let mut client_only = params("hook", ip_san(), false);
        client_only.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_only = client_only.signed_by(&KeyPair::generate().unwrap(), &root).unwrap();
        assert_eq!(verify(&v, &client_only, &[], "10.250.0.12"), Err(INCOMPATIBLE_USAGE.into()));

        let ca_leaf = params("hook", ip_san(), true).signed_by(&KeyPair::generate().unwrap(), &root).unwrap();
        assert_eq!(verify(&v, &ca_leaf, &[], "10.250.0.12"), Ok(()), "Go takes a CA certificate as a leaf");
    }

    #[test]
    fn hostnames_match_as_go_matches_them() {
        assert!(match_hostnames("*.policy.svc", "hook.policy.svc"));
        assert!(match_hostnames("Hook.Policy.svc.", "hook.policy.svc"));
        assert!(!match_hostnames("*.svc", "hook.policy.svc"));
        assert!(!match_hostnames("", "hook"));
    }
}
