//! A real admission webhook for tests: HTTPS (rustls) with its own CA on a local address, recording every
//! AdmissionReview it gets. What it answers depends on the path:
//! - `/allow`: allowed, with a warning and an audit annotation;
//! - `/deny`: refused with a Status (403, reason Forbidden); `/deny-bare`: refused with no Status;
//! - `/label`: allowed, with a JSONPatch setting label `mutated=yes` (and `round=<n>` counting its calls);
//! - `/bad-patch`: a JSONPatch that does not apply; `/invalid-patch`: one setting `spec.replicas` to a string;
//! - `/slow`: answers after `SLOW`; `/garbage`: 200 with a body that is not JSON; `/wrong-uid`: another uid;
//! - `/error`: HTTP 500; `/audit`: 200, as an audit webhook answers an EventList.
//!
//! A v1beta1 review gets a v1beta1 answer.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use podset_apiserver::controller::CONTROLLER_USER;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use serde_json::{json, Value};

/// How long `/slow` takes to answer: longer than the 1 s timeout the tests give it.
pub const SLOW: Duration = Duration::from_secs(4);

/// One review the webhook got: its path, its `Authorization` and `traceparent` headers, and the review.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub authorization: Option<String>,
    pub traceparent: Option<String>,
    pub review: Value,
}

pub struct WebhookServer {
    pub addr: SocketAddr,
    /// The CA that signed the serving certificate (PEM), for a webhook's `caBundle`.
    pub ca_pem: String,
    received: Arc<Mutex<Vec<Received>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    /// Ends the open connections too when the server is dropped: a receiver that goes away takes them with it.
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
        self.stop.cancel();
    }
}

/// A CA named `ca_name` and a serving certificate for `ip` signed by it: (CA PEM, cert PEM, key PEM).
pub fn certificates(ip: IpAddr, ca_name: &str) -> (String, String, String) {
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, &ca_key);
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name.push(DnType::CommonName, "webhook");
    leaf.subject_alt_names = vec![SanType::IpAddress(ip), SanType::DnsName("localhost".try_into().unwrap())];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

impl WebhookServer {
    /// Serves on `ip`, a free port.
    pub async fn start(ip: IpAddr) -> Self {
        let (ca_pem, cert_pem, key_pem) = certificates(ip, "test webhook CA");
        Self::serve(ip, &cert_pem, &key_pem, ca_pem).await
    }

    /// Serves on `ip` with the certificate chain `chain_pem` (leaf first) and its key; `ca_pem` is what a
    /// webhook configuration names as its `caBundle`.
    pub async fn serve(ip: IpAddr, chain_pem: &str, key_pem: &str, ca_pem: String) -> Self {
        Self::serve_at(SocketAddr::new(ip, 0), chain_pem, key_pem, ca_pem).await
    }

    /// [`Self::serve`] at `addr` (e.g. where an earlier server was, to bring a receiver back).
    pub async fn serve_at(addr: SocketAddr, chain_pem: &str, key_pem: &str, ca_pem: String) -> Self {
        podset_apiserver::apiserver::tls::provider();
        use rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let tls = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (rec, conns) = (received.clone(), connections.clone());
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                conns.fetch_add(1, Ordering::SeqCst);
                let (acceptor, rec, stopped) = (acceptor.clone(), rec.clone(), stopped.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| handle(req, rec.clone()));
                    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = stopped.cancelled() => {}
                    }
                });
            }
        });
        Self { addr, ca_pem, received, connections, task, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// The reviews received on `path`, oldest first, of the test's own requests: the status writes of
    /// podset-apiserver's embedded controller pass admission too (as a Deployment controller's do on
    /// kube-apiserver), and are left out.
    pub fn received(&self, path: &str) -> Vec<Received> {
        let controller = |r: &Received| r.review["request"]["userInfo"]["username"] == CONTROLLER_USER;
        self.received.lock().unwrap().iter().filter(|r| r.path == path && !controller(r)).cloned().collect()
    }

    /// Every review received on `path`, the embedded controller's included.
    pub fn received_all(&self, path: &str) -> Vec<Received> {
        self.received.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }

    pub fn clear(&self) {
        self.received.lock().unwrap().clear();
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn handle(
    req: http::Request<hyper::body::Incoming>,
    received: Arc<Mutex<Vec<Received>>>,
) -> Result<http::Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(String::from);
    let (authorization, traceparent) = (header("authorization"), header("traceparent"));
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let calls = {
        let mut r = received.lock().unwrap();
        r.push(Received { path: path.clone(), authorization, traceparent, review: review.clone() });
        r.iter().filter(|x| x.path == path).count()
    };
    let reply = |status: u16, body: Vec<u8>| {
        Ok(http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap())
    };
    let request = &review["request"];
    let uid = request["uid"].as_str().unwrap_or_default().to_owned();
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let response = match path.as_str() {
        "/allow" => json!({"uid": uid, "allowed": true, "warnings": ["seen by the test webhook"],
            "auditAnnotations": {"seen": "yes"}}),
        "/deny" => json!({"uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "no PodSets here"}}),
        "/deny-bare" => json!({"uid": uid, "allowed": false}),
        "/label" => {
            let has_labels = request["object"]["metadata"]["labels"].is_object();
            let patch = if has_labels {
                json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"},
                       {"op": "add", "path": "/metadata/labels/round", "value": calls.to_string()}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes", "round": calls.to_string()}}])
            };
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": b64(patch)})
        }
        "/bad-patch" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": b64(json!([{"op": "replace", "path": "/spec/nothing/here", "value": 1}]))}),
        "/invalid-patch" => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": b64(json!([{"op": "add", "path": "/spec/replicas", "value": "many"}]))}),
        "/slow" => {
            tokio::time::sleep(SLOW).await;
            json!({"uid": uid, "allowed": true})
        }
        "/garbage" => return reply(200, b"this is not an AdmissionReview".to_vec()),
        "/wrong-uid" => json!({"uid": "not-the-uid", "allowed": true}),
        "/error" => return reply(500, b"webhook exploded".to_vec()),
        // An audit webhook: takes the EventList.
        "/audit" => return reply(200, b"{}".to_vec()),
        _ => return reply(404, Vec::new()),
    };
    let api_version = review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1").to_owned();
    let answer = json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response});
    reply(200, answer.to_string().into_bytes())
}
