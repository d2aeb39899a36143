//! What kube-apiserver 1.30–1.37 and its clients send, sent as they send it (the local control plane runs 1.20,
//! which sends none of it): the aggregator's discovery requests, client-go's reflector's streaming lists (the
//! metadata-only form kube-controller-manager uses included), CBOR bodies and Accept lists from CBOR-capable
//! clients, and thousands of watches multiplexed on one HTTP/2 connection as kube-apiserver's proxy holds them.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::TryStreamExt;
use http::Request;
use http_body_util::BodyExt;
use kube::api::{Api, PostParams};
use podset_apiserver::api::PodSet;
use serde_json::{json, Value};

fn get(path: &str) -> http::request::Builder {
    Request::get(path)
}

/// kube-aggregator's discovery manager's `Accept` for an APIService's `/apis` (1.30–1.36; 1.37's asks for `V2`
/// alone: kube-aggregator f03ed462319c, kubernetes#138271).
const AGGREGATOR_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// client-go's metadata client (`k8s.io/client-go/metadata`): its list and its watch.
const METADATA_LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const METADATA_WATCH_ACCEPT: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
/// kubectl's for `get -w`.
const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[tokio::test]
async fn discovery_answers_the_aggregator_as_k8s_io_apiserver_does() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let (status, headers, body) =
        raw(&client, get("/apis").header("accept", AGGREGATOR_ACCEPT).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    // kube-aggregator takes the answer as aggregated only with this media type and these parameters.
    assert_eq!(headers["content-type"], V2);
    assert_eq!(headers["vary"], "Accept");
    assert_eq!(headers["cache-control"], "public");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    assert!(etag.len() > 2 && etag.starts_with('"') && etag.ends_with('"'), "a strong, quoted ETag: {etag}");
    let v2 = json(&body);
    assert_eq!(
        (v2["apiVersion"].as_str(), v2["kind"].as_str()),
        (Some("apidiscovery.k8s.io/v2"), Some("APIGroupDiscoveryList"))
    );
    let versions: Vec<&str> =
        v2["items"][0]["versions"].as_array().unwrap().iter().map(|v| v["version"].as_str().unwrap()).collect();
    assert_eq!(versions, ["v1beta1", "v1alpha1"], "the preferred version first, as the aggregator orders them");
    let version = &v2["items"][0]["versions"][0];
    assert_eq!(version["freshness"], "Current");
    let resource = &version["resources"][0];
    assert_eq!(resource["resource"], "podsets");
    let mut subresources: Vec<&str> =
        resource["subresources"].as_array().unwrap().iter().map(|s| s["subresource"].as_str().unwrap()).collect();
    subresources.sort();
    assert_eq!(subresources, ["scale", "status"]);

    // Every minute it asks again with the ETag it kept: 304 and no body, the same validators (1.37's aggregator
    // asks for v2 alone, and gets the same document).
    for accept in [AGGREGATOR_ACCEPT, V2] {
        let req = get("/apis").header("accept", accept).header("if-none-match", &etag).body(vec![]).unwrap();
        let (status, headers, body) = raw(&client, req).await;
        assert_eq!((status, body.len()), (304, 0), "{accept}");
        assert_eq!(headers["etag"], etag.as_str());
    }
    // An ETag of another document is answered in full.
    let (status, _, _) =
        raw(&client, get("/apis").header("accept", V2).header("if-none-match", "\"0\"").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);

    // v2beta1 alone is still answered (aggregators 1.30–1.36 list it after v2; older ones asked for it alone).
    let (status, headers, body) = raw(&client, get("/apis").header("accept", V2BETA1).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], V2BETA1);
    assert_eq!(json(&body)["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    assert_ne!(headers["etag"], etag.as_str(), "each representation has its own ETag");

    // Plain JSON is legacy discovery, as is what the aggregator falls back to.
    let (status, headers, body) =
        raw(&client, get("/apis").header("accept", "application/json").body(vec![]).unwrap()).await;
    assert_eq!((status, headers["content-type"].to_str().unwrap()), (200, "application/json"));
    assert_eq!(json(&body)["kind"], "APIGroupList");
    let (status, _, body) =
        raw(&client, get("/apis/demo.k8s.io/v1alpha1").header("accept", "application/json").body(vec![]).unwrap())
            .await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["kind"], "APIResourceList");
}

