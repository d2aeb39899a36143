//! Throughput and latency of the server binary, driven over HTTPS on loopback:
//! create/s, get/s, server-side apply/s, list of 2000 objects (JSON, and as kubectl's Table), and watch latency
//! (write acknowledged → event received).
//!
//! `cargo bench --bench apiserver` prints each figure beside kube-apiserver + etcd serving the same type as a CRD
//! (measured on this project's 2-core machine), and the ratio. `APISERVER_CREATES` sets how many PodSets are
//! created (3000); `APISERVER_ONLY=create` stops after the creates, e.g. to profile them, `APISERVER_ONLY=watch`
//! goes from the creates to the watch latency. `APISERVER_VERSION`
//! (`v1alpha1`, `v1beta1`) is the version the requests use; with `PODSET_APISERVER_ARGS=--storage-version=...` it
//! measures reads and writes converted between the versions or served as stored.

mod common;

use std::time::Instant;

use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use serde_json::json;

use common::workload::throughput;
use common::{percentile, send, Server};

// kube-apiserver + etcd with PodSet as a CRD, same machine (from the project's issue tracker).
const CRD_CREATE_PER_S: f64 = 1500.0;
const CRD_GET_PER_S: f64 = 3400.0;
const CRD_LIST_2000_MS: f64 = 200.0;
const CRD_WATCH_P99_MS: f64 = 5.0;

/// The version the requests use (`APISERVER_VERSION`, `v1alpha1` unless set).
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| std::env::var("APISERVER_VERSION").unwrap_or_else(|_| "v1alpha1".into()))
}

fn api_version() -> String {
    format!("demo.k8s.io/{}", version())
}

fn collection() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| format!("/apis/demo.k8s.io/{}/namespaces/bench/podsets", version()))
}

fn body(name: &str) -> Vec<u8> {
    let mut ps = json!({
        "apiVersion": api_version(), "kind": "PodSet",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"replicas": 1}
    });
    if version() != "v1alpha1" {
        ps["spec"]["selector"] = json!({"matchLabels": {"app": "bench"}});
    }
    serde_json::to_vec(&ps).unwrap()
}

fn report(name: &str, ours: f64, unit: &str, baseline: f64, higher_is_better: bool) {
    let ratio = if higher_is_better { ours / baseline } else { baseline / ours };
    println!("{name:<28} {ours:>10.1} {unit:<6} (CRD on kube-apiserver+etcd: {baseline:>7.1} {unit}; {ratio:>5.1}x)");
}

