//! The HTTP contract, driven with kube-rs and raw requests against the real server binary.

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use http::Request;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use serde_json::json;

fn api(server: &TestServer) -> Api<PodSet> {
    Api::namespaced(server.client(), "default")
}

fn get(path: &str) -> http::request::Builder {
    Request::get(path)
}

#[tokio::test]
async fn crud_with_a_kube_client() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    let ps: PodSet = serde_json::from_value(podset("web", 3)).unwrap();
    let created = api.create(&PostParams::default(), &ps).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(created.spec.replicas, Some(3));
    assert!(created.spec.template.is_some() && created.spec.selector.is_some(), "defaulted");

    let got = api.get("web").await.unwrap();
    assert_eq!(got, created);
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(!list.metadata.resource_version.as_deref().unwrap_or("").is_empty());

    // Replace bumps generation on a spec change only.
    let mut changed = got.clone();
    changed.spec.replicas = Some(5);
    let replaced = api.replace("web", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));
    let same = api.replace("web", &PostParams::default(), &replaced).await.unwrap();
    assert_eq!(same.metadata.resource_version, replaced.metadata.resource_version, "a no-op update writes nothing");

    // A stale resourceVersion is a 409 Conflict.
    let err = api.replace("web", &PostParams::default(), &changed).await.unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("{other:?}"),
    }

    // Merge and JSON patches.
    let p = api.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 7}}))).await.unwrap();
    assert_eq!(p.spec.replicas, Some(7));
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/spec/replicas", "value": 1}])).unwrap();
    let p = api.patch("web", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(p.spec.replicas, Some(1));

    // The status subresource changes status only; the main resource ignores status.
    let mut with_status = p.clone();
    with_status.status =
        Some(serde_json::from_value(json!({"replicas": 1, "readyReplicas": 1, "podNames": ["web-a"]})).unwrap());
    with_status.spec.replicas = Some(9);
    let s = api.replace_status("web", &PostParams::default(), &with_status).await.unwrap();
    assert_eq!(s.status.as_ref().unwrap().pod_names, vec!["web-a"]);
    assert_eq!(s.spec.replicas, Some(1));
    let mut main = s.clone();
    main.status = None;
    let m = api.replace("web", &PostParams::default(), &main).await.unwrap();
    assert_eq!(m.status.as_ref().unwrap().ready_replicas, 1, "status survives a main-resource update");

    // Scale.
    let scale = api.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("demo.k8s.io/podset=web"));
    api.patch_scale("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}}))).await.unwrap();
    assert_eq!(api.get("web").await.unwrap().spec.replicas, Some(4));

    api.delete("web", &DeleteParams::default()).await.unwrap();
    match api.get("web").await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
            assert_eq!(s.message, "podsets.demo.k8s.io \"web\" not found");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn invalid_objects_get_422_with_causes() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    let mut bad = podset("Bad_Name", -1);
    bad["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
    bad["spec"]["template"] =
        json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let ps: PodSet = serde_json::from_value(bad).unwrap();
    match api.create(&PostParams::default(), &ps).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
            let causes = s.details.unwrap().causes;
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert!(fields.contains(&"metadata.name"), "{fields:?}");
            assert!(fields.contains(&"spec.replicas"), "{fields:?}");
            assert!(fields.contains(&"spec.template.metadata.labels"), "{fields:?}");
            assert!(causes.iter().all(|c| c.reason == "FieldValueInvalid"));
        }
        other => panic!("{other:?}"),
    }
    // The selector cannot change.
    api.create(&PostParams::default(), &serde_json::from_value(podset("web", 1)).unwrap()).await.unwrap();
    let patch = Patch::Merge(
        json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}}),
    );
    match api.patch("web", &PatchParams::default(), &patch).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message.contains("spec.selector: Invalid value") && s.message.contains("field is immutable"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn wrong_methods_paths_and_media_types() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let cases: Vec<(Request<Vec<u8>>, u16, &str)> = vec![
        (Request::post(format!("{PODSETS}/x")).body(vec![]).unwrap(), 405, "MethodNotAllowed"),
        (Request::put(PODSETS).body(vec![]).unwrap(), 405, "MethodNotAllowed"),
        (Request::post("/apis/demo.k8s.io/v1alpha1/podsets").body(b"{}".to_vec()).unwrap(), 405, "MethodNotAllowed"),
        (get("/apis/demo.k8s.io/v1alpha1/namespaces/default/widgets").body(vec![]).unwrap(), 404, "NotFound"),
        (get("/apis/other.k8s.io/v1").body(vec![]).unwrap(), 404, "NotFound"),
        (get(&format!("{PODSETS}/missing")).body(vec![]).unwrap(), 404, "NotFound"),
        (
            Request::post(PODSETS).header("content-type", "text/plain").body(b"hi".to_vec()).unwrap(),
            415,
            "UnsupportedMediaType",
        ),
        (
            get(PODSETS).header("accept", "application/vnd.kubernetes.protobuf").body(vec![]).unwrap(),
            406,
            "NotAcceptable",
        ),
    ];
    for (req, code, reason) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (status, headers, body) = raw(&client, req).await;
        assert_eq!(status, code, "{what}: {}", String::from_utf8_lossy(&body));
        assert_eq!(headers["content-type"], "application/json", "{what}");
        let v = json(&body);
        assert_eq!((v["kind"].as_str(), v["apiVersion"].as_str()), (Some("Status"), Some("v1")), "{what}");
        assert_eq!(v["reason"], reason, "{what}");
        assert_eq!(v["code"], code, "{what}");
    }
    // Strategic merge patch is refused as for custom resources.
    raw(&client, Request::post(PODSETS).body(serde_json::to_vec(&podset("a", 1)).unwrap()).unwrap()).await;
    let (status, _, _) = raw(
        &client,
        Request::patch(format!("{PODSETS}/a"))
            .header("content-type", "application/strategic-merge-patch+json")
            .body(b"{}".to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 415);
}

