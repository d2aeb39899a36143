//! Identity: X-Remote-* headers count only on a connection with a front-proxy client certificate.

mod common;

use base64::Engine;
use common::*;
use http::Request;
use podset_apiserver::apiserver::tls::make_ca;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};

struct ClientCert {
    cert: String,
    key: String,
}

fn client_cert(issuer: &Issuer<'_, &KeyPair>, cn: &str) -> ClientCert {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    ClientCert { cert: cert.pem(), key: key.serialize_pem() }
}

fn client(server: &TestServer, cert: Option<&ClientCert>) -> kube::Client {
    podset_apiserver::apiserver::tls::provider();
    let mut cfg = server.kube_config();
    if let Some(c) = cert {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        cfg.auth_info.client_certificate_data = Some(b64(&c.cert));
        cfg.auth_info.client_key_data = Some(b64(&c.key).into());
    }
    kube::Client::try_from(cfg).unwrap()
}

async fn status(client: &kube::Client, user: Option<&str>) -> u16 {
    let mut req = Request::get(PODSETS);
    if let Some(u) = user {
        req = req.header("X-Remote-User", u).header("X-Remote-Group", "system:masters");
    }
    raw(client, req.body(vec![]).unwrap()).await.0
}

#[tokio::test]
async fn remote_user_headers_need_a_verified_front_proxy_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, ca_key, ca_params) = make_ca("front-proxy-ca").unwrap();
    let ca_path = dir.path().join("front-proxy-ca.crt");
    std::fs::write(&ca_path, &ca_pem).unwrap();
    let issuer = Issuer::new(ca_params, &ca_key);
    let proxy = client_cert(&issuer, "front-proxy-client");
    let wrong_name = client_cert(&issuer, "someone-else");
    let (_, other_key, other_params) = make_ca("other-ca").unwrap();
    let other_issuer = Issuer::new(other_params, &other_key);
    let forged = client_cert(&other_issuer, "front-proxy-client");

    let server = TestServer::start_in(
        dir.path().join("data"),
        None,
        vec![
            "--requestheader-client-ca-file".into(),
            ca_path.to_str().unwrap().into(),
            "--requestheader-allowed-names".into(),
            "front-proxy-client".into(),
        ],
    );

    assert_eq!(status(&client(&server, Some(&proxy)), Some("alice")).await, 200);
    assert!(server.log_contains(r#""user":"alice""#), "the request ran as the header's user");
    assert_eq!(status(&client(&server, Some(&proxy)), None).await, 401, "a proxy cert without a user header");
    assert_eq!(status(&client(&server, None), Some("admin")).await, 401, "forged headers, no certificate");
    assert_eq!(status(&client(&server, Some(&forged)), Some("admin")).await, 401, "certificate from another CA");
    assert_eq!(status(&client(&server, Some(&wrong_name)), Some("admin")).await, 401, "CN not allowed");
    let (code, _, body) = raw(&client(&server, None), Request::get(PODSETS).body(vec![]).unwrap()).await;
    assert_eq!(code, 401);
    assert_eq!(json(&body)["reason"], "Unauthorized");
    let (code, _, _) = raw(&client(&server, None), Request::get("/healthz").body(vec![]).unwrap()).await;
    assert_eq!(code, 200, "health needs no identity");
}
