//! The serving certificate as k8s.io/apiserver's dynamic serving certificate, on the real binary: new TLS
//! connections get a rewritten `--tls-cert-file`/`--tls-private-key-file` pair without a restart, a broken pair
//! keeps the previous certificate and the log says which files and why; `--tls-min-version` and
//! `--tls-cipher-suites` take k8s.io/apiserver's names and hold on the wire.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestServer;
use http_body_util::BodyExt;
use podset_apiserver::apiserver::tls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CipherSuite, ClientConfig, RootCertStore, SupportedProtocolVersion};

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
}

impl Pki {
    fn new() -> Self {
        tls::provider();
        let (ca_pem, ca_key, ca_params) = tls::make_ca("rotation-test-ca").unwrap();
        Self { dir: tempfile::tempdir().unwrap(), ca_pem, ca_key, ca_params }
    }

    /// A serving certificate for 127.0.0.1 whose CN is `name`: (cert PEM, key PEM).
    fn issue(&self, name: &str) -> (String, String) {
        let issuer = rcgen::Issuer::new(self.ca_params.clone(), &self.ca_key);
        tls::make_serving_cert(&issuer, &[name.to_owned(), "127.0.0.1".to_owned()]).unwrap()
    }

    fn cert_file(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    fn key_file(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    /// Replaces a file as the kubelet updates a Secret volume: a new file renamed over the old one.
    fn replace(&self, path: &Path, contents: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    fn start(&self, extra: &[&str]) -> TestServer {
        let mut args = vec![
            format!("--tls-cert-file={}", self.cert_file().display()),
            format!("--tls-private-key-file={}", self.key_file().display()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        TestServer::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn client(&self, versions: &[&'static SupportedProtocolVersion], suites: Option<&[CipherSuite]>) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        let der = CertificateDer::from_pem_slice(self.ca_pem.as_bytes());
        roots.add(der.unwrap()).unwrap();
        let mut provider = (*tls::provider()).clone();
        if let Some(suites) = suites {
            provider.cipher_suites.retain(|s| suites.contains(&s.suite()));
        }
        ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}

/// A new TLS connection: the CN of the certificate the server presented, or the handshake error.
async fn handshake(addr: SocketAddr, cfg: ClientConfig) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok(tls::subject(&leaf).unwrap().common_name)
}

#[test]
fn a_rewritten_pair_is_served_to_new_connections_and_a_broken_one_is_not() {
    let pki = Pki::new();
    let (a_cert, a_key) = pki.issue("a.example");
    std::fs::write(pki.cert_file(), &a_cert).unwrap();
    std::fs::write(pki.key_file(), &a_key).unwrap();
    let server = pki.start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tls12_13 = rustls::DEFAULT_VERSIONS;
    let new_connection = || rt.block_on(handshake(server.addr, pki.client(tls12_13, None)));
    assert_eq!(new_connection().unwrap(), "a.example");

    // A connection opened before the rotation, kept open across it.
    let mut kept = rt.block_on(open_http1(server.addr, pki.client(tls12_13, None)));
    assert_eq!(rt.block_on(get(&mut kept, "/version")), 200);

    let pid = server.child.as_ref().unwrap().id();
    let (b_cert, b_key) = pki.issue("b.example");
    pki.replace(&pki.key_file(), &b_key);
    pki.replace(&pki.cert_file(), &b_cert);
    let started = Instant::now();
    while new_connection().unwrap() != "b.example" {
        assert!(started.elapsed() < Duration::from_secs(15), "the new certificate was not served:\n{}", server.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("new certificate served after {:?}", started.elapsed());
    assert!(server.log_contains("serving certificate reloaded"), "{}", server.logs());
    assert_eq!(server.child.as_ref().unwrap().id(), pid);
    assert_eq!(rt.block_on(get(&mut kept, "/version")), 200, "the connection from before the rotation still works");

    // A certificate whose key is not the one on disk: b.example stays, and the log says why.
    let (c_cert, _) = pki.issue("c.example");
    let logged_before = server.logs().len();
    pki.replace(&pki.cert_file(), &c_cert);
    let cert_path = pki.cert_file().display().to_string();
    // A line logged after this replacement: the b rotation above may have warned of a half-written pair too.
    let warned = Instant::now();
    let warning = loop {
        let logs = server.logs();
        if let Some(line) = logs[logged_before..].lines().find(|l| l.contains("do not belong together")) {
            break line.to_owned();
        }
        assert!(warned.elapsed() < Duration::from_secs(10), "no warning for a mismatched pair:\n{logs}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(warning.contains(&cert_path), "the warning names the file: {warning}");
    assert_eq!(new_connection().unwrap(), "b.example");

    // A key that is not PEM.
    pki.replace(&pki.key_file(), "garbage");
    let key_path = pki.key_file().display().to_string();
    assert!(server.log_contains(&format!("{key_path} holds no usable private key")), "{}", server.logs());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(new_connection().unwrap(), "b.example");
    assert_eq!(server.logs().matches("holds no usable private key").count(), 1, "a broken pair is reported once");

    // Fixed again: served.
    let (d_cert, d_key) = pki.issue("d.example");
    pki.replace(&pki.key_file(), &d_key);
    pki.replace(&pki.cert_file(), &d_cert);
    let started = Instant::now();
    while new_connection().unwrap() != "d.example" {
        assert!(started.elapsed() < Duration::from_secs(15), "the repaired pair was not served:\n{}", server.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A client trusting every CA in `bundle` (PEM).
fn trusting(bundle: &str) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// `podset-apiserver rotate-ca` on `data_dir`: (stdout, stderr).
fn rotate_ca(data_dir: &Path, finish: bool) -> (String, String) {
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args(["rotate-ca", "--data-dir"]).arg(data_dir);
    if finish {
        cmd.arg("--finish");
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "rotate-ca failed: {stderr}");
    (stdout, stderr)
}

#[test]
fn the_self_signed_ca_rotates_in_two_steps_each_trusted_by_the_bundle_pinned_before_it() {
    tls::provider();
    let mut server = TestServer::start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let trusts = |server: &TestServer, bundle: &str| rt.block_on(handshake(server.addr, trusting(bundle))).is_ok();
    let old_ca = std::fs::read_to_string(&server.ca).unwrap();
    assert!(trusts(&server, &old_ca));

    // Staged: the bundle holds both CAs; the certificate served is still the old CA's.
    let (bundle, said) = rotate_ca(&server.data_dir, false);
    assert!(said.contains("rotate-ca --finish"), "{said}");
    let cas: Vec<_> = CertificateDer::pem_slice_iter(bundle.as_bytes()).map(Result::unwrap).collect();
    assert_eq!(cas.len(), 2, "{bundle}");
    assert_eq!(cas[0], CertificateDer::from_pem_slice(old_ca.as_bytes()).unwrap());
    assert!(trusts(&server, &bundle));
    std::thread::sleep(Duration::from_secs(2)); // two reload polls: nothing changed on disk to serve
    assert!(trusts(&server, &old_ca), "staging served a new certificate");
    assert_eq!(rotate_ca(&server.data_dir, false).0, bundle, "staging again stages nothing new");

    // Finished: the next CA's certificate is served without a restart; the bundle still trusts it.
    let pid = server.child.as_ref().unwrap().id();
    let (new_ca, _) = rotate_ca(&server.data_dir, true);
    assert_eq!(CertificateDer::from_pem_slice(new_ca.as_bytes()).unwrap(), cas[1], "the staged CA is the new one");
    let started = Instant::now();
    while !trusts(&server, &new_ca) {
        assert!(started.elapsed() < Duration::from_secs(15), "the new certificate was not served:\n{}", server.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!trusts(&server, &old_ca), "the old CA still verifies what is served");
    assert!(trusts(&server, &bundle));
    assert_eq!(server.child.as_ref().unwrap().id(), pid);

    // The next start keeps the new CA and its certificate.
    assert!(server.terminate().success());
    let again = server.restart();
    assert_eq!(std::fs::read_to_string(&again.ca).unwrap(), new_ca);
    assert!(trusts(&again, &new_ca));
}

#[test]
fn tls_min_version_and_cipher_suites_hold_on_the_wire() {
    use rustls::version::{TLS12, TLS13};
    let pki = Pki::new();
    let (cert, key) = pki.issue("suites.example");
    std::fs::write(pki.cert_file(), &cert).unwrap();
    std::fs::write(pki.key_file(), &key).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    let server = pki.start(&["--tls-min-version=VersionTLS13"]);
    let e = rt.block_on(handshake(server.addr, pki.client(&[&TLS12], None))).unwrap_err();
    assert!(e.contains("alert") || e.contains("Version"), "{e}");
    assert_eq!(rt.block_on(handshake(server.addr, pki.client(&[&TLS13], None))).unwrap(), "suites.example");
    drop(server);

    let server = pki.start(&["--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_AES_128_GCM_SHA256"]);
    let only = |suite| pki.client(&[&TLS12], Some(&[suite][..]));
    let e =
        rt.block_on(handshake(server.addr, only(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256))).unwrap_err();
    assert!(e.contains("alert") || e.contains("HandshakeFailure"), "{e}");
    let ok = rt.block_on(handshake(server.addr, only(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)));
    assert_eq!(ok.unwrap(), "suites.example");
    assert_eq!(rt.block_on(handshake(server.addr, pki.client(&[&TLS13], None))).unwrap(), "suites.example");
    drop(server);

    for (flag, says) in [
        ("--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA", "offers no CBC, RC4, 3DES or RSA key exchange suites"),
        ("--tls-min-version=VersionTLS10", "TLS 1.0 and 1.1 are not offered"),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(["--insecure-allow-all", "--secure-port=0", "--bind-address=127.0.0.1", flag])
            .arg(format!("--tls-cert-file={}", pki.cert_file().display()))
            .arg(format!("--tls-private-key-file={}", pki.key_file().display()))
            .arg(format!("--data-dir={}", pki.dir.path().join("data").display()))
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{flag}: {stderr}");
    }
}

type Http1 = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

async fn open_http1(addr: SocketAddr, cfg: ClientConfig) -> Http1 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(ServerName::from(addr.ip()), tcp).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    send
}

async fn get(send: &mut Http1, path: &str) -> u16 {
    let req = http::Request::get(path).body(http_body_util::Full::new(Bytes::new())).unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}
