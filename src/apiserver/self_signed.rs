//! The self-signed CA and serving certificate the server makes on first start when it is given none, kept under
//! `--cert-dir`, and their rotation. The CA's key is kept beside it (mode 0600), so a serving certificate that
//! lacks a name (a Service added by a newer build) is issued again by the same CA: a CA pinned in the APIServices
//! stays valid. Rotating the CA is two steps, so that kube-apiserver never meets a certificate it does not trust:
//! `stage` makes the next CA under `next/` and gives the bundle to pin meanwhile (current and next), `finish`
//! serves a certificate of the next CA and makes it the current one.

use std::path::{Path, PathBuf};

use rcgen::{Issuer, KeyPair};

use super::tls::{make_ca, make_serving_cert, read_certs, TlsError};

/// The files under the certificate directory.
pub struct SelfSigned {
    pub ca: PathBuf,
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The next CA while a rotation is staged.
    next: PathBuf,
}

impl SelfSigned {
    pub fn at(dir: &Path) -> Self {
        Self {
            ca: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            next: dir.join("next"),
        }
    }

    fn next_ca(&self) -> (PathBuf, PathBuf) {
        (self.next.join("ca.crt"), self.next.join("ca.key"))
    }

    fn serving_exists(&self) -> bool {
        self.ca.exists() && self.cert.exists() && self.key.exists()
    }
}

/// Makes (once) a CA and a serving certificate signed by it for `hosts`, under `dir`, and reuses them after. One
/// made for fewer hosts is issued again for all of them by the same CA when its key is here; a CA made by a build
/// that did not keep its key cannot sign another, so the certificate is kept (the CA may be pinned) and the
/// missing names are logged, with the way out: a rotation.
pub fn ensure_self_signed(dir: &Path, hosts: &[String]) -> Result<SelfSigned, TlsError> {
    let files = SelfSigned::at(dir);
    if files.serving_exists() {
        let held = names(&files.cert);
        let missing: Vec<&String> = hosts.iter().filter(|h| !held.contains(h)).collect();
        if missing.is_empty() {
            return Ok(files);
        }
        if files.ca_key.exists() {
            let all = union(held.clone(), hosts);
            issue(&files, &files.ca, &files.ca_key, &all)?;
            tracing::info!(certificate = %files.cert.display(), ?missing, "the self-signed serving certificate lacked these names: issued again by the same CA");
        } else {
            tracing::warn!(
                certificate = %files.cert.display(),
                ?missing,
                "the self-signed serving certificate does not name these hosts, and its CA's key was not kept (an \
                 older build made it): an APIService that verifies it through one of them fails; rotate the CA \
                 (`podset-apiserver rotate-ca`, docs/operate.md) or use a certificate of your own (--tls-cert-file)"
            );
        }
        return Ok(files);
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.into(), source })?;
    let (ca_pem, ca_key) = new_ca()?;
    write_key(&files.ca_key, &ca_key.serialize_pem())?;
    write(&files.ca, &ca_pem)?;
    issue(&files, &files.ca, &files.ca_key, hosts)?;
    Ok(files)
}

/// The first step of a rotation: the next CA under `next/` (made once; staging again returns the same), and the
/// bundle kube-apiserver should trust until `finish`: the current CA and the next one, PEM.
pub fn stage_rotation(dir: &Path) -> Result<String, TlsError> {
    let files = SelfSigned::at(dir);
    let current =
        std::fs::read_to_string(&files.ca).map_err(|source| TlsError::Read { path: files.ca.clone(), source })?;
    let next = staged_or_new(&files)?;
    Ok(format!("{}\n{}", current.trim_end(), next.trim_end()) + "\n")
}

/// The second step: a serving certificate issued by the staged CA (made now if none was staged) for the names the
/// current one has and `hosts`, served from the next reload of the files (about a second later), and that CA made
/// the current one. Returns the new CA, PEM: the one bundle to trust from now on.
pub fn finish_rotation(dir: &Path, hosts: &[String]) -> Result<String, TlsError> {
    let files = SelfSigned::at(dir);
    if !files.serving_exists() {
        return Err(TlsError::Options(format!(
            "{}: no self-signed CA and certificate to rotate (the server makes them on its first start)",
            dir.display()
        )));
    }
    let ca_pem = staged_or_new(&files)?;
    let (next_ca, next_key) = files.next_ca();
    let all = union(names(&files.cert), hosts);
    // In this order, a rotation cut short is finished by running it again: `next/` goes last.
    issue(&files, &next_ca, &next_key, &all)?;
    replace(&next_key, &files.ca_key)?;
    replace(&next_ca, &files.ca)?;
    std::fs::remove_dir_all(&files.next).map_err(|source| TlsError::Write { path: files.next.clone(), source })?;
    Ok(ca_pem)
}

