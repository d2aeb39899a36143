//! Which webhook serving certificates are trusted, compared with kube-apiserver on the real control plane: for
//! each kind of certificate a cluster meets, one webhook serving it (refusing every request it gets, so a call
//! that got through is told from one that failed), one configuration naming it with its `caBundle` for both
//! `configmaps` and `demo.k8s.io` `podsets` in a namespace of its own; a ConfigMap created there on
//! kube-apiserver and a PodSet created there through the aggregator must get the same answer, and a failed
//! call the same Go `x509:` reason.

mod common;
#[path = "common/webhook.rs"]
mod webhook;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use base64::Engine as _;
use common::cluster::{in_namespace, runtime};
use http::Request;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use serde_json::{json, Value};
use webhook::WebhookServer;

fn node_ip() -> IpAddr {
    podset_envtest::NODE_IP.parse().unwrap()
}

fn params(cn: &str, sans: Vec<SanType>, ca: bool) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.subject_alt_names = sans;
    if ca {
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    p
}

/// A certificate authority: its PEM and what signs with it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = params(name, vec![], true);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let pem = p.self_signed(&key).unwrap().pem();
    Ca { pem, issuer: Issuer::new(p, key) }
}

/// One kind of serving certificate: (chain PEM, key PEM, caBundle PEM), where the webhook listens and the host
/// its URL names, and whether Go trusts it.
struct Case {
    name: &'static str,
    chain: String,
    key: String,
    bundle: String,
    listen: IpAddr,
    host: String,
    trusted: bool,
}

fn cases() -> Vec<Case> {
    let ip = node_ip();
    let sans = || vec![SanType::IpAddress(ip)];
    let root = ca("webhook root CA");
    let signed = |p: CertificateParams, by: &Ca| {
        let key = KeyPair::generate().unwrap();
        (p.signed_by(&key, &by.issuer).unwrap().pem(), key.serialize_pem())
    };
    let case = |name, (chain, key): (String, String), bundle: &str, trusted| Case {
        name,
        chain,
        key,
        bundle: bundle.to_owned(),
        listen: ip,
        host: ip.to_string(),
        trusted,
    };
    let mut out = Vec::new();

    // `openssl req -x509 -newkey … -addext subjectAltName=IP:…`: self-signed, CA:TRUE, its own caBundle.
    let key = KeyPair::generate().unwrap();
    let self_signed = params("webhook", sans(), true).self_signed(&key).unwrap().pem();
    out.push(case("self-signed-ca", (self_signed.clone(), key.serialize_pem()), &self_signed, true));
    let key = KeyPair::generate().unwrap();
    let elsewhere = params("webhook", vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 99)))], true);
    let elsewhere = elsewhere.self_signed(&key).unwrap().pem();
    out.push(case("self-signed-ca-wrong-san", (elsewhere.clone(), key.serialize_pem()), &elsewhere, false));
    let key = KeyPair::generate().unwrap();
    let mut old = params("webhook", sans(), true);
    (old.not_before, old.not_after) = (rcgen::date_time_ymd(2020, 1, 1), rcgen::date_time_ymd(2021, 1, 1));
    let old = old.self_signed(&key).unwrap().pem();
    out.push(case("self-signed-ca-expired", (old.clone(), key.serialize_pem()), &old, false));

    out.push(case("from-ca", signed(params("webhook", sans(), false), &root), &root.pem, true));
    out.push(case("ca-leaf-from-ca", signed(params("webhook", sans(), true), &root), &root.pem, true));
    let mid_key = KeyPair::generate().unwrap();
    let mut mid = params("webhook intermediate CA", vec![], true);
    mid.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let mid_pem = mid.signed_by(&mid_key, &root.issuer).unwrap().pem();
    let mid = Ca { pem: mid_pem, issuer: Issuer::new(mid, mid_key) };
    let (leaf, key) = signed(params("webhook", sans(), false), &mid);
    out.push(case("intermediate", (format!("{leaf}{}", mid.pem), key.clone()), &root.pem, true));
    out.push(case("intermediate-missing", (leaf, key), &root.pem, false));

    let mut expired = params("webhook", sans(), false);
    (expired.not_before, expired.not_after) = (rcgen::date_time_ymd(2020, 1, 1), rcgen::date_time_ymd(2021, 1, 1));
    out.push(case("expired", signed(expired, &root), &root.pem, false));
    let wrong = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 99)))];
    out.push(case("wrong-san", signed(params("webhook", wrong, false), &root), &root.pem, false));
    let dns_only = vec![SanType::DnsName("webhook.example".try_into().unwrap())];
    out.push(case("dns-san-for-ip", signed(params("webhook", dns_only, false), &root), &root.pem, false));
    let mut client_only = params("webhook", sans(), false);
    client_only.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    out.push(case("client-auth-only", signed(client_only, &root), &root.pem, false));
    out.push(case("unknown-ca", signed(params("webhook", sans(), false), &root), &ca("another CA").pem, false));
    // A Common Name and no subject alternative names, called by host name: Go ≥ 1.17 refuses it.
    let mut cn_only = case("cn-only", signed(params("localhost", vec![], false), &root), &root.pem, false);
    (cn_only.listen, cn_only.host) = (IpAddr::V4(Ipv4Addr::LOCALHOST), "localhost".into());
    out.push(cn_only);
    out
}