#[tokio::test]
async fn hostile_input_is_refused_and_nothing_is_stored() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let huge = format!("{{\"metadata\":{{\"name\":\"huge\"}},\"x\":\"{}\"}}", "a".repeat(4 * 1024 * 1024));
    let post = |ct: &str, body: Vec<u8>| Request::post(PODSETS).header("content-type", ct).body(body).unwrap();
    let cases = vec![
        ("malformed JSON", post("application/json", b"{\"metadata\": {".to_vec()), 400),
        ("JSON array", post("application/json", b"[1,2]".to_vec()), 400),
        ("malformed YAML", post("application/yaml", b"metadata: [: :\n\t- x".to_vec()), 400),
        (
            "wrong kind",
            post("application/json", br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}"#.to_vec()),
            400,
        ),
        (
            "wrong apiVersion",
            post(
                "application/json",
                br#"{"apiVersion":"demo.k8s.io/v2","kind":"PodSet","metadata":{"name":"a"}}"#.to_vec(),
            ),
            400,
        ),
        (
            "wrong field type",
            post("application/json", br#"{"metadata":{"name":"a"},"spec":{"replicas":"three"}}"#.to_vec()),
            400,
        ),
        ("invalid name", post("application/json", br#"{"metadata":{"name":"UPPER"}}"#.to_vec()), 422),
        ("no name", post("application/json", br#"{"metadata":{}}"#.to_vec()), 422),
        (
            "namespace mismatch",
            post("application/json", br#"{"metadata":{"name":"a","namespace":"other"}}"#.to_vec()),
            400,
        ),
        (
            "resourceVersion on create",
            post("application/json", br#"{"metadata":{"name":"a","resourceVersion":"5"}}"#.to_vec()),
            400,
        ),
        ("huge body", post("application/json", huge.into_bytes()), 413),
        (
            "unknown field, strict",
            Request::post(format!("{PODSETS}?fieldValidation=Strict"))
                .header("content-type", "application/json")
                .body(br#"{"metadata":{"name":"a"},"spec":{"replicaz":2}}"#.to_vec())
                .unwrap(),
            400,
        ),
        ("bad query", Request::get(format!("{PODSETS}?limit=abc")).body(vec![]).unwrap(), 400),
        ("bad label selector", Request::get(format!("{PODSETS}?labelSelector=a%20in%20(")).body(vec![]).unwrap(), 400),
        (
            "unsupported field selector",
            Request::get(format!("{PODSETS}?fieldSelector=spec.replicas%3D1")).body(vec![]).unwrap(),
            400,
        ),
        ("garbage continue", Request::get(format!("{PODSETS}?limit=1&continue=garbage")).body(vec![]).unwrap(), 400),
        (
            "bad namespace",
            Request::get("/apis/demo.k8s.io/v1alpha1/namespaces/Not_OK/podsets").body(vec![]).unwrap(),
            400,
        ),
    ];
    for (what, req, code) in cases {
        let (status, _, body) = raw(&client, req).await;
        assert_eq!(status, code, "{what}: {}", String::from_utf8_lossy(&body));
        let v = json(&body);
        assert_eq!(v["kind"], "Status", "{what}");
        assert!(!v["message"].as_str().unwrap_or("").is_empty(), "{what}");
    }
    // Unknown fields under the default (Warn) are dropped with a warning.
    let (status, headers, body) =
        raw(&client, post("application/json", br#"{"metadata":{"name":"ok"},"spec":{"replicaz":2}}"#.to_vec())).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert!(headers["warning"].to_str().unwrap().contains("unknown field \\\"spec.replicaz\\\""), "{headers:?}");
    // Still serving, and only the one valid object was stored.
    let list = api(&server).list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), vec!["ok"]);
}

/// Write options are checked as kube-apiserver checks Create/Update/PatchOptions, and the field manager falls back
/// to the User-Agent's prefix.
#[tokio::test]
async fn write_options_are_checked_and_the_manager_defaults_to_the_user_agent() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let send = |method: &str, uri: String, ct: &str, body: &[u8]| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ct)
            .header("user-agent", "deployer/1.2 (linux)")
            .body(body.to_vec())
            .unwrap()
    };
    let (status, _, body) =
        raw(&client, send("POST", PODSETS.into(), "application/json", br#"{"metadata":{"name":"web"}}"#)).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["metadata"]["managedFields"][0]["manager"], "deployer");

    let web = format!("{PODSETS}/web");
    let merge = br#"{"spec":{"replicas":2}}"#;
    let apply = br#"{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"name":"web"}}"#;
    let cases = [
        (
            "force on a merge patch",
            send("PATCH", format!("{web}?force=true"), "application/merge-patch+json", merge),
            "PatchOptions",
            "force",
        ),
        (
            "apply without fieldManager",
            send("PATCH", web.clone(), "application/apply-patch+yaml", apply),
            "PatchOptions",
            "fieldManager",
        ),
        (
            "unprintable manager",
            send("PATCH", format!("{web}?fieldManager=a%E2%80%8Bb"), "application/merge-patch+json", merge),
            "PatchOptions",
            "fieldManager",
        ),
        (
            "manager too long",
            send(
                "PUT",
                format!("{web}?fieldManager={}", "m".repeat(129)),
                "application/json",
                br#"{"metadata":{"name":"web"}}"#,
            ),
            "UpdateOptions",
            "fieldManager",
        ),
    ];
    for (what, req, kind, field) in cases {
        let (status, _, body) = raw(&client, req).await;
        let v = json(&body);
        assert_eq!((status, v["reason"].as_str()), (422, Some("Invalid")), "{what}: {v}");
        assert_eq!(
            (v["details"]["kind"].as_str(), v["details"]["causes"][0]["field"].as_str()),
            (Some(kind), Some(field)),
            "{what}: {v}"
        );
    }
    let (status, _, body) =
        raw(&client, send("PATCH", format!("{web}?fieldManager=deployer"), "application/apply-patch+yaml", apply))
            .await;
    assert_eq!(status, 200, "an apply that names its manager: {}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_without_gaps() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    let a = api.create(&PostParams::default(), &serde_json::from_value(podset("a", 1)).unwrap()).await.unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &serde_json::from_value(podset("b", 1)).unwrap()).await.unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let mut stream = api.watch(&WatchParams::default().timeout(10), &rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.try_next().await.unwrap().expect("event") {
            WatchEvent::Added(p) => {
                seen.push(("ADDED", p.metadata.name.unwrap(), p.metadata.resource_version.unwrap()))
            }
            WatchEvent::Modified(p) => {
                seen.push(("MODIFIED", p.metadata.name.unwrap(), p.metadata.resource_version.unwrap()))
            }
            WatchEvent::Deleted(p) => {
                seen.push(("DELETED", p.metadata.name.unwrap(), p.metadata.resource_version.unwrap()))
            }
            other => panic!("{other:?}"),
        }
    }
    let kinds: Vec<(&str, &str)> = seen.iter().map(|(k, n, _)| (*k, n.as_str())).collect();
    assert_eq!(kinds, vec![("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]);
    let rvs: Vec<u64> = seen.iter().map(|(_, _, rv)| rv.parse().unwrap()).collect();
    assert!(rvs.windows(2).all(|w| w[1] == w[0] + 1) && rvs[0] == rv.parse::<u64>().unwrap() + 1, "{rvs:?}");

    // Live events follow the replay.
    api.create(&PostParams::default(), &serde_json::from_value(podset("c", 1)).unwrap()).await.unwrap();
    match stream.try_next().await.unwrap().expect("event") {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn watch_from_compacted_history_is_a_410_error_event() {
    let server = TestServer::start(&["--watch-history-events", "5", "--watch-history-seconds", "0"]);
    let api = api(&server);
    for i in 0..20 {
        api.create(&PostParams::default(), &serde_json::from_value(podset(&format!("p{i}"), 1)).unwrap())
            .await
            .unwrap();
    }
    let (status, _, body) = raw(
        &server.client(),
        get(&format!("{PODSETS}?watch=true&resourceVersion=2&timeoutSeconds=5")).body(vec![]).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let lines: Vec<serde_json::Value> =
        body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");
    assert!(lines[0]["object"]["message"].as_str().unwrap().starts_with("too old resource version: 2 ("));
    // kube-rs sees the same as an error event it can act on.
    let mut stream = api.watch(&WatchParams::default().timeout(5), "2").await.unwrap().boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
    // A list at an exact compacted revision is 410 too.
    let (status, _, _) = raw(
        &server.client(),
        get(&format!("{PODSETS}?resourceVersion=2&resourceVersionMatch=Exact")).body(vec![]).unwrap(),
    )
    .await;
    assert_eq!(status, 410);
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    for i in 0..25 {
        api.create(&PostParams::default(), &serde_json::from_value(podset(&format!("p{i:02}"), 1)).unwrap())
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(10)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    // Changes after the first page do not show up in later pages.
    api.delete("p15", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &serde_json::from_value(podset("p99", 1)).unwrap()).await.unwrap();
    let mut names: Vec<String> = first.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token {
        let page = api.list(&ListParams::default().limit(10).continue_token(&t)).await.unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()), "every page at one revision");
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        token = page.metadata.continue_.clone();
    }
    let expected: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    assert_eq!(names, expected);
}

#[tokio::test]
async fn expired_continue_token_is_410_with_a_fresh_token() {
    let server = TestServer::start(&["--watch-history-events", "3", "--watch-history-seconds", "0"]);
    let api = api(&server);
    for i in 0..6 {
        api.create(&PostParams::default(), &serde_json::from_value(podset(&format!("p{i}"), 1)).unwrap())
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    for i in 0..6 {
        api.patch(&format!("p{i}"), &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}})))
            .await
            .unwrap();
    }
    let (status, _, body) =
        raw(&server.client(), get(&format!("{PODSETS}?limit=2&continue={token}")).body(vec![]).unwrap()).await;
    assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
    let v = json(&body);
    assert_eq!(v["reason"], "Expired");
    let fresh = v["metadata"]["continue"].as_str().expect("inconsistent continue token").to_owned();
    let rest = api.list(&ListParams::default().limit(10).continue_token(&fresh)).await.unwrap();
    let names: Vec<String> = rest.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, vec!["p2", "p3", "p4", "p5"]);
}

async fn read_events(client: &kube::Client, path: &str, accept: Option<&str>) -> Vec<serde_json::Value> {
    let mut req = get(path);
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let (status, _, body) = raw(client, req.body(vec![]).unwrap()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect()
}

#[tokio::test]
async fn label_filtered_watch_sees_objects_move_in_and_out() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    let a = api.create(&PostParams::default(), &serde_json::from_value(podset("a", 1)).unwrap()).await.unwrap();
    let rv = a.metadata.resource_version.unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}})))
        .await
        .unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 3}}))).await.unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": null}}})))
        .await
        .unwrap();
    let events = read_events(
        &server.client(),
        &format!("{PODSETS}?watch=1&resourceVersion={rv}&labelSelector=tier%3Dgold&timeoutSeconds=1"),
        None,
    )
    .await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, vec!["ADDED", "MODIFIED", "DELETED"]);
    let last = &events[2]["object"];
    assert_eq!(last["metadata"]["labels"]["tier"], "gold", "DELETED carries the last state that matched");
    assert_eq!(last["metadata"]["resourceVersion"], (rv.parse::<u64>().unwrap() + 3).to_string());
}

