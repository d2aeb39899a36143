//! Two versions of one API: `v1beta1` beside `v1alpha1`, over one storage and one resourceVersion sequence. On
//! the wire straight to the server (conversion of reads, writes, patches, applies, lists; the storage version and
//! objects stored in the other), then through kube-apiserver's aggregator with kubectl 1.37 (the preferred
//! version, `explain` per version) and the controller's `availableReplicas` under `minReadySeconds`.

mod common;

use common::cluster::{eventually, in_namespace, runtime};
use common::*;
use http::Request;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

const ALPHA: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
const BETA: &str = "/apis/demo.k8s.io/v1beta1/namespaces/default/podsets";
const MIN_READY: &str = "demo.k8s.io/v1beta1-min-ready-seconds";

fn beta(name: &str) -> Value {
    json!({
        "apiVersion": "demo.k8s.io/v1beta1",
        "kind": "PodSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "minReadySeconds": 30, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    })
}

async fn send(client: &kube::Client, method: &str, path: &str, content_type: &str, body: Value) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let (status, _, body) = raw(client, req).await;
    (status, json(&body))
}

async fn read(client: &kube::Client, path: &str) -> Value {
    let (status, _, body) = raw(client, Request::get(path).body(vec![]).unwrap()).await;
    assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    json(&body)
}

/// A metric's value from the server's `/metrics`.
async fn metric(server: &TestServer, name: &str) -> f64 {
    let (_, _, metrics) = raw(&server.client(), Request::get("/metrics").body(vec![]).unwrap()).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    let line = metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned));
    line.unwrap_or_else(|| panic!("{name} missing:\n{metrics}")).parse::<f64>().unwrap()
}

