//! Request limits against the real binary, as kube-apiserver's: 2 000 requests at once get 429s (with Retry-After
//! and a Status) instead of a collapse, and every acknowledged write is kept; a request that overruns
//! `--request-timeout` gets 504; a watch ends cleanly after `--min-request-timeout`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// An HTTP/2 connection (as kube-apiserver's aggregator opens), with a client certificate if given.
async fn h2(server: &TestServer, identity: Option<&(String, String)>) -> SendRequest<Body> {
    podset_apiserver::apiserver::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_to_der(&server.ca).into()).unwrap();
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut cfg = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::from(server.addr.ip());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn full(b: Vec<u8>) -> Body {
    Full::new(Bytes::from(b)).boxed()
}

/// (status, Retry-After, body) of one request.
async fn send(conn: &SendRequest<Body>, req: Request<Body>) -> (u16, Option<String>, Bytes) {
    let resp = conn.clone().send_request(req).await.expect("an answer, not a broken connection");
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (status, retry, resp.into_body().collect().await.unwrap().to_bytes())
}

/// A CA for `--requestheader-client-ca-file` and a front-proxy certificate it signed: requests on that connection
/// act as whoever `X-Remote-User` names (with `--insecure-allow-all` every caller may do anything, but only
/// `system:masters` are exempt from the in-flight limits, so the test must be someone else).
fn front_proxy(dir: &Path) -> (String, (String, String)) {
    let (ca, key, params) = podset_apiserver::apiserver::tls::make_ca("front-proxy-ca").unwrap();
    let issuer = rcgen::Issuer::new(params, &key);
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name.push(rcgen::DnType::CommonName, "front-proxy-client");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = (p.signed_by(&leaf_key, &issuer).unwrap().pem(), leaf_key.serialize_pem());
    let path = dir.join("front-proxy-ca.crt");
    std::fs::write(&path, ca).unwrap();
    (path.to_str().unwrap().to_owned(), leaf)
}