#[tokio::test]
async fn watch_list_sends_initial_events_then_the_end_bookmark() {
    let server = TestServer::start(&[]);
    let api = api(&server);
    for n in ["a", "b"] {
        api.create(&PostParams::default(), &serde_json::from_value(podset(n, 1)).unwrap()).await.unwrap();
    }
    let events = read_events(
        &server.client(),
        &format!("{PODSETS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"),
        None,
    )
    .await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, vec!["ADDED", "ADDED", "BOOKMARK"]);
    let bm = &events[2]["object"];
    assert_eq!(bm["kind"], "PodSet");
    assert_eq!(bm["apiVersion"], "demo.k8s.io/v1alpha1");
    assert_eq!(bm["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    assert_eq!(bm["metadata"]["resourceVersion"], "2");
    // Without the required companions it is refused, never ignored.
    let (status, _, _) =
        raw(&server.client(), get(&format!("{PODSETS}?watch=1&sendInitialEvents=true")).body(vec![]).unwrap()).await;
    assert_eq!(status, 422);
    // kube-rs's streaming list works end to end.
    let wp = WatchParams::default().initial_events().timeout(1);
    let got: Vec<_> = api.watch(&wp, "").await.unwrap().boxed().take(3).try_collect().await.unwrap();
    assert!(matches!(got[2], WatchEvent::Bookmark(_)), "{got:?}");
}

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
const META: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

#[tokio::test]
async fn table_and_partial_metadata_on_get_list_and_watch() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let api = api(&server);
    api.create(&PostParams::default(), &serde_json::from_value(podset("web", 2)).unwrap()).await.unwrap();

    let (_, headers, body) = raw(&client, get(PODSETS).header("accept", TABLE).body(vec![]).unwrap()).await;
    assert_eq!(headers["content-type"], "application/json");
    let t = json(&body);
    assert_eq!((t["kind"].as_str(), t["apiVersion"].as_str()), (Some("Table"), Some("meta.k8s.io/v1")));
    let cols: Vec<&str> =
        t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(cols, vec!["Name", "Desired", "Current", "Ready", "Age", "Pods", "Selector"]);
    assert_eq!(t["rows"][0]["cells"][0], "web");
    assert_eq!(t["rows"][0]["cells"][1], 2);
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let (_, _, body) =
        raw(&client, get(&format!("{PODSETS}?includeObject=Object")).header("accept", TABLE).body(vec![]).unwrap())
            .await;
    assert_eq!(json(&body)["rows"][0]["object"]["kind"], "PodSet");

    let (_, _, body) = raw(&client, get(PODSETS).header("accept", META).body(vec![]).unwrap()).await;
    let m = json(&body);
    assert_eq!(m["kind"], "PartialObjectMetadataList");
    assert_eq!(m["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(m["items"][0]["metadata"]["name"], "web");
    assert!(m["items"][0].get("spec").is_none());
    let (_, _, body) = raw(&client, get(&format!("{PODSETS}/web")).header("accept", META).body(vec![]).unwrap()).await;
    assert_eq!(json(&body)["kind"], "PartialObjectMetadata");

    for (accept, kind) in [(TABLE, "Table"), (META, "PartialObjectMetadata")] {
        let events = read_events(&client, &format!("{PODSETS}?watch=1&timeoutSeconds=1"), Some(accept)).await;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(events[0]["object"]["kind"], kind);
        if kind == "Table" {
            assert_eq!(events[0]["object"]["rows"].as_array().unwrap().len(), 1);
        }
    }
    let (status, _, body) = raw(&client, get(PODSETS).header("accept", "application/yaml").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("kind: PodSetList"));
}

#[tokio::test]
async fn discovery_and_openapi() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let (status, headers, body) = raw(&client, get("/apis").header("accept", v2).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
    assert_eq!(headers["vary"], "Accept");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let d = json(&body);
    assert_eq!(d["kind"], "APIGroupDiscoveryList");
    assert_eq!(d["items"][0]["versions"][0]["resources"][0]["responseKind"]["kind"], "PodSet");
    let (status, _, _) =
        raw(&client, get("/apis").header("accept", v2).header("if-none-match", &etag).body(vec![]).unwrap()).await;
    assert_eq!(status, 304);
    let (_, headers, body) = raw(&client, get("/apis").body(vec![]).unwrap()).await;
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(json(&body)["kind"], "APIGroupList");
    let (_, _, body) = raw(&client, get("/apis/demo.k8s.io/v1alpha1").body(vec![]).unwrap()).await;
    assert_eq!(json(&body)["resources"][0]["shortNames"][0], "ps");

    let (_, _, body) = raw(&client, get("/openapi/v3").body(vec![]).unwrap()).await;
    let url = json(&body)["paths"]["apis/demo.k8s.io/v1alpha1"]["serverRelativeURL"].as_str().unwrap().to_owned();
    let (status, headers, body) = raw(&client, get(&url).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["cache-control"], "public, immutable");
    assert!(json(&body)["components"]["schemas"]["io.k8s.demo.v1alpha1.PodSet"].is_object());
    let (_, _, body) = raw(&client, get("/openapi/v2").body(vec![]).unwrap()).await;
    assert_eq!(json(&body)["swagger"], "2.0");
    for path in ["/healthz", "/livez", "/readyz", "/version"] {
        let (status, _, _) = raw(&client, get(path).body(vec![]).unwrap()).await;
        assert_eq!(status, 200, "{path}");
    }
}

#[tokio::test]
async fn generate_name_dry_run_finalizers_and_deletecollection() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let api = api(&server);
    let mut gen = podset("", 1);
    gen["metadata"] = json!({"generateName": "web-"});
    let created = api.create(&PostParams::default(), &serde_json::from_value(gen).unwrap()).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");

    let (status, _, body) = raw(
        &client,
        Request::post(format!("{PODSETS}?dryRun=All")).body(serde_json::to_vec(&podset("dry", 1)).unwrap()).unwrap(),
    )
    .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert!(json(&body)["metadata"]["resourceVersion"].is_null());
    assert_eq!(raw(&client, get(&format!("{PODSETS}/dry")).body(vec![]).unwrap()).await.0, 404);

    let mut fin = podset("held", 1);
    fin["metadata"]["finalizers"] = json!(["example.com/hold"]);
    api.create(&PostParams::default(), &serde_json::from_value(fin).unwrap()).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let held = api.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "marked, not removed");
    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert!(api.get_opt("held").await.unwrap().is_none(), "gone once the last finalizer is");

    // Foreground deletion leaves the garbage collector's finalizer.
    api.create(&PostParams::default(), &serde_json::from_value(podset("fg", 1)).unwrap()).await.unwrap();
    api.delete("fg", &DeleteParams::foreground()).await.unwrap();
    assert_eq!(api.get("fg").await.unwrap().metadata.finalizers, Some(vec!["foregroundDeletion".to_owned()]));

    api.create(&PostParams::default(), &serde_json::from_value(podset("x1", 1)).unwrap()).await.unwrap();
    api.create(&PostParams::default(), &serde_json::from_value(podset("x2", 1)).unwrap()).await.unwrap();
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("app in (x1,x2)")).await.unwrap();
    let left: Vec<String> =
        api.list(&ListParams::default()).await.unwrap().items.into_iter().map(|p| p.metadata.name.unwrap()).collect();
    assert!(!left.contains(&"x1".to_owned()) && !left.contains(&"x2".to_owned()) && left.contains(&name), "{left:?}");
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly_and_ends_watches() {
    let mut server = TestServer::start(&[]);
    let api = api(&server);
    let mut stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("watch ended");
    assert!(end.is_none() || end.unwrap().is_err());
}