fn report_cpu(name: &str, cpu_us: f64) {
    println!("{:<28} {cpu_us:>10.1} us    server CPU per request", format!("  {name}"));
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let path = collection();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let client = server.client();
    let clients = [client.clone()];
    let pid = server.pid();

    let creates = std::env::var("APISERVER_CREATES").ok().and_then(|n| n.parse().ok()).unwrap_or(3000);
    let (rate, cpu) = throughput(&clients, &[pid], creates, move |i| {
        Request::post(path).header("content-type", "application/json").body(body(&format!("c{i:05}"))).unwrap()
    })
    .await;
    report("create (durable)", rate, "/s", CRD_CREATE_PER_S, true);
    report_cpu("create", cpu);
    if std::env::var("APISERVER_ONLY").as_deref() == Ok("create") {
        return;
    }

    if std::env::var("APISERVER_ONLY").as_deref() != Ok("watch") {
        reads_and_applies(&client, &clients, pid, path, creates).await;
    }

    // Watch latency: from sending an update to seeing its event on an open watch.
    let rv = {
        let (_, body) = send(&client, Request::get(format!("{path}?limit=1")).body(vec![]).unwrap()).await;
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let watch = client
        .send(Request::get(format!("{path}?watch=1&resourceVersion={rv}")).body(kube::client::Body::empty()).unwrap())
        .await
        .unwrap();
    let mut frames = watch.into_body().into_data_stream();
    let mut lat = Vec::new();
    let mut pending = Vec::new();
    for i in 0..500 {
        let patch = format!(r#"{{"spec":{{"replicas":{}}}}}"#, i % 7 + 2);
        let started = Instant::now();
        let req = Request::patch(format!("{path}/c{:05}", i))
            .header("content-type", "application/merge-patch+json")
            .body(patch.into_bytes())
            .unwrap();
        let (status, _) = send(&client, req).await;
        assert_eq!(status, 200);
        loop {
            if let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                pending.drain(..=pos);
                break;
            }
            let chunk = frames.next().await.expect("watch open").unwrap();
            pending.extend_from_slice(&chunk);
        }
        lat.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    report("watch p50 (write->event)", percentile(&lat, 0.5), "ms", CRD_WATCH_P99_MS, false);
    report("watch p99 (write->event)", percentile(&lat, 0.99), "ms", CRD_WATCH_P99_MS, false);
}

/// The get, server-side apply and list figures (left out by `APISERVER_ONLY=watch`).
async fn reads_and_applies(
    client: &kube::Client,
    clients: &[kube::Client],
    pid: u32,
    path: &'static str,
    creates: usize,
) {
    let (rate, cpu) = throughput(clients, &[pid], 20_000, move |i| {
        Request::get(format!("{path}/c{:05}", i % creates)).body(vec![]).unwrap()
    })
    .await;
    report("get", rate, "/s", CRD_GET_PER_S, true);
    report_cpu("get", cpu);

    // Server-side apply of a new label to existing objects: merge, ownership and conflict check, durable write.
    let probe = Request::patch(format!("{path}/c00000?fieldManager=bench"))
        .header("content-type", "application/apply-patch+yaml")
        .body(b"{}".to_vec())
        .unwrap();
    let apply_supported = send(client, probe).await.0 != 415;
    let (rate, cpu) = if !apply_supported {
        (f64::NAN, f64::NAN)
    } else {
        throughput(clients, &[pid], creates, move |i| {
            let cfg = json!({"apiVersion": api_version(), "kind": "PodSet",
                         "metadata": {"name": format!("c{i:05}"), "labels": {"applied": "yes"}}});
            Request::patch(format!("{path}/c{i:05}?fieldManager=bench"))
                .header("content-type", "application/apply-patch+yaml")
                .body(serde_json::to_vec(&cfg).unwrap())
                .unwrap()
        })
        .await
    };
    println!("{:<28} {rate:>10.1} /s", "apply (server-side, durable)");
    report_cpu("apply", cpu);

    let json = list_2000(client, pid, path, None, "items").await;
    report("list 2000 (median, parsed)", json.median_ms, "ms", CRD_LIST_2000_MS, false);
    println!("{:<28} {:>10.1} ms    server CPU per list", "  list", json.cpu_ms);
    // kubectl get's Table of the same list: rows from the objects' row memos, made by the first Table read of each
    // revision and kept with it.
    let table = list_2000(client, pid, path, Some(TABLE_ACCEPT), "rows").await;
    let ratio = |t: f64, j: f64| format!("{:.2}x the JSON list", t / j);
    println!(
        "{:<28} {:>10.1} ms    ({})",
        "list 2000 as Table (median)",
        table.median_ms,
        ratio(table.median_ms, json.median_ms)
    );
    println!(
        "{:<28} {:>10.1} ms    server CPU per list ({})",
        "  table",
        table.cpu_ms,
        ratio(table.cpu_ms, json.cpu_ms)
    );
    println!(
        "{:<28} {:>10.1} ms    server CPU of the first, which makes the rows",
        "  table, first", table.first_cpu_ms
    );
}

/// A list's figures: the median time (answer parsed), the server's CPU per list after the first, and the first's.
struct Listed {
    median_ms: f64,
    cpu_ms: f64,
    first_cpu_ms: f64,
}

/// kubectl's `Accept` for `get`.
const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// Lists measured of each kind: enough for the server's CPU, read in 10 ms ticks, to within a few percent.
const LISTS: usize = 200;

/// A list of 2000 (answered as `accept` asks, its `field` holding 2000 entries, parsed), then [`LISTS`] more.
async fn list_2000(client: &kube::Client, pid: u32, path: &str, accept: Option<&str>, field: &str) -> Listed {
    let mut times = Vec::new();
    let mut cpu_before = common::cpu_us(pid);
    let mut first_cpu_ms = 0.0;
    for i in 0..=LISTS {
        if i == 1 {
            let now = common::cpu_us(pid);
            first_cpu_ms = (now - cpu_before) / 1000.0;
            cpu_before = now;
        }
        let started = Instant::now();
        let mut req = Request::get(format!("{path}?limit=2000"));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let (status, body) = send(client, req.body(vec![]).unwrap()).await;
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[field].as_array().unwrap().len(), 2000);
        if i > 0 {
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    let cpu_ms = (common::cpu_us(pid) - cpu_before) / 1000.0 / times.len() as f64;
    Listed { median_ms: percentile(&times, 0.5), cpu_ms, first_cpu_ms }
}
