//! `/metrics` after known requests: k8s.io/apiserver's names, labels and the values those requests must produce.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use http::Request;

/// Every sample of a scrape, by its series (`name{labels}`), and the Content-Type.
async fn scrape(client: &kube::Client) -> (String, BTreeMap<String, f64>) {
    let (status, headers, body) = raw(client, Request::get("/metrics").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap_or_else(|_| panic!("{l}")))
        })
        .collect();
    (headers["content-type"].to_str().unwrap().to_owned(), samples)
}

fn request_series(verb: &str, scope: &str, code: &str) -> String {
    format!(
        r#"apiserver_request_total{{verb="{verb}",dry_run="",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="{scope}",component="apiserver",code="{code}"}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_known_requests_with_kubernetes_names() {
    // Stored in v1beta1, so that requests in both versions are counted: v1alpha1's writes, v1beta1's reads.
    let server = TestServer::start(&["--storage-version=v1beta1"]);
    let client = server.client();
    let get = |path: String| Request::get(path).body(vec![]).unwrap();

    let (status, _, body) = raw(&client, get(PODSETS.into())).await;
    assert_eq!(status, 200);
    let rv = json(&body)["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    for name in ["a", "b", "c"] {
        let req = Request::post(PODSETS).header("content-type", "application/json");
        let (status, _, _) = raw(&client, req.body(serde_json::to_vec(&podset(name, 0)).unwrap()).unwrap()).await;
        assert_eq!(status, 201);
    }
    // A GET in the storage version (v1beta1 here) answers with the bytes as stored: what the history counts.
    let mut stored = 0;
    for name in ["a", "b", "c"] {
        stored += raw(&client, get(format!("{}/{name}", PODSETS.replace("v1alpha1", "v1beta1")))).await.2.len();
    }
    let dry = Request::post(format!("{PODSETS}?dryRun=All")).header("content-type", "application/json");
    assert_eq!(raw(&client, dry.body(serde_json::to_vec(&podset("d", 0)).unwrap()).unwrap()).await.0, 201);
    assert_eq!(raw(&client, get(PODSETS.into())).await.0, 200);
    assert_eq!(raw(&client, get(format!("{PODSETS}/a"))).await.0, 200);
    assert_eq!(raw(&client, get(format!("{PODSETS}/missing"))).await.0, 404);
    assert_eq!(raw(&client, get("/readyz".into())).await.0, 200);
    // A watch from before the creates sees three ADDED events, then ends (timeoutSeconds).
    let (status, _, events) =
        raw(&client, get(format!("{PODSETS}?watch=1&resourceVersion={rv}&timeoutSeconds=1"))).await;
    assert_eq!((status, String::from_utf8_lossy(&events).matches("\"ADDED\"").count()), (200, 3));

    // An open watch is a long-running request.
    let watching = server.client();
    let watch = Request::get(format!("{PODSETS}?watch=1")).body(kube::client::Body::from(vec![])).unwrap();
    let open = watching.send(watch).await.unwrap();
    assert_eq!(open.status(), 200);

    let (content_type, m) = scrape(&client).await;
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let value = |series: &str| m.get(series).copied().unwrap_or_else(|| panic!("no {series} in {m:#?}"));
    assert_eq!(value(&request_series("POST", "resource", "201")), 3.0);
    assert_eq!(value(&request_series("LIST", "namespace", "200")), 2.0);
    assert_eq!(value(&request_series("GET", "resource", "200")), 1.0, "one read in v1alpha1");
    let in_v1beta1 = request_series("GET", "resource", "200").replace("v1alpha1", "v1beta1");
    assert_eq!(value(&in_v1beta1), 3.0, "the three reads of what was stored, labelled with their version");
    assert_eq!(value(&request_series("GET", "resource", "404")), 1.0);
    assert_eq!(value(&request_series("WATCH", "namespace", "200")), 2.0);
    assert_eq!(
        value(
            r#"apiserver_request_total{verb="POST",dry_run="All",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="resource",component="apiserver",code="201"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            r#"apiserver_request_total{verb="GET",dry_run="",group="",version="",resource="",subresource="/readyz",scope="",component="apiserver",code="200"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            r#"apiserver_request_duration_seconds_count{verb="POST",dry_run="",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="resource",component="apiserver"}"#
        ),
        3.0
    );
    assert_eq!(
        value(
            r#"apiserver_request_duration_seconds_bucket{le="60.0",verb="LIST",dry_run="",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="namespace",component="apiserver"}"#
        ),
        2.0
    );
    let longrunning = r#"apiserver_longrunning_requests{verb="WATCH",group="demo.k8s.io",version="v1alpha1",resource="podsets",subresource="",scope="namespace",component="apiserver"}"#;
    assert_eq!(value(longrunning), 1.0, "the open watch");
    assert_eq!(
        value(r#"apiserver_watch_events_total{group="demo.k8s.io",version="v1alpha1",resource="podsets"}"#),
        6.0,
        "three to the first watch, and the open one (no resourceVersion) starts with the three as ADDED"
    );
    assert_eq!(
        value(r#"apiserver_storage_objects{resource="podsets.demo.k8s.io"}"#),
        3.0,
        "the dry run stored nothing"
    );
    assert_eq!(value(r#"apiserver_current_inflight_requests{request_kind="readOnly"}"#), 1.0, "this scrape");
    assert_eq!(value(r#"apiserver_current_inflight_requests{request_kind="mutating"}"#), 0.0);
    assert_eq!(value("podset_storage_current_revision") - value("podset_storage_compacted_revision"), 3.0);
    assert_eq!(value("podset_storage_history_events"), 3.0);
    assert_eq!(value("podset_storage_history_bytes"), stored as f64, "the three objects as stored");
    assert!(value("podset_storage_data_bytes") > 0.0);
    assert_eq!(value("podset_storage_commit_group_size_sum"), 3.0, "three writes made durable, the dry run not");
    let groups = value("podset_storage_commit_group_size_count");
    assert!((1.0..=3.0).contains(&groups), "{groups} groups");
    assert_eq!(value("podset_storage_commit_duration_seconds_count"), groups, "one timing per group");
    assert!(value("process_cpu_seconds_total") > 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") > 0.0 && value("process_max_fds") >= value("process_open_fds"));
    let start = value("process_start_time_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(start <= now && start > now - 3600.0, "started {start}, now {now}");

    drop(open);
    drop(watching);
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape(&client).await.1.get(longrunning).copied() != Some(0.0) {
        assert!(Instant::now() < deadline, "a closed watch still counted as long-running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