#[tokio::test]
async fn periodic_bookmarks_carry_type_and_revision() {
    let server = TestServer::start(&["--watch-bookmark-interval", "1"]);
    let api = api(&server);
    api.create(&PostParams::default(), &serde_json::from_value(podset("a", 1)).unwrap()).await.unwrap();
    let events = read_events(
        &server.client(),
        &format!("{PODSETS}?watch=1&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=3"),
        None,
    )
    .await;
    let bookmarks: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "BOOKMARK").collect();
    assert!(bookmarks.len() >= 2, "{events:?}");
    for b in bookmarks {
        assert_eq!(b["object"]["kind"], "PodSet");
        assert_eq!(b["object"]["apiVersion"], "demo.k8s.io/v1alpha1");
        assert_eq!(b["object"]["metadata"]["resourceVersion"], "1");
    }
    // Without allowWatchBookmarks there are none.
    let events =
        read_events(&server.client(), &format!("{PODSETS}?watch=1&resourceVersion=1&timeoutSeconds=2"), None).await;
    assert!(events.is_empty(), "{events:?}");
}

#[tokio::test]
async fn yaml_in_and_out() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let yaml = b"apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata:\n  name: y\nspec:\n  replicas: 4\n".to_vec();
    let (status, _, body) =
        raw(&client, Request::post(PODSETS).header("content-type", "application/yaml").body(yaml).unwrap()).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let (status, headers, body) =
        raw(&client, get(&format!("{PODSETS}/y")).header("accept", "application/yaml").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/yaml");
    let v: serde_json::Value = serde_yaml::from_slice(&body).unwrap();
    assert_eq!(v["spec"]["replicas"], 4);
}