/// Waits (up to 30 s) until the metric `name` reads `want`.
async fn metric_reaches(server: &TestServer, name: &str, want: f64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = metric(server, name).await;
        if got == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{name} is {got}, not {want}:\n{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_reads_and_writes_the_same_objects() {
    let server = TestServer::start(&[]);
    let client = server.client();

    // Written in v1beta1, read in both: v1alpha1 carries minReadySeconds in its annotation.
    let (status, created) = send(&client, "POST", BETA, "application/json", beta("web")).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["apiVersion"], "demo.k8s.io/v1beta1");
    let alpha = read(&client, &format!("{ALPHA}/web")).await;
    assert_eq!(alpha["apiVersion"], "demo.k8s.io/v1alpha1");
    assert_eq!(alpha["metadata"]["annotations"][MIN_READY], "30");
    assert_eq!(alpha["spec"].get("minReadySeconds"), None);
    assert_eq!(alpha["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"], "one object");

    // A v1alpha1 client that writes back what it read keeps the value; one that changes the annotation changes it.
    let (status, put) = send(&client, "PUT", &format!("{ALPHA}/web"), "application/json", alpha.clone()).await;
    assert_eq!(status, 200, "{put}");
    assert_eq!(put["metadata"]["resourceVersion"], alpha["metadata"]["resourceVersion"], "nothing changed");
    let patch = json!({"metadata": {"annotations": {MIN_READY: "45"}}});
    let (status, patched) =
        send(&client, "PATCH", &format!("{ALPHA}/web"), "application/merge-patch+json", patch).await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(read(&client, &format!("{BETA}/web")).await["spec"]["minReadySeconds"], 45);

    // What each version refuses.
    let mut no_selector = beta("bare");
    no_selector["spec"].as_object_mut().unwrap().remove("selector");
    let (status, body) = send(&client, "POST", BETA, "application/json", no_selector.clone()).await;
    assert_eq!((status, body["reason"].as_str()), (422, Some("Invalid")), "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.selector", "{body}");
    assert_eq!(body["details"]["causes"][0]["reason"], "FieldValueRequired", "{body}");
    // The same object in v1alpha1 gets its selector from the template's labels.
    no_selector["apiVersion"] = json!("demo.k8s.io/v1alpha1");
    no_selector["spec"].as_object_mut().unwrap().remove("minReadySeconds");
    no_selector["metadata"]["annotations"] = json!({MIN_READY: "5"});
    let (status, body) =
        send(&client, "POST", &format!("{ALPHA}?fieldManager=alpha-client"), "application/json", no_selector).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["spec"]["selector"]["matchLabels"]["app"], "bare");
    // The creator's fields are recorded in the version it wrote, named as that version names them.
    let entry = &body["metadata"]["managedFields"][0];
    assert_eq!(
        (entry["manager"].as_str(), entry["apiVersion"].as_str()),
        (Some("alpha-client"), Some("demo.k8s.io/v1alpha1"))
    );
    assert!(entry["fieldsV1"]["f:metadata"]["f:annotations"].get(format!("f:{MIN_READY}")).is_some(), "{entry}");
    assert!(entry["fieldsV1"]["f:spec"].get("f:minReadySeconds").is_none(), "{entry}");
    let beta_read = read(&client, &format!("{BETA}/bare")).await;
    assert_eq!(
        beta_read["metadata"]["managedFields"], body["metadata"]["managedFields"],
        "as recorded, in any version"
    );
    // Another manager writing through v1beta1 leaves the creator's entry in v1alpha1, fields named as it names them.
    let patch = json!({"spec": {"replicas": 3}});
    let path = format!("{BETA}/bare?fieldManager=beta-client");
    let (status, patched) = send(&client, "PATCH", &path, "application/merge-patch+json", patch).await;
    assert_eq!(status, 200, "{patched}");
    let entry = |m: &str| {
        patched["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == m).unwrap().clone()
    };
    assert_eq!(entry("beta-client")["apiVersion"], "demo.k8s.io/v1beta1");
    assert_eq!(entry("beta-client")["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    let creator = entry("alpha-client");
    assert_eq!(creator["apiVersion"], "demo.k8s.io/v1alpha1");
    assert!(creator["fieldsV1"]["f:metadata"]["f:annotations"].get(format!("f:{MIN_READY}")).is_some(), "{creator}");
    assert!(creator["fieldsV1"]["f:spec"].get("f:replicas").is_none(), "taken over by beta-client: {creator}");

    let mut unknown = beta("strict");
    unknown["apiVersion"] = json!("demo.k8s.io/v1alpha1");
    let (status, body) =
        send(&client, "POST", &format!("{ALPHA}?fieldValidation=Strict"), "application/json", unknown).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("unknown field \"spec.minReadySeconds\""), "{body}");

    let mut annotated = beta("annotated");
    annotated["metadata"]["annotations"] = json!({MIN_READY: "5"});
    let (status, body) = send(&client, "POST", BETA, "application/json", annotated).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], format!("metadata.annotations[{MIN_READY}]"), "{body}");

    let (status, body) = send(
        &client,
        "POST",
        BETA,
        "application/json",
        json!({"apiVersion": "demo.k8s.io/v1alpha1",
        "kind": "PodSet", "metadata": {"name": "x"}}),
    )
    .await;
    assert_eq!(status, 400, "a body must be in the URL's version: {body}");

    // Server-side apply: fields are owned where the object keeps them, whichever version the applier used.
    let apply = |v: &str, config: Value| {
        let manager = config["m"].as_str().unwrap().to_owned();
        let force = config.get("force").is_some();
        let path = format!("/apis/demo.k8s.io/{v}/namespaces/default/podsets/web?fieldManager={manager}&force={force}");
        let mut config = config;
        config.as_object_mut().unwrap().remove("m");
        config.as_object_mut().unwrap().remove("force");
        let client = client.clone();
        async move { send(&client, "PATCH", &path, "application/apply-patch+yaml", config).await }
    };
    // Taking the field over from the writes above (recorded for the manager with no name).
    let mine = json!({"m": "beta-tool", "force": true, "apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
                      "metadata": {"name": "web"}, "spec": {"minReadySeconds": 60}});
    let (status, body) = apply("v1beta1", mine).await;
    assert_eq!(status, 200, "{body}");
    let theirs = json!({"m": "alpha-tool", "apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
                        "metadata": {"name": "web", "annotations": {MIN_READY: "90"}}});
    let (status, body) = apply("v1alpha1", theirs).await;
    assert_eq!(status, 409, "the same field, owned by beta-tool through v1beta1: {body}");
    assert!(body["message"].as_str().unwrap().contains("conflict with \"beta-tool\""), "{body}");

    // Lists and their kinds, per version; an object with nothing to convert but its apiVersion too.
    let mut plain = beta("plain");
    plain["spec"].as_object_mut().unwrap().remove("minReadySeconds");
    assert_eq!(send(&client, "POST", BETA, "application/json", plain).await.0, 201);
    let mut lists = Vec::new();
    for (path, version) in [(ALPHA, "v1alpha1"), (BETA, "v1beta1")] {
        let list = read(&client, path).await;
        assert_eq!(list["apiVersion"], format!("demo.k8s.io/{version}"));
        assert!(list["items"].as_array().unwrap().iter().all(|i| i["apiVersion"] == format!("demo.k8s.io/{version}")));
        lists.push(list);
    }
    for (a, b) in lists[0]["items"].as_array().unwrap().iter().zip(lists[1]["items"].as_array().unwrap()) {
        assert_eq!(a, &read(&client, &format!("{ALPHA}/{}", a["metadata"]["name"].as_str().unwrap())).await);
        assert_eq!(b, &read(&client, &format!("{BETA}/{}", b["metadata"]["name"].as_str().unwrap())).await);
    }
    let group = read(&client, "/apis/demo.k8s.io").await;
    assert_eq!(group["preferredVersion"]["version"], "v1beta1");
}