fn configuration(case: &Case, server: &WebhookServer) -> Value {
    let bundle = base64::engine::general_purpose::STANDARD.encode(&case.bundle);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("tls-{}", case.name)},
        "webhooks": [{
            "name": format!("{}.tls.test.io", case.name),
            "clientConfig": {"url": format!("https://{}:{}/deny", case.host, server.addr.port()), "caBundle": bundle},
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]},
                {"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"], "resources": ["podsets"]},
            ],
            "namespaceSelector": {"matchLabels": {"webhook-tls": case.name}},
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    })
}

async fn send(client: &kube::Client, uri: &str, body: &Value) -> (u16, Value) {
    let req = Request::post(uri).header("content-type", "application/json").body(body.to_string().into_bytes());
    let (code, _, bytes) = common::raw(client, req.unwrap()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn configmap(ns: &str, name: &str) -> (String, Value) {
    (
        format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}),
    )
}

fn podset(ns: &str, name: &str) -> (String, Value) {
    (format!("/apis/demo.k8s.io/v1alpha1/namespaces/{ns}/podsets"), common::podset(name, 0))
}

/// What is compared of an answer: code, reason, and for a failed call Go's reason from `x509:` on (the current
/// time in an expiry left out; Go before 1.20 did not say `tls: failed to verify certificate:` before it).
fn outcome(code: u16, body: &Value) -> (u16, String, String) {
    let message = body["message"].as_str().unwrap_or_default();
    let mut why = match message.find("x509: ") {
        Some(i) => message[i..].to_owned(),
        None if message.contains("denied the request: no PodSets here") => "called".to_owned(),
        None => message.to_owned(),
    };
    if let Some(i) = why.find("current time ") {
        let rest = &why[i + "current time ".len()..];
        why = format!("{}current time <now>{}", &why[..i], &rest[rest.find(' ').unwrap_or(0)..]);
    }
    (code, body["reason"].as_str().unwrap_or_default().to_owned(), why)
}

#[test]
fn webhook_certificates_are_trusted_as_kube_apiserver_trusts_them() {
    in_namespace("webhook_certificates_are_trusted_as_kube_apiserver_trusts_them", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let cases = cases();
            let mut servers = Vec::new();
            for case in &cases {
                let server = WebhookServer::serve(case.listen, &case.chain, &case.key, case.bundle.clone()).await;
                let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": format!("tls-{}", case.name), "labels": {"webhook-tls": case.name}}});
                assert_eq!(send(&client, "/api/v1/namespaces", &ns).await.0, 201);
                let path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
                let (code, body) = send(&client, path, &configuration(case, &server)).await;
                assert_eq!(code, 201, "{body}");
                servers.push(server);
            }
            // Both servers see a configuration a moment after it is made: a dry run stops being admitted.
            for case in &cases {
                let ns = format!("tls-{}", case.name);
                for (uri, body) in [configmap(&ns, "probe"), podset(&ns, "probe")] {
                    common::cluster::wait(
                        Duration::from_secs(60),
                        || async { send(&client, &format!("{uri}?dryRun=All"), &body).await.0 != 201 },
                        &format!("{uri} to reach webhook {}", case.name),
                    )
                    .await;
                }
            }
            let mut failures = Vec::new();
            for (case, server) in cases.iter().zip(&servers) {
                let ns = format!("tls-{}", case.name);
                let (uri, body) = configmap(&ns, "one");
                let (code, answer) = send(&client, &uri, &body).await;
                let theirs = outcome(code, &answer);
                eprintln!("{}: kube-apiserver: {code} {}", case.name, answer["message"]);
                let (uri, body) = podset(&ns, "one");
                let (code, answer) = send(&client, &uri, &body).await;
                let ours = outcome(code, &answer);
                eprintln!("{}: podset-apiserver: {code} {}", case.name, answer["message"]);
                let expected = if case.trusted { 403 } else { 500 };
                if theirs != ours || ours.0 != expected {
                    failures
                        .push(format!("{}: kube-apiserver {theirs:?}, ours {ours:?}, expected {expected}", case.name));
                }
                if !case.trusted {
                    assert!(ours.2.starts_with("x509: "), "{}: {ours:?}", case.name);
                }
                assert_eq!(server.received("/deny").is_empty(), !case.trusted, "{}", case.name);
            }
            assert!(failures.is_empty(), "{failures:#?}");
        });
    });
}