#[tokio::test]
async fn http2_by_alpn() {
    use http_body_util::BodyExt;
    let server = TestServer::start(&[]);
    let tls = server.h2_tls().await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req =
        Request::get(format!("https://localhost{PODSETS}")).body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(json(&body)["kind"], "PodSetList");
}

#[tokio::test]
async fn delete_answers_status_when_gone_and_the_object_while_finalized() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let api = api(&server);
    let a = api.create(&PostParams::default(), &serde_json::from_value(podset("a", 1)).unwrap()).await.unwrap();
    let (status, _, body) = raw(&client, Request::delete(format!("{PODSETS}/a")).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    let v = json(&body);
    assert_eq!((v["kind"].as_str(), v["status"].as_str()), (Some("Status"), Some("Success")));
    assert_eq!(v["details"]["kind"], "podsets");
    assert_eq!(v["details"]["uid"].as_str(), a.metadata.uid.as_deref());

    let mut held = podset("held", 1);
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    api.create(&PostParams::default(), &serde_json::from_value(held).unwrap()).await.unwrap();
    let (status, _, body) = raw(&client, Request::delete(format!("{PODSETS}/held")).body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    let v = json(&body);
    assert_eq!(v["kind"], "PodSet");
    assert!(v["metadata"]["deletionTimestamp"].is_string());
}