/// The events of one watch, read until the server ends it at `timeoutSeconds`.
async fn watch_events(client: kube::Client, path: String) -> Vec<Value> {
    let (status, _, body) = raw(&client, Request::get(path).body(vec![]).unwrap()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect()
}

/// What an event is, apart from its version: type, name, resourceVersion, and the object with the one field that
/// differs between the versions moved to where v1beta1 keeps it.
fn in_common(event: &Value) -> (String, Value) {
    let mut object = event["object"].clone();
    object.as_object_mut().unwrap().remove("apiVersion");
    let metadata = object["metadata"].as_object_mut().unwrap();
    let annotations = metadata.get_mut("annotations").and_then(Value::as_object_mut);
    let seconds = annotations.and_then(|a| a.remove(MIN_READY));
    if metadata.get("annotations").and_then(Value::as_object).is_some_and(|a| a.is_empty()) {
        metadata.remove("annotations");
    }
    if let Some(v) = seconds {
        object["spec"]["minReadySeconds"] = json!(v.as_str().unwrap().parse::<i64>().unwrap());
    }
    (event["type"].as_str().unwrap().to_owned(), object)
}

/// A watch opened in each version at once sees every change once, in order, each in its own version, whichever
/// version the writer used; a watch resumed in the other version from a resourceVersion one of them saw goes on
/// from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_in_each_version_sees_every_change_once_in_order() {
    let server = TestServer::start(&[]);
    let client = server.client();
    let start = read(&client, BETA).await["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let watch = |collection: &str, from: &str| {
        let path = format!("{collection}?watch=1&resourceVersion={from}&timeoutSeconds=4");
        tokio::spawn(watch_events(client.clone(), path))
    };
    let (alpha_watch, beta_watch) = (watch(ALPHA, &start), watch(BETA, &start));

    let mut alpha = beta("a");
    alpha["apiVersion"] = json!("demo.k8s.io/v1alpha1");
    alpha["spec"].as_object_mut().unwrap().remove("minReadySeconds");
    alpha["metadata"]["annotations"] = json!({MIN_READY: "5"});
    let a = |v: &str| format!("/apis/demo.k8s.io/{v}/namespaces/default/podsets/a");
    let b = |v: &str| format!("/apis/demo.k8s.io/{v}/namespaces/default/podsets/b");
    let (status, created) = send(&client, "POST", ALPHA, "application/json", alpha).await;
    assert_eq!(status, 201, "{created}");
    let mut b_written = beta("b");
    b_written["spec"]["replicas"] = json!(0);
    let writes: Vec<(&str, String, &str, Value)> = vec![
        ("POST", BETA.to_owned(), "application/json", b_written),
        ("PATCH", a("v1beta1"), "application/merge-patch+json", json!({"spec": {"minReadySeconds": 7}})),
        (
            "PATCH",
            format!("{}/status", a("v1alpha1")),
            "application/merge-patch+json",
            json!({"status": {"replicas": 1}}),
        ),
        ("PATCH", format!("{}/scale", b("v1alpha1")), "application/merge-patch+json", json!({"spec": {"replicas": 2}})),
        (
            "PATCH",
            format!("{}?fieldManager=tool", a("v1beta1")),
            "application/apply-patch+yaml",
            json!({"apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet", "metadata": {"name": "a", "labels": {"tier": "web"}}}),
        ),
        ("DELETE", b("v1alpha1"), "application/json", json!({})),
        ("DELETE", a("v1beta1"), "application/json", json!({})),
    ];
    // The resourceVersion each write answered (a deletion answers a Status: its event tells).
    let mut rvs = vec![created["metadata"]["resourceVersion"].as_str().map(str::to_owned)];
    for (method, path, content_type, body) in writes {
        let (status, answer) = send(&client, method, &path, content_type, body).await;
        assert_eq!(status, if method == "POST" { 201 } else { 200 }, "{method} {path}: {answer}");
        // A /scale answer is the Scale; its resourceVersion is the PodSet's.
        rvs.push(answer["metadata"]["resourceVersion"].as_str().map(str::to_owned));
        assert_eq!(rvs.last().unwrap().is_none(), method == "DELETE", "{method} {path}: {answer}");
    }

    let (alpha_events, beta_events) = (alpha_watch.await.unwrap(), beta_watch.await.unwrap());
    for (version, events) in [("v1alpha1", &alpha_events), ("v1beta1", &beta_events)] {
        let seen: Vec<&str> =
            events.iter().map(|e| e["object"]["metadata"]["resourceVersion"].as_str().unwrap()).collect();
        assert_eq!(seen.len(), rvs.len(), "{version}: every change once: {events:#?}");
        for (i, (seen, answered)) in seen.iter().zip(&rvs).enumerate() {
            assert!(answered.as_deref().is_none_or(|a| a == *seen), "{version}: event {i} at {seen}, not {answered:?}");
        }
        let numbers: Vec<u64> = seen.iter().map(|rv| rv.parse().unwrap()).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{version}: in order: {numbers:?}");
        let api_versions: Vec<&str> = events.iter().map(|e| e["object"]["apiVersion"].as_str().unwrap()).collect();
        assert!(api_versions.iter().all(|v| *v == format!("demo.k8s.io/{version}")), "{api_versions:?}");
    }
    let types: Vec<&str> = beta_events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED", "DELETED"]);
    for (x, y) in alpha_events.iter().zip(&beta_events) {
        assert_eq!(in_common(x), in_common(y), "the same change in both versions");
    }
    assert_eq!(beta_events[2]["object"]["spec"]["minReadySeconds"], 7);
    assert_eq!(alpha_events[2]["object"]["metadata"]["annotations"][MIN_READY], "7");

    // Resumed in the other version from what the v1alpha1 watch saw third.
    let from = rvs[2].as_deref().unwrap();
    let resumed = watch_events(client.clone(), format!("{BETA}?watch=1&resourceVersion={from}&timeoutSeconds=1")).await;
    assert_eq!(resumed, beta_events[3..], "the same events from there on");
}

