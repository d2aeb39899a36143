//! `--goaway-chance`: after a share of HTTP/2 answers the server sends the connection a GOAWAY, so a long-lived
//! client (kube-apiserver's proxy) reconnects and a Service spreads it again; the answer it came after is whole,
//! and a watch on the same connection goes on.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use kube::api::{Api, PostParams};
use podset_apiserver::api::PodSet;
use tokio::sync::oneshot;

const PODSETS: &str = "/apis/demo.k8s.io/v1beta1/namespaces/default/podsets";

/// An HTTP/2 connection of our own (h2), and a channel that says when it has ended.
async fn connect(server: &TestServer) -> (h2::client::SendRequest<Bytes>, oneshot::Receiver<Result<(), h2::Error>>) {
    let (client, conn) = h2::client::handshake(server.h2_tls().await).await.unwrap();
    let (ended, ended_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = ended.send(conn.await);
    });
    (client, ended_rx)
}

/// Reads a whole answer's body.
async fn body(mut body: h2::RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    all
}

/// GETs the list on `client`, one after another, until the connection refuses a request; returns how many were
/// answered (each one whole), or None if `most` were and none was refused.
async fn lists_until_refused(client: &mut h2::client::SendRequest<Bytes>, most: usize) -> Option<usize> {
    for answered in 0..most {
        let req = Request::get(format!("https://localhost{PODSETS}")).body(()).unwrap();
        let sent = match client.clone().ready().await {
            Ok(mut ready) => ready.send_request(req, true),
            Err(e) => Err(e),
        };
        let resp = match sent {
            Ok((resp, _)) => resp.await,
            Err(e) => Err(e),
        };
        match resp {
            Ok(resp) => {
                assert_eq!(resp.status(), 200);
                let list: serde_json::Value = serde_json::from_slice(&body(resp.into_body()).await).unwrap();
                assert_eq!(list["kind"], "PodSetList", "a whole answer");
            }
            Err(e) => {
                assert!(e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM), "{e}");
                return Some(answered);
            }
        }
    }
    None
}

#[tokio::test]
async fn a_share_of_http2_answers_end_their_connection_and_a_watch_on_it_goes_on() {
    let server = TestServer::start(&["--goaway-chance=0.02"]);
    let (mut client, ended) = connect(&server).await;

    // A watch first, on the connection that will be sent away.
    let watch = Request::get(format!("https://localhost{PODSETS}?watch=true")).body(()).unwrap();
    let (watch, _) = client.clone().ready().await.unwrap().send_request(watch, true).unwrap();
    let watch = watch.await.unwrap();
    assert_eq!(watch.status(), 200);
    let mut watch = watch.into_body();

    // 1 in 50 on average; 1000 in a row without one would be a 1.7e-9 chance.
    let answered = lists_until_refused(&mut client, 1000).await.expect("a GOAWAY within 1000 requests");
    assert!(answered >= 1, "the request the GOAWAY came after was answered");

    // The watch on the connection still gets its events; the connection ends once the watch does.
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &serde_json::from_value(podset("after-goaway", 1)).unwrap()).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), watch.data()).await.unwrap().unwrap().unwrap();
    let event: serde_json::Value = serde_json::from_slice(&event).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("after-goaway"))
    );
    drop(watch);
    // The server closes it (the client would keep it while it holds `client`). The close can cross the client's
    // last frame (the dropped watch's RST_STREAM), so a socket reset by then counts as closed too.
    let ended = tokio::time::timeout(Duration::from_secs(10), ended).await.expect("the connection closes").unwrap();
    assert!(ended.as_ref().map_or_else(|e| e.is_io(), |()| true), "{ended:?}");
    drop(client);
}

#[tokio::test]
async fn watches_never_end_their_connection_and_without_the_flag_nothing_does() {
    let server = TestServer::start(&["--goaway-chance=0.02"]);
    let (client, _) = connect(&server).await;
    // 500 watches opened and dropped: had each a 1 in 50 chance, all would pass with a 4e-5 one.
    for _ in 0..500 {
        let watch = Request::get(format!("https://localhost{PODSETS}?watch=true")).body(()).unwrap();
        let (watch, mut stream) = client.clone().ready().await.unwrap().send_request(watch, true).unwrap();
        assert_eq!(watch.await.unwrap().status(), 200);
        stream.send_reset(h2::Reason::CANCEL);
    }
    let mut client = client;
    assert!(lists_until_refused(&mut client, 1).await.is_none(), "the connection took requests after 500 watches");

    let server = TestServer::start(&[]);
    let (mut client, _) = connect(&server).await;
    assert_eq!(lists_until_refused(&mut client, 500).await, None, "no GOAWAY without --goaway-chance");
}

#[test]
fn the_chance_is_at_most_one_in_fifty() {
    for bad in ["0.03", "-0.01", "often"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
            .args(["--insecure-allow-all", "--secure-port=0", &format!("--goaway-chance={bad}")])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--goaway-chance"), "{bad}: {err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
        .args(["--goaway-chance=0.05"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--goaway-chance can not be less than 0 or greater than 0.02"),
        "kube-apiserver's words"
    );
}