fn staged_or_new(files: &SelfSigned) -> Result<String, TlsError> {
    let (ca, key) = files.next_ca();
    if ca.exists() && key.exists() {
        return std::fs::read_to_string(&ca).map_err(|source| TlsError::Read { path: ca, source });
    }
    std::fs::create_dir_all(&files.next).map_err(|source| TlsError::Write { path: files.next.clone(), source })?;
    let (pem, ca_key) = new_ca()?;
    write_key(&key, &ca_key.serialize_pem())?;
    write(&ca, &pem)?;
    Ok(pem)
}

fn new_ca() -> Result<(String, KeyPair), TlsError> {
    let (pem, key, _) = make_ca("podset-apiserver-ca")?;
    Ok((pem, key))
}

/// A serving certificate and key for `hosts` by the CA in `ca`/`ca_key`, each file replaced whole.
fn issue(files: &SelfSigned, ca: &Path, ca_key: &Path, hosts: &[String]) -> Result<(), TlsError> {
    let read =
        |path: &Path| std::fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.into(), source });
    let key = KeyPair::from_pem(&read(ca_key)?)?;
    let issuer = Issuer::from_ca_cert_pem(&read(ca)?, &key)?;
    let (cert_pem, key_pem) = make_serving_cert(&issuer, hosts)?;
    // The key first: the reloader skips a pair that does not match and takes the next state of the files.
    write_key(&files.key, &key_pem)?;
    write(&files.cert, &cert_pem)
}

/// Names a certificate holds (DNS names and IP addresses); none if it cannot be read.
fn names(cert: &Path) -> Vec<String> {
    read_certs(cert)
        .ok()
        .and_then(|certs| {
            let (_, parsed) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
            let (dns, ips) = crate::admission::webhook::san_names(&parsed)?;
            Some(dns.into_iter().chain(ips).collect())
        })
        .unwrap_or_default()
}

/// `hosts` after the names already held, in their order (the first names the certificate), without repeats.
fn union(mut held: Vec<String>, hosts: &[String]) -> Vec<String> {
    for h in hosts {
        if !held.contains(h) {
            held.push(h.clone());
        }
    }
    if held.is_empty() {
        held.push("podset-apiserver".to_owned());
    }
    held
}

/// Written beside and renamed into place: a reader sees the old file or the new one, never half of one.
fn write(path: &Path, contents: &str) -> Result<(), TlsError> {
    write_mode(path, contents, 0o644)
}

/// A private key: written as `write` does, readable by its owner alone from the start.
fn write_key(path: &Path, pem: &str) -> Result<(), TlsError> {
    write_mode(path, pem, 0o600)
}

fn write_mode(path: &Path, contents: &str, mode: u32) -> Result<(), TlsError> {
    use std::io::Write as _;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    // Left by a write cut short, it would keep its mode: made anew.
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(mode);
    #[cfg(not(unix))]
    let _ = mode;
    let written = options.open(&tmp).and_then(|mut f| f.write_all(contents.as_bytes()));
    written.map_err(|source| TlsError::Write { path: tmp.clone(), source })?;
    replace(&tmp, path)
}