fn as_bob(req: http::request::Builder) -> http::request::Builder {
    req.header("x-remote-user", "bob").header("x-remote-group", "system:authenticated")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_requests_at_once_get_429s_and_no_acknowledged_write_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, proxy) = front_proxy(dir.path());
    let server = TestServer::start(&[
        &format!("--requestheader-client-ca-file={ca}"),
        "--max-requests-inflight=10",
        "--max-mutating-requests-inflight=5",
    ]);
    let url = |path: &str| format!("{}{path}", server.url());
    let mut conns = Vec::new();
    for _ in 0..10 {
        conns.push(h2(&server, Some(&proxy)).await);
    }

    let mut requests = Vec::new();
    for i in 0..2000 {
        let conn = conns[i % conns.len()].clone();
        let req = if i % 2 == 0 {
            let body = serde_json::to_vec(&podset(&format!("load-{i}"), 0)).unwrap();
            as_bob(Request::post(url(PODSETS)).header("content-type", "application/json")).body(full(body)).unwrap()
        } else {
            as_bob(Request::get(url(&format!("{PODSETS}?limit=5")))).body(full(vec![])).unwrap()
        };
        requests.push(tokio::spawn(async move { (i, send(&conn, req).await) }));
    }
    let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
    let (mut acked, mut refused) = (BTreeSet::new(), BTreeSet::new());
    for r in requests {
        let (i, (status, retry_after, body)) = r.await.unwrap();
        *codes.entry(status).or_default() += 1;
        let create = i % 2 == 0;
        match (status, create) {
            (201, true) | (200, false) => {
                if create {
                    acked.insert(format!("load-{i}"));
                }
            }
            (429, _) => {
                let status = json(&body);
                assert_eq!(retry_after.as_deref(), Some("1"), "{status}");
                assert_eq!(
                    (status["kind"].as_str(), status["code"].as_u64(), status["reason"].as_str()),
                    (Some("Status"), Some(429), Some("TooManyRequests")),
                    "{status}"
                );
                assert_eq!(status["details"]["retryAfterSeconds"], 1);
                if create {
                    refused.insert(format!("load-{i}"));
                }
            }
            _ => panic!("request {i}: unexpected {status}: {}", String::from_utf8_lossy(&body)),
        }
    }
    eprintln!("answers: {codes:?}");
    assert!(codes.get(&429).is_some_and(|n| *n > 0), "the limits never refused anything: {codes:?}");
    assert!(!acked.is_empty() && codes.get(&200).is_some_and(|n| *n > 0), "nothing got through: {codes:?}");

    // Still answering, and the store holds exactly the acknowledged creates.
    let conn = h2(&server, Some(&proxy)).await;
    let (status, _, _) = send(&conn, as_bob(Request::get(url("/readyz"))).body(full(vec![])).unwrap()).await;
    assert_eq!(status, 200);
    let (status, _, body) = send(&conn, as_bob(Request::get(url(PODSETS))).body(full(vec![])).unwrap()).await;
    assert_eq!(status, 200);
    let stored: BTreeSet<String> = json(&body)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<_> = acked.difference(&stored).collect();
    assert!(lost.is_empty(), "acknowledged creates missing: {lost:?}");
    let applied: Vec<_> = refused.intersection(&stored).collect();
    assert!(applied.is_empty(), "a create answered 429 was applied anyway: {applied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_overrunning_the_request_timeout_gets_504() {
    let server = TestServer::start(&["--request-timeout=2s"]);
    let conn = h2(&server, None).await;
    // A client that sends half its body and stalls: the server cannot finish, and must not wait forever.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let body = serde_json::to_vec(&podset("stalled", 0)).unwrap();
    tx.send(Ok(Frame::data(Bytes::copy_from_slice(&body[..body.len() / 2])))).await.unwrap();
    let stalled = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let req = Request::post(format!("{}{PODSETS}", server.url())).header("content-type", "application/json");
    let answered = tokio::time::timeout(Duration::from_secs(30), send(&conn, req.body(stalled).unwrap())).await;
    let (status, _, answer) = answered.expect("no answer within 15 times --request-timeout");
    let answer = json(&answer);
    assert_eq!(
        (status, answer["kind"].as_str(), answer["reason"].as_str()),
        (504, Some("Status"), Some("Timeout")),
        "{answer}"
    );
    assert_eq!(answer["message"], "Timeout: request did not complete within the allotted timeout");
    drop(tx);

    let get = |path: String| Request::get(format!("{}{path}", server.url())).body(full(vec![])).unwrap();
    assert_eq!(send(&conn, get(format!("{PODSETS}/stalled"))).await.0, 404, "half a body wrote nothing");
    let (status, _, _) = send(&conn, get(format!("{PODSETS}?timeout=bogus"))).await;
    assert_eq!(status, 400, "a ?timeout= that does not parse");
    assert_eq!(send(&conn, get(PODSETS.to_owned())).await.0, 200, "requests in time are served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_outlives_the_request_timeout_and_ends_cleanly_after_the_min_request_timeout() {
    let server = TestServer::start(&["--request-timeout=1s", "--min-request-timeout=3"]);
    let conn = h2(&server, None).await;
    let started = Instant::now();
    let req = Request::get(format!("{}{PODSETS}?watch=true", server.url())).body(full(vec![])).unwrap();
    let resp = conn.clone().send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let create = Request::post(format!("{}{PODSETS}", server.url()))
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(&podset("seen", 0)).unwrap()))
        .unwrap();
    assert_eq!(send(&conn, create).await.0, 201);

    let mut events = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("the watch ends cleanly, not with a reset");
            if let Ok(data) = frame.into_data() {
                events.extend(data.to_vec());
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch did not end within 10 times --min-request-timeout");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_secs(3), "ended after {elapsed:?}, before --min-request-timeout");
    let text = String::from_utf8(events).unwrap();
    assert!(text.contains("\"type\":\"ADDED\"") && text.contains("\"seen\""), "{text}");
}