#[tokio::test]
async fn cbor_and_protobuf_bodies_are_415_and_accept_lists_fall_back_to_json() {
    let server = TestServer::start(&[]);
    let client = server.client();
    // A self-described CBOR map {"kind": "PodSet"} (tag 55799, as kube-apiserver writes CBOR).
    let cbor = vec![0xd9, 0xd9, 0xf7, 0xa1, 0x64, b'k', b'i', b'n', b'd', 0x66, b'P', b'o', b'd', b'S', b'e', b't'];
    for content_type in ["application/cbor", "application/vnd.kubernetes.protobuf"] {
        let req = Request::post(PODSETS).header("content-type", content_type).header("accept", "application/json");
        let (status, headers, body) = raw(&client, req.body(cbor.clone()).unwrap()).await;
        assert_eq!(status, 415, "{content_type}: {}", String::from_utf8_lossy(&body));
        assert_eq!(headers["content-type"], "application/json");
        let s = json(&body);
        assert_eq!(
            (s["kind"].as_str(), s["reason"].as_str(), s["code"].as_u64()),
            (Some("Status"), Some("UnsupportedMediaType"), Some(415))
        );
        assert!(
            s["message"].as_str().unwrap().starts_with(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
            ),
            "{s}"
        );
    }
    // The same object in JSON is then created (client-go falls back to JSON after a 415).
    let (status, _, _) =
        raw(&client, Request::post(PODSETS).body(serde_json::to_vec(&podset("a", 1)).unwrap()).unwrap()).await;
    assert_eq!(status, 201);
    let req = Request::patch(format!("{PODSETS}/a?fieldManager=cbor"))
        .header("content-type", "application/apply-patch+cbor")
        .body(cbor.clone());
    let (status, _, body) = raw(&client, req.unwrap()).await;
    assert_eq!((status, json(&body)["reason"].as_str()), (415, Some("UnsupportedMediaType")));
    let (_, _, body) = raw(&client, get(&format!("{PODSETS}/a")).body(vec![]).unwrap()).await;
    assert_eq!(json(&body)["metadata"]["resourceVersion"], "1", "nothing was written by the refused requests");

    // A client that prefers CBOR lists JSON after it: it gets JSON.
    for accept in
        ["application/cbor, application/json", "application/cbor;q=1, application/json;q=0.9", "application/cbor, */*"]
    {
        let (status, headers, body) = raw(&client, get(PODSETS).header("accept", accept).body(vec![]).unwrap()).await;
        assert_eq!((status, headers["content-type"].to_str().unwrap()), (200, "application/json"), "{accept}");
        assert_eq!(json(&body)["kind"], "PodSetList");
    }
    let path = format!("{PODSETS}?watch=1&resourceVersion=0&timeoutSeconds=1");
    let (status, headers, body) =
        raw(&client, get(&path).header("accept", "application/cbor-seq, application/json").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("application/json"), "{headers:?}");
    let first: Value = serde_json::from_slice(body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    // Nothing acceptable: 406 with the types served.
    let (status, _, body) = raw(&client, get(PODSETS).header("accept", "application/cbor").body(vec![]).unwrap()).await;
    assert_eq!(status, 406);
    let s = json(&body);
    assert_eq!(s["reason"], "NotAcceptable");
    assert_eq!(s["message"], "only the following media types are accepted: application/json, application/yaml");
}

/// One streaming list as client-go's reflector sends it (`watchList`): `resourceVersion` as given (left out when
/// empty), `resourceVersionMatch=NotOlderThan`, `sendInitialEvents=true`, bookmarks, a timeout; read until the
/// bookmark annotated `k8s.io/initial-events-end`, which must come, then the events after it.
async fn stream(server: &TestServer, rv: &str, accept: &str, then: usize) -> (Vec<Value>, Vec<Value>) {
    let mut query = String::new();
    query.push_str("allowWatchBookmarks=true");
    if !rv.is_empty() {
        query.push_str(&format!("&resourceVersion={rv}"));
    }
    query.push_str("&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=30&watch=true");
    let client = server.client();
    let req = Request::get(format!("{PODSETS}?{query}")).header("accept", accept).body(vec![]).unwrap();
    let resp = client.send(req.map(kube::client::Body::from)).await.unwrap();
    assert_eq!(resp.status(), 200, "{query} {accept}");
    let mut lines =
        kube::client::Body::into_data_stream(resp.into_body()).map_err(std::io::Error::other).into_async_read();
    use futures::AsyncBufReadExt;
    let (mut initial, mut after) = (Vec::new(), Vec::new());
    let mut line = String::new();
    let read = async {
        loop {
            line.clear();
            assert!(
                lines.read_line(&mut line).await.unwrap() > 0,
                "the stream ended before the initial-events-end bookmark"
            );
            let event: Value = serde_json::from_str(&line).unwrap();
            let marked = |o: &Value| o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true";
            let end = event["type"] == "BOOKMARK"
                && (marked(&event["object"]) || marked(&event["object"]["rows"][0]["object"]));
            initial.push(event);
            if end {
                break;
            }
        }
        while after.len() < then {
            line.clear();
            assert!(lines.read_line(&mut line).await.unwrap() > 0);
            let event: Value = serde_json::from_str(&line).unwrap();
            if event["type"] != "BOOKMARK" {
                after.push(event);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read).await.expect("the streaming list to arrive");
    (initial, after)
}

#[tokio::test]
async fn streaming_lists_as_client_go_reflectors_send_them_metadata_only_and_tables_too() {
    let server = TestServer::start(&[]);
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    let mut rv = String::new();
    for n in ["a", "b", "c"] {
        let made = api.create(&PostParams::default(), &serde_json::from_value(podset(n, 1)).unwrap()).await.unwrap();
        rv = made.metadata.resource_version.unwrap();
    }
    for (accept, kind) in
        [("application/json", "PodSet"), (METADATA_WATCH_ACCEPT, "PartialObjectMetadata"), (TABLE_ACCEPT, "Table")]
    {
        for from in ["", "0", rv.as_str()] {
            let what = format!("{kind} from resourceVersion {from:?}");
            let (initial, _) = stream(&server, from, accept, 0).await;
            let (added, end) = initial.split_at(initial.len() - 1);
            assert_eq!(added.len(), 3, "{what}: {initial:?}");
            for e in added {
                assert_eq!((e["type"].as_str(), e["object"]["kind"].as_str()), (Some("ADDED"), Some(kind)), "{what}");
            }
            if kind == "PartialObjectMetadata" {
                assert_eq!(added[0]["object"]["apiVersion"], "meta.k8s.io/v1");
                assert!(added[0]["object"].get("spec").is_none(), "{what}: metadata only");
                let mut names: Vec<&str> =
                    added.iter().map(|e| e["object"]["metadata"]["name"].as_str().unwrap()).collect();
                names.sort();
                assert_eq!(names, ["a", "b", "c"]);
            }
            let bookmark = &end[0]["object"];
            assert_eq!(
                bookmark["metadata"]["resourceVersion"],
                rv.as_str(),
                "{what}: the bookmark's revision is the list's"
            );
            assert_eq!(bookmark["kind"], kind, "{what}: the bookmark is in the form asked for");
            if kind == "Table" {
                // kube-apiserver's table conversion: one row, its object the bookmark's metadata.
                let object = &bookmark["rows"][0]["object"];
                assert_eq!(object["kind"], "PartialObjectMetadata", "{what}");
                assert_eq!(object["metadata"]["annotations"]["k8s.io/initial-events-end"], "true", "{what}");
            }
        }
    }
    // The stream goes on after the bookmark: a change made now arrives in the same form.
    let s = &server;
    let (watching, change) = tokio::join!(stream(s, "", METADATA_WATCH_ACCEPT, 1), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        api.create(&PostParams::default(), &serde_json::from_value(podset("d", 1)).unwrap()).await.unwrap()
    });
    let event = &watching.1[0];
    assert_eq!(
        (event["type"].as_str(), event["object"]["kind"].as_str()),
        (Some("ADDED"), Some("PartialObjectMetadata"))
    );
    assert_eq!(event["object"]["metadata"]["resourceVersion"], change.metadata.resource_version.unwrap().as_str());

    // The metadata client's list, as the quota monitor and the garbage collector list before watching.
    let (status, _, body) =
        raw(&server.client(), get(PODSETS).header("accept", METADATA_LIST_ACCEPT).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    let list = json(&body);
    assert_eq!(
        (list["kind"].as_str(), list["items"].as_array().unwrap().len()),
        (Some("PartialObjectMetadataList"), 4)
    );

    // kube-rs's watcher with streaming lists: the same reflector, in Rust.
    assert_eq!(common::streaming_list_names(api.clone()).await, ["a", "b", "c", "d"]);
}

/// Reads a watch response until its first event that is not a bookmark.
async fn first_event(resp: http::Response<hyper::body::Incoming>) -> Value {
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    loop {
        let frame = body.frame().await.expect("the watch ended").expect("watch stream");
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let event: Value = serde_json::from_slice(&line).unwrap();
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// SETTINGS_MAX_CONCURRENT_STREAMS as the server advertises it.
async fn advertised_streams(server: &TestServer) -> usize {
    let (client, conn) = h2::client::handshake(server.h2_tls().await).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    // The server's SETTINGS come with its first frames; a request's answer is after them.
    let (resp, _) =
        client.send_request(Request::get(format!("https://localhost{PODSETS}")).body(()).unwrap(), true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    client.current_max_send_streams()
}

#[tokio::test]
async fn http2_streams_per_connection_are_k8s_io_apiservers() {
    for (args, want) in [
        (vec![], 1000),
        (vec!["--http2-max-streams-per-connection=0"], 100),
        (vec!["--http2-max-streams-per-connection=250"], 250),
    ] {
        let server = TestServer::start(&args);
        assert_eq!(advertised_streams(&server).await, want, "{args:?}");
    }
}

#[tokio::test]
async fn two_thousand_watches_share_one_http2_connection_and_each_gets_its_event() {
    const WATCHES: usize = 2000;
    let server = TestServer::start(&["--http2-max-streams-per-connection=2000"]);
    let pid = server.child.as_ref().unwrap().id();
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    let first =
        api.create(&PostParams::default(), &serde_json::from_value(podset("before", 1)).unwrap()).await.unwrap();
    let rv = first.metadata.resource_version.unwrap();

    let tls = server.h2_tls().await;
    let (send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);

    let before = rss_kib(pid);
    let opened = futures::future::join_all((0..WATCHES).map(|_| {
        let mut send = send.clone();
        let uri = format!(
            "https://localhost{PODSETS}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=600"
        );
        async move {
            let req = Request::get(uri).body(http_body_util::Empty::<Bytes>::new()).unwrap();
            send.send_request(req).await
        }
    }));
    // A server allowing fewer concurrent streams holds the rest back: they never open.
    let responses = tokio::time::timeout(Duration::from_secs(120), opened).await.expect("every watch to open");
    let responses: Vec<_> = responses.into_iter().map(|r| r.expect("a watch stream")).collect();
    assert!(responses.iter().all(|r| r.status() == 200 && r.version() == http::Version::HTTP_2));
    let after = rss_kib(pid);
    eprintln!(
        "{WATCHES} idle watches on one HTTP/2 connection: server RSS {before} KiB -> {after} KiB, {:.1} KiB a watch",
        after.saturating_sub(before) as f64 / WATCHES as f64
    );

    let made = api.create(&PostParams::default(), &serde_json::from_value(podset("after", 1)).unwrap()).await.unwrap();
    let events = tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::join_all(responses.into_iter().map(first_event)),
    )
    .await
    .expect("every watch to get the event");
    let want = made.metadata.resource_version.unwrap();
    let got = events
        .iter()
        .filter(|e| e["type"] == "ADDED" && e["object"]["metadata"]["resourceVersion"] == json!(want))
        .count();
    assert_eq!(got, WATCHES);
}