fn replace(from: &Path, to: &Path) -> Result<(), TlsError> {
    std::fs::rename(from, to).map_err(|source| TlsError::Write { path: to.into(), source })
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| h.to_string()).collect()
    }

    /// Whether the serving certificate in `files` chains to one of the CAs in `bundle` for `host`.
    fn trusted(files: &SelfSigned, bundle: &str, host: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            crate::apiserver::tls::provider(),
        )
        .build()
        .unwrap();
        let cert = read_certs(&files.cert).unwrap().remove(0);
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
        verifier.verify_server_cert(&cert, &[], &name, &[], rustls::pki_types::UnixTime::now()).is_ok()
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    fn missing_names(cert: &Path, hosts: &[String]) -> Vec<String> {
        let named = names(cert);
        hosts.iter().filter(|h| !named.contains(h)).cloned().collect()
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_certificate_lacking_a_name_is_issued_again_by_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let old = hosts(&["podset-apiserver.ns.svc", "10.0.0.1"]);
        let made = ensure_self_signed(dir.path(), &old).unwrap();
        let (ca, cert) = (read(&made.ca), read(&made.cert));
        assert!(trusted(&made, &ca, "podset-apiserver.ns.svc"));
        #[cfg(unix)]
        assert_eq!((mode(&made.ca_key), mode(&made.key)), (0o600, 0o600), "the keys are the owner's alone");
        let again = ensure_self_signed(dir.path(), &old).unwrap();
        assert_eq!(read(&again.cert), cert, "nothing lacking: kept");

        let new = [old.clone(), hosts(&["podset-apiserver-v1beta1.ns.svc"])].concat();
        let reissued = ensure_self_signed(dir.path(), &new).unwrap();
        assert_ne!(read(&reissued.cert), cert);
        assert_eq!(read(&reissued.ca), ca, "the pinned CA stays valid");
        assert!(trusted(&reissued, &ca, "podset-apiserver-v1beta1.ns.svc"));
        assert!(trusted(&reissued, &ca, "podset-apiserver.ns.svc"));
        assert_eq!(missing_names(&reissued.cert, &new), Vec::<String>::new());
    }

    #[test]
    fn without_the_ca_key_a_certificate_lacking_a_name_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let old = hosts(&["podset-apiserver.ns.svc"]);
        let made = ensure_self_signed(dir.path(), &old).unwrap();
        std::fs::remove_file(&made.ca_key).unwrap(); // as an older build left it
        let cert = read(&made.cert);
        let new = hosts(&["podset-apiserver.ns.svc", "podset-apiserver-v1beta1.ns.svc"]);
        let kept = ensure_self_signed(dir.path(), &new).unwrap();
        assert_eq!(read(&kept.cert), cert, "kept: its CA may be pinned");
        assert_eq!(missing_names(&kept.cert, &new), ["podset-apiserver-v1beta1.ns.svc"]);
        assert_eq!(missing_names(&dir.path().join("none.crt"), &old), old, "unreadable: none named");
    }

    #[test]
    fn a_rotation_is_trusted_at_every_step() {
        let dir = tempfile::tempdir().unwrap();
        let made = ensure_self_signed(dir.path(), &hosts(&["podset-apiserver.ns.svc"])).unwrap();
        let old_ca = read(&made.ca);
        std::fs::remove_file(&made.ca_key).unwrap(); // the key is not needed to rotate

        let bundle = stage_rotation(dir.path()).unwrap();
        assert_eq!(stage_rotation(dir.path()).unwrap(), bundle, "staging again changes nothing");
        assert!(bundle.starts_with(&old_ca));
        assert_eq!(CertificateDer::pem_slice_iter(bundle.as_bytes()).count(), 2);
        assert!(trusted(&made, &bundle, "podset-apiserver.ns.svc"), "the bundle trusts what is served now");
        assert_eq!(read(&made.ca), old_ca, "staging serves nothing new");

        let new_ca = finish_rotation(dir.path(), &hosts(&["podset-apiserver-v1beta1.ns.svc"])).unwrap();
        assert!(bundle.ends_with(&new_ca), "the staged CA is the one made current");
        assert_eq!(read(&made.ca), new_ca);
        for host in ["podset-apiserver.ns.svc", "podset-apiserver-v1beta1.ns.svc"] {
            assert!(trusted(&made, &bundle, host), "the bundle trusts what is served after: {host}");
            assert!(trusted(&made, &new_ca, host), "the new CA alone does: {host}");
            assert!(!trusted(&made, &old_ca, host), "the old one no longer does: {host}");
        }
        assert!(!dir.path().join("next").exists());
        #[cfg(unix)]
        assert_eq!(mode(&made.ca_key), 0o600, "the new CA's key is the owner's alone");
        // The new CA's key is kept: a later missing name is issued by it.
        let all = hosts(&["podset-apiserver.ns.svc", "podset-apiserver-v1beta1.ns.svc", "extra.example"]);
        let reissued = ensure_self_signed(dir.path(), &all).unwrap();
        assert!(trusted(&reissued, &new_ca, "extra.example"));
    }

    #[test]
    fn finishing_unstaged_rotates_in_one_step() {
        let dir = tempfile::tempdir().unwrap();
        let e = finish_rotation(dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("no self-signed CA"), "{e}");
        let made = ensure_self_signed(dir.path(), &hosts(&["podset-apiserver.ns.svc"])).unwrap();
        let old_ca = read(&made.ca);
        let new_ca = finish_rotation(dir.path(), &[]).unwrap();
        assert_ne!(new_ca, old_ca);
        assert!(trusted(&made, &new_ca, "podset-apiserver.ns.svc"));
    }

    #[test]
    fn staging_without_a_ca_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = stage_rotation(dir.path()).unwrap_err().to_string();
        assert!(e.contains("ca.crt"), "{e}");
    }
}