/// Every write is validated in the version it was made in, whatever the storage version: a v1beta1 write of a
/// negative `minReadySeconds`, or of v1alpha1's annotation, is refused by every verb as a v1beta1 create is (read
/// in the storage version, v1alpha1's annotation would have stood for the field), and nothing is stored; through
/// v1alpha1 the annotation is the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_is_validated_in_its_own_version_whatever_the_storage_version() {
    let annotation = format!("metadata.annotations[{MIN_READY}]");
    for storage in ["v1alpha1", "v1beta1"] {
        let server = TestServer::start(&[&format!("--storage-version={storage}")]);
        let client = server.client();
        let (status, body) = send(&client, "POST", BETA, "application/json", beta("base")).await;
        assert_eq!(status, 201, "{body}");
        for (field, set, op) in [
            (
                "spec.minReadySeconds",
                json!({"spec": {"minReadySeconds": -5}}),
                json!({"op": "add", "path": "/spec/minReadySeconds", "value": -5}),
            ),
            (
                annotation.as_str(),
                json!({"metadata": {"annotations": {MIN_READY: "7"}}}),
                json!({"op": "add", "path": "/metadata/annotations", "value": {MIN_READY: "7"}}),
            ),
        ] {
            let change = |mut ps: Value| {
                json_patch::merge(&mut ps, &set);
                ps
            };
            let apply = "application/apply-patch+yaml";
            let cases = [
                ("create", "POST", BETA.to_owned(), "application/json", change(beta("new"))),
                (
                    "apply that creates",
                    "PATCH",
                    format!("{BETA}/applied?fieldManager=t"),
                    apply,
                    change(beta("applied")),
                ),
                (
                    "update",
                    "PUT",
                    format!("{BETA}/base"),
                    "application/json",
                    change(read(&client, &format!("{BETA}/base")).await),
                ),
                ("merge patch", "PATCH", format!("{BETA}/base"), "application/merge-patch+json", set.clone()),
                ("json patch", "PATCH", format!("{BETA}/base"), "application/json-patch+json", json!([op])),
                ("apply", "PATCH", format!("{BETA}/base?fieldManager=t&force=true"), apply, change(beta("base"))),
            ];
            for (verb, method, path, content_type, body) in cases {
                let (status, answer) = send(&client, method, &path, content_type, body).await;
                assert_eq!(status, 422, "{verb} of {field} on storage {storage}: {answer}");
                assert_eq!(answer["reason"], "Invalid", "{answer}");
                let causes = answer["details"]["causes"].as_array().unwrap();
                assert!(causes.iter().any(|c| c["field"] == field), "{verb} on storage {storage}: {answer}");
            }
        }
        let base = read(&client, &format!("{BETA}/base")).await;
        assert_eq!(base["spec"]["minReadySeconds"], 30, "nothing stored");
        assert_eq!(base["metadata"]["generation"], 1, "nothing stored");
        for name in ["new", "applied"] {
            let (status, _, _) = raw(&client, Request::get(format!("{BETA}/{name}")).body(vec![]).unwrap()).await;
            assert_eq!(status, 404, "{name} on storage {storage}");
        }
        // Through v1alpha1, its annotation is the field, by apply as by create.
        let mut alpha = beta("old");
        alpha["apiVersion"] = json!("demo.k8s.io/v1alpha1");
        alpha["spec"].as_object_mut().unwrap().remove("minReadySeconds");
        alpha["metadata"]["annotations"] = json!({MIN_READY: "7"});
        let path = format!("{ALPHA}/old?fieldManager=t");
        let (status, body) = send(&client, "PATCH", &path, "application/apply-patch+yaml", alpha).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(read(&client, &format!("{BETA}/old")).await["spec"]["minReadySeconds"], 7);
    }
}

