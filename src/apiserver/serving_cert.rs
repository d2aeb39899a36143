//! The serving certificate, followed on disk, as k8s.io/apiserver's `dynamiccertificates.DynamicCertKeyPairContent`
//! does for `--tls-cert-file` / `--tls-private-key-file`: when either file changes, the pair is read again and new
//! TLS connections get it, with no restart (open connections keep theirs). A pair that does not load (half written,
//! a key that does not match, not PEM) is logged with the file and the reason, and the current one stays.
//!
//! k8s.io/apiserver uses fsnotify and a one-minute resync; here the two files' metadata is polled once a second
//! (two `stat` calls), which also sees the kubelet's atomic symlink swap of a Secret volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::tls::{self, TlsError};

/// How often the files are looked at.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What the files looked like when last read: a change in any of these means "read again".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    files: [Option<(u64, u64, SystemTime, u64)>; 2],
}

/// The serving certificate and key, loaded from `cert` and `key`, reloaded when they change.
#[derive(Debug)]
pub struct DynamicServingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    stamp: RwLock<Stamp>,
}

impl DynamicServingCert {
    /// Loads the pair; an error here stops the server from starting.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let stamp = stamp(cert, key);
        let current = load_pair(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(current)),
            stamp: RwLock::new(stamp),
        }))
    }

    /// Reads the pair again if either file changed since the last look. `Ok(true)`: a new certificate is served.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamp(&self.cert, &self.key);
        if *self.stamp.read() == now {
            return Ok(false);
        }
        // Whatever the outcome, this state of the files has been tried: a broken pair is reported once, and read
        // again when one of the files changes once more.
        *self.stamp.write() = now;
        let pair = load_pair(&self.cert, &self.key)?;
        if pair.cert == self.current.read().cert {
            return Ok(false);
        }
        *self.current.write() = Arc::new(pair);
        Ok(true)
    }

    /// Polls the files until the runtime ends, logging each reload and each pair that does not load.
    pub fn spawn_reloader(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else { return };
                let cert = this.cert.clone();
                let key = this.key.clone();
                let outcome = tokio::task::spawn_blocking(move || {
                    let reloaded = this.reload_if_changed();
                    reloaded.map(|r| (r, this))
                })
                .await;
                match outcome {
                    Ok(Ok((true, this))) => {
                        let leaf = this.current.read().cert[0].clone();
                        let subject = tls::subject(&leaf).map(|s| s.common_name).unwrap_or_default();
                        tracing::info!(cert = %cert.display(), key = %key.display(), %subject, "serving certificate reloaded: new connections get it");
                    }
                    Ok(Ok((false, _))) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, cert = %cert.display(), key = %key.display(), "the serving certificate files changed but do not load; still serving the previous certificate");
                    }
                    Err(_) => return,
                }
            }
        });
    }
}

impl ResolvesServerCert for DynamicServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// The pair, checked as kube's `tls.X509KeyPair`: a certificate chain, a key rustls can sign with, and the key
/// belonging to the first certificate.
fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = tls::read_certs(cert)?;
    let private = tls::read_key(key)?;
    let provider = tls::provider();
    let signing =
        provider.key_provider.load_private_key(private).map_err(|source| TlsError::Key { path: key.into(), source })?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(pair),
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::Mismatch { cert: cert.into(), key: key.into() }),
        Err(source) => Err(TlsError::Cert { path: cert.into(), source }),
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
    };
    Stamp { files: [one(cert), one(key)] }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(hosts: &[&str]) -> (String, String) {
        let (_, ca_key, ca_params) = tls::make_ca("test-ca").unwrap();
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        tls::make_serving_cert(&issuer, &hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_changed_pair_replaces_the_certificate_and_a_broken_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (a_cert, a_key) = pair(&["a.example"]);
        std::fs::write(&cert, &a_cert).unwrap();
        std::fs::write(&key, &a_key).unwrap();
        let dynamic = DynamicServingCert::load(&cert, &key).unwrap();
        let served = |d: &DynamicServingCert| tls::subject(&d.current.read().cert[0]).unwrap().common_name;
        assert_eq!(served(&dynamic), "a.example");
        assert!(!dynamic.reload_if_changed().unwrap(), "nothing changed");

        let (b_cert, b_key) = pair(&["b.example"]);
        std::fs::write(&key, &b_key).unwrap();
        // The key is new, the certificate not yet: they do not match, and a.example stays.
        let e = dynamic.reload_if_changed().unwrap_err().to_string();
        assert!(e.contains(&cert.display().to_string()) && e.contains("do not belong together"), "{e}");
        assert_eq!(served(&dynamic), "a.example");
        std::fs::write(&cert, &b_cert).unwrap();
        assert!(dynamic.reload_if_changed().unwrap());
        assert_eq!(served(&dynamic), "b.example");

        std::fs::write(&cert, "not a certificate").unwrap();
        let e = dynamic.reload_if_changed().unwrap_err().to_string();
        assert_eq!(e, format!("{} holds no usable certificate", cert.display()));
        assert!(!dynamic.reload_if_changed().unwrap(), "a broken pair is reported once");
        std::fs::write(&cert, &a_cert).unwrap();
        std::fs::remove_file(&key).unwrap();
        let e = dynamic.reload_if_changed().unwrap_err().to_string();
        assert!(e.starts_with(&format!("reading {}", key.display())), "{e}");
        assert_eq!(served(&dynamic), "b.example");
    }
}