/// Objects stored in v1alpha1 (the default storage version) stay readable after the storage version becomes
/// v1beta1, and the migration pass at start rewrites them in v1beta1 (progress in its metrics, counted over the
/// whole store); after it, writing them back unchanged changes nothing. Back on the default (a rollback's first
/// step), they are rewritten in v1alpha1 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_stored_in_the_older_version_are_migrated() {
    let mut old = TestServer::start(&[]);
    let client = old.client();
    let mut ps = beta("kept");
    ps["spec"]["minReadySeconds"] = json!(12);
    let (status, body) = send(&client, "POST", BETA, "application/json", ps).await;
    assert_eq!(status, 201, "{body}");
    let stored_rv = body["metadata"]["resourceVersion"].clone();
    // Stored in v1alpha1: a v1alpha1 read is the stored bytes, annotation included.
    let (_, _, stored) = raw(&client, Request::get(format!("{ALPHA}/kept")).body(vec![]).unwrap()).await;
    assert_eq!(json(&stored)["metadata"]["annotations"][MIN_READY], "12");
    assert_eq!(metric(&old, "podset_storage_history_bytes").await, stored.len() as f64, "kept as v1alpha1 JSON");
    metric_reaches(&old, "podset_storage_version_objects{version=\"v1alpha1\"}", 1.0).await;
    metric_reaches(&old, "podset_storage_migration_remaining", 0.0).await;
    old.terminate();

    let args = |storage: &str| vec!["--insecure-allow-all".into(), format!("--storage-version={storage}")];
    let mut new = TestServer::start_in(old.data_dir.clone(), None, args("v1beta1"));
    let client = new.client();
    metric_reaches(&new, "podset_storage_migration_migrated_total", 1.0).await;
    metric_reaches(&new, "podset_storage_migration_remaining", 0.0).await;
    metric_reaches(&new, "podset_storage_version_objects{version=\"v1beta1\"}", 1.0).await;
    metric_reaches(&new, "podset_storage_version_objects{version=\"v1alpha1\"}", 0.0).await;
    assert!(new.log_contains("storage migration done"));
    let migrated = read(&client, &format!("{BETA}/kept")).await;
    assert_eq!(migrated["spec"]["minReadySeconds"], 12);
    assert_ne!(migrated["metadata"]["resourceVersion"], stored_rv, "rewritten in the storage version");
    let (status, again) = send(&client, "PUT", &format!("{BETA}/kept"), "application/json", migrated.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["metadata"]["resourceVersion"], migrated["metadata"]["resourceVersion"], "now a no-op");
    assert_eq!(read(&client, &format!("{ALPHA}/kept")).await["metadata"]["annotations"][MIN_READY], "12");
    new.terminate();

    // Back on v1alpha1: rewritten in it, the field in its annotation, as a build that serves only v1alpha1 reads.
    let back = TestServer::start_in(new.data_dir.clone(), None, args("v1alpha1"));
    let client = back.client();
    metric_reaches(&back, "podset_storage_version_objects{version=\"v1alpha1\"}", 1.0).await;
    metric_reaches(&back, "podset_storage_migration_remaining", 0.0).await;
    let (_, _, stored) = raw(&client, Request::get(format!("{ALPHA}/kept")).body(vec![]).unwrap()).await;
    assert_eq!(json(&stored)["metadata"]["annotations"][MIN_READY], "12");
    assert_eq!(metric(&back, "podset_storage_migration_migrated_total").await, 1.0, "rewritten once more");
}

#[test]
fn through_the_aggregator_kubectl_prefers_v1beta1_and_the_controller_counts_available_pods() {
    in_namespace("through_the_aggregator_kubectl_prefers_v1beta1_and_the_controller_counts_available_pods", || {
        let c = common::cluster::start();
        // A v1alpha1 manifest as users have them, applied as before.
        let manifest = "apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata:\n  name: web\n  namespace: default\n  annotations:\n    demo.k8s.io/v1beta1-min-ready-seconds: \"3600\"\nspec:\n  replicas: 1\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      automountServiceAccountToken: false\n      containers: [{name: main, image: busybox}]\n";
        c.apply_text("web.yaml", manifest);
        let preferred: Value = serde_json::from_str(&c.kubectl(&["get", "podsets", "web", "-o", "json"])).unwrap();
        assert_eq!(preferred["apiVersion"], "demo.k8s.io/v1beta1");
        assert_eq!(preferred["spec"]["minReadySeconds"], 3600);
        let alpha: Value =
            serde_json::from_str(&c.kubectl(&["get", "podsets.v1alpha1.demo.k8s.io", "web", "-o", "json"])).unwrap();
        assert_eq!(alpha["apiVersion"], "demo.k8s.io/v1alpha1");
        assert_eq!(alpha["metadata"]["annotations"][MIN_READY], "3600");

        let explain = c.kubectl(&["explain", "podsets.spec.minReadySeconds", "--api-version=demo.k8s.io/v1beta1"]);
        assert!(explain.contains("available"), "{explain}");
        let missing = c.kubectl_try(&["explain", "podsets.spec.minReadySeconds", "--api-version=demo.k8s.io/v1alpha1"]);
        assert!(missing.is_err(), "v1alpha1 has no spec.minReadySeconds: {missing:?}");
        // v1beta1 requires a selector, v1alpha1 defaults it: each version's OpenAPI says so, and so kubectl.
        let selector_line = |version: &str| {
            let spec = c.kubectl(&["explain", "podsets.spec", &format!("--api-version=demo.k8s.io/{version}")]);
            let line = spec.lines().find(|l| l.trim_start().starts_with("selector")).map(str::to_owned);
            line.unwrap_or_else(|| panic!("no selector in {version}'s explain:\n{spec}"))
        };
        assert!(selector_line("v1beta1").contains("-required-"), "{}", selector_line("v1beta1"));
        assert!(!selector_line("v1alpha1").contains("-required-"), "{}", selector_line("v1alpha1"));

        // Discovery through the aggregator: one storageVersionHash for podsets in both versions, the storage
        // version's (v1alpha1 by default), as k8s.io/apiserver computes it.
        for version in ["v1beta1", "v1alpha1"] {
            let list: Value =
                serde_json::from_str(&c.kubectl(&["get", "--raw", &format!("/apis/demo.k8s.io/{version}")])).unwrap();
            let hashes: Vec<&Value> =
                list["resources"].as_array().unwrap().iter().map(|r| &r["storageVersionHash"]).collect();
            assert_eq!(hashes, [&json!("Yd5hXh3MgaM="), &Value::Null, &Value::Null], "{version}: {list}");
        }

        // Stored in v1alpha1, a v1beta1 server-side apply is still validated as v1beta1: refused as a create is.
        let bad = "apiVersion: demo.k8s.io/v1beta1\nkind: PodSet\nmetadata: {name: bad, namespace: default}\nspec:\n  minReadySeconds: -5\n  selector: {matchLabels: {app: bad}}\n  template:\n    metadata: {labels: {app: bad}}\n    spec: {containers: [{name: main, image: busybox}]}\n";
        let path = std::env::temp_dir().join(format!("bad-podset-{}.yaml", std::process::id()));
        std::fs::write(&path, bad).unwrap();
        let file = path.to_str().unwrap();
        let created = c.kubectl_try(&["create", "-f", file]).expect_err("create of minReadySeconds -5");
        let applied = c.kubectl_try(&["apply", "--server-side", "-f", file]).expect_err("apply of minReadySeconds -5");
        let cause = "spec.minReadySeconds: Invalid value: -5: must be greater than or equal to 0";
        assert!(created.contains(cause) && applied.contains(cause), "create: {created}\napply: {applied}");
        assert!(c.kubectl_try(&["get", "podsets", "bad"]).is_err(), "nothing stored");

        let watched = c.kubectl(&[
            "get",
            "--raw",
            "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets?watch=1&timeoutSeconds=1",
        ]);
        let event: Value = serde_json::from_str(watched.lines().next().unwrap()).unwrap();
        assert_eq!(
            (event["type"].as_str(), event["object"]["apiVersion"].as_str()),
            (Some("ADDED"), Some("demo.k8s.io/v1alpha1"))
        );

        // The same round trip on kube-apiserver's own two-version type: autoscaling/v1 keeps v2beta2's metrics in an
        // annotation, as v1alpha1 keeps minReadySeconds. Each is created in its newer version, read in the older
        // (the annotation, not the field), written back from there, and read again in the newer: nothing lost.
        let hpa = "apiVersion: autoscaling/v2beta2\nkind: HorizontalPodAutoscaler\nmetadata: {name: web, namespace: default}\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}\n  minReplicas: 1\n  maxReplicas: 3\n  metrics:\n  - type: Resource\n    resource: {name: memory, target: {type: AverageValue, averageValue: 100Mi}}\n";
        let ps = "apiVersion: demo.k8s.io/v1beta1\nkind: PodSet\nmetadata: {name: trip, namespace: default}\nspec:\n  replicas: 0\n  minReadySeconds: 45\n  selector: {matchLabels: {app: trip}}\n  template:\n    metadata: {labels: {app: trip}}\n    spec: {containers: [{name: main, image: busybox}]}\n";
        let cases = [
            (
                "hpa",
                hpa,
                "horizontalpodautoscalers.v1.autoscaling/web",
                "horizontalpodautoscalers.v2beta2.autoscaling/web",
                "autoscaling.alpha.kubernetes.io/metrics",
                "/spec/metrics/0/resource/name",
            ),
            (
                "podset",
                ps,
                "podsets.v1alpha1.demo.k8s.io/trip",
                "podsets.v1beta1.demo.k8s.io/trip",
                MIN_READY,
                "/spec/minReadySeconds",
            ),
        ];
        for (name, newer, old_ref, new_ref, annotation, field) in cases {
            c.apply_text(&format!("{name}.yaml"), newer);
            let before: Value = serde_json::from_str(&c.kubectl(&["get", new_ref, "-o", "json"])).unwrap();
            let old: Value = serde_json::from_str(&c.kubectl(&["get", old_ref, "-o", "json"])).unwrap();
            assert!(
                old["metadata"]["annotations"][annotation].is_string(),
                "{name}: the older version's annotation: {old}"
            );
            assert!(old.pointer(field).is_none(), "{name}: not a field of the older version: {old}");
            let file = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
            std::fs::write(&file, old.to_string()).unwrap();
            c.kubectl(&["replace", "-f", file.to_str().unwrap()]);
            let after: Value = serde_json::from_str(&c.kubectl(&["get", new_ref, "-o", "json"])).unwrap();
            assert!(before.pointer(field).is_some(), "{name}: {before}");
            assert_eq!(
                after.pointer(field),
                before.pointer(field),
                "{name}: kept through a write in the older version"
            );
            let kept = after["metadata"]["annotations"].get(annotation);
            assert!(kept.is_none(), "{name}: the annotation is the older version's only: {after}");
        }

        runtime().block_on(async {
            let client = c.client().await;
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let podsets: Api<DynamicObject> = Api::namespaced_with(
                client.clone(),
                "default",
                &kube::discovery::ApiResource {
                    group: "demo.k8s.io".into(),
                    version: "v1beta1".into(),
                    api_version: "demo.k8s.io/v1beta1".into(),
                    kind: "PodSet".into(),
                    plural: "podsets".into(),
                },
            );
            eventually("the Pod", || async { pods.list(&ListParams::default().labels("app=web")).await.unwrap().items.len() == 1 }).await;
            let pod = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items.remove(0);
            let name = pod.metadata.name.clone().unwrap();
            let now = jiff::Timestamp::now().to_string();
            let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            let counts = || async {
                let status = podsets.get("web").await.unwrap().data["status"].clone();
                (status["readyReplicas"].as_i64().unwrap_or(0), status["availableReplicas"].as_i64().unwrap_or(0))
            };
            eventually("ready, not yet available (minReadySeconds 3600)", || async { counts().await == (1, 0) }).await;
            let ps = podsets.get("web").await.unwrap().data;
            let ready = ps["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
            assert_eq!((ready["status"].as_str(), ready["message"].as_str()), (Some("False"), Some("Available: 0/1")));
            let patch = json!({"spec": {"minReadySeconds": 0}});
            podsets.patch("web", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
            eventually("available at once with minReadySeconds 0", || async { counts().await == (1, 1) }).await;
        });
    });
}

/// Made by hack/make-upgrade-fixture.sh with the last build that served only v1alpha1 (its `VERSION` file).
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1alpha1-release");

fn without_resource_version(mut item: Value) -> Value {
    item["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    item
}

/// `namespace/name` of each item of a list.
fn by_name(list: &Value) -> std::collections::BTreeMap<String, Value> {
    let items = list["items"].as_array().unwrap().iter().cloned();
    items
        .map(|i| {
            (format!("{}/{}", i["metadata"]["namespace"].as_str().unwrap(), i["metadata"]["name"].as_str().unwrap()), i)
        })
        .collect()
}

/// This build on a store the previous build wrote (what it served then in `served`), with the default storage
/// version (v1alpha1: nothing to rewrite) or v1beta1 (`migrated`: every object rewritten in it): read in v1alpha1
/// as that build served it (but the resourceVersion when the migration rewrote it), in v1beta1 with the
/// annotation as the field; still writable, a pending deletion finishing.
async fn serves_what_the_previous_build_served(server: &TestServer, served: &str, migrated: bool) {
    let client = server.client();
    let before =
        by_name(&serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/{served}")).unwrap()).unwrap());
    assert_eq!(before.len(), 7, "{before:#?}");
    let (storage, other) = if migrated { ("v1beta1", "v1alpha1") } else { ("v1alpha1", "v1beta1") };
    metric_reaches(server, &format!("podset_storage_version_objects{{version=\"{storage}\"}}"), 7.0).await;
    metric_reaches(server, &format!("podset_storage_version_objects{{version=\"{other}\"}}"), 0.0).await;
    metric_reaches(server, "podset_storage_migration_remaining", 0.0).await;
    let rewritten = metric(server, "podset_storage_migration_migrated_total").await;
    assert_eq!(rewritten, if migrated { 7.0 } else { 0.0 });

    let alpha = by_name(&read(&client, "/apis/demo.k8s.io/v1alpha1/podsets").await);
    assert_eq!(alpha.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    for (key, was) in &before {
        let now = &alpha[key];
        match migrated {
            true => {
                let (now, was) = (without_resource_version(now.clone()), without_resource_version(was.clone()));
                assert_eq!(now, was, "{key} in v1alpha1");
            }
            false => assert_eq!(now, was, "{key} in v1alpha1: as stored, resourceVersion and all"),
        }
        let same_rv = now["metadata"]["resourceVersion"] == was["metadata"]["resourceVersion"];
        assert_eq!(same_rv, !migrated, "{key}: rewritten only by a migration");
    }
    let betas = by_name(&read(&client, "/apis/demo.k8s.io/v1beta1/podsets").await);
    let slow = &betas["default/slow"];
    assert_eq!(slow["spec"]["minReadySeconds"], 30, "{slow}");
    assert_eq!(slow["metadata"]["annotations"], json!({"team": "a"}), "{slow}");
    assert_eq!(betas["other/odd"]["metadata"]["annotations"][MIN_READY], "soon", "never a number of seconds: kept");
    assert_eq!(
        betas["default/applied"]["metadata"]["managedFields"],
        before["default/applied"]["metadata"]["managedFields"]
    );
    assert!(betas.values().all(|ps| ps["spec"]["selector"].is_object()), "{betas:#?}");

    // Written to as before: the resourceVersion sequence goes on, a pending deletion ends with its finalizer.
    let (status, created) = send(&client, "POST", BETA, "application/json", beta("new")).await;
    assert_eq!(status, 201, "{created}");
    let newest =
        before.values().map(|i| i["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap()).max();
    assert!(created["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().ok() > newest);
    assert!(betas["default/held"]["metadata"]["deletionTimestamp"].is_string());
    let path = format!("{BETA}/held");
    let (status, body) =
        send(&client, "PATCH", &path, "application/merge-patch+json", json!({"metadata": {"finalizers": null}})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = raw(&client, Request::get(&path).body(vec![]).unwrap()).await;
    assert_eq!(status, 404, "deleted once its finalizer went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_store_of_the_previous_build_is_served_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let untar = std::process::Command::new("tar")
        .args(["-xzf", &format!("{FIXTURE}/sled.tar.gz"), "-C"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(untar.success());
    let server = TestServer::start_in(dir.path().to_owned(), None, vec!["--insecure-allow-all".into()]);
    serves_what_the_previous_build_served(&server, "served-sled.json", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_store_of_the_previous_build_is_served_and_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = podset_envtest::etcd::Etcd::start(&dir.path().join("etcd"));
    let keys: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/etcd.json")).unwrap()).unwrap();
    let mut kv = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
    for k in &keys {
        kv.put(k["key"].as_str().unwrap(), k["value"].as_str().unwrap(), None).await.unwrap();
    }
    let args = vec![
        "--insecure-allow-all".into(),
        "--storage-backend=etcd".into(),
        format!("--etcd-servers={}", etcd.url()),
        "--storage-version=v1beta1".into(),
    ];
    let server = TestServer::start_in(dir.path().join("replica"), None, args);
    serves_what_the_previous_build_served(&server, "served-etcd.json", true).await;
}
