//! Memory, restart and fan-out at scale, against the release server binary over HTTPS on loopback:
//! RSS (current and peak) idle, at 10k and at 100k PodSets of ~0.7 KB each; RSS and time to serving after
//! kill -9 and after SIGTERM at 100k; data dir size, also after churn; a list of 2000 as Table beside JSON;
//! watch latency (write sent → event received) with 10 and 100 watchers, and the server's CPU time per write then.
//!
//! The same figures at 10k are then taken from kube-apiserver + etcd serving PodSet as a CRD on the local control
//! plane (1.20), memory being kube-apiserver's plus etcd's.
//!
//! `cargo bench --features envtest --bench scale` as root with KUBEBUILDER_ASSETS set (see hack/test.sh);
//! SCALE_N=20000 for a quicker run, SCALE_CRD=0 to skip kube-apiserver, SCALE_ONLY=watch for only the watch figures
//! (SCALE_ROUNDS=3 to repeat them). Figures and targets are printed; nothing is asserted on time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use serde_json::json;

use common::{cpu_us, dir_bytes, percentile, rss_mb, send, Server, PATH};
use podset_apiserver::envtest::{reenter_namespace, Cluster, ServerCommand};

const CONCURRENCY: usize = 32;
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// Where PodSets are served, and how to reach it.
#[derive(Clone)]
struct Target {
    path: String,
    api_version: &'static str,
    client: kube::Client,
}

const CRD_GROUP: &str = "demo.example.com";

/// PodSet as a CRD in a group of its own (a CRD cannot share ours, and `*.k8s.io` needs API approval), with our
/// printer columns so its Table has the same cells; spec and status keep unknown fields rather than repeating the
/// whole Pod template schema.
const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podsets.demo.example.com}
spec:
  group: demo.example.com
  scope: Namespaced
  names: {plural: podsets, singular: podset, kind: PodSet, shortNames: [ps]}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Desired, type: integer, jsonPath: .spec.replicas}
    - {name: Current, type: integer, jsonPath: .status.replicas}
    - {name: Ready, type: integer, jsonPath: .status.readyReplicas}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// A PodSet of about 0.7 KB as a client sends it (the server adds managedFields, uid, timestamps).
fn podset(api_version: &str, name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": api_version, "kind": "PodSet",
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "backend", "team": "platform"},
                     "annotations": {"owner": "platform-team@example.com"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "bench", "set": name}},
            "template": {
                "metadata": {"labels": {"app": "bench", "set": name}},
                "spec": {"containers": [{
                    "name": "app", "image": "registry.example.com/platform/app:1.27.3",
                    "args": ["--listen=:8080", "--log-level=info"],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [{"name": "MODE", "value": "production"}, {"name": "REGION", "value": "eu-west-1"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
                }]}
            }
        }
    }))
    .unwrap()
}

async fn create_range(t: &Target, from: usize, to: usize) {
    let failed = futures::stream::iter(from..to)
        .map(|i| {
            let t = t.clone();
            async move {
                let req = Request::post(&t.path)
                    .header("content-type", "application/json")
                    .body(podset(t.api_version, &format!("ps{i:06}")))
                    .unwrap();
                send(&t.client, req).await.0
            }
        })
        .buffer_unordered(CONCURRENCY)
        .filter(|s| futures::future::ready(*s != 201))
        .count()
        .await;
    assert_eq!(failed, 0, "creates failed");
}

async fn churn(t: &Target, n: usize, objects: usize) {
    futures::stream::iter(0..n)
        .map(|i| {
            let (client, path) = (t.client.clone(), t.path.clone());
            async move {
                let req = Request::patch(format!("{path}/ps{:06}", i % objects))
                    .header("content-type", "application/merge-patch+json")
                    .body(format!(r#"{{"spec":{{"replicas":{}}}}}"#, i % 5 + 1).into_bytes())
                    .unwrap();
                assert_eq!(send(&client, req).await.0, 200);
            }
        })
        .buffer_unordered(CONCURRENCY)
        .count()
        .await;
}

/// Median time to receive a list of 2000 in `accept` (not parsed: what the server spends, plus the transfer).
async fn list_ms(t: &Target, accept: &str) -> f64 {
    let mut times = Vec::new();
    for _ in 0..15 {
        let started = Instant::now();
        let req = Request::get(format!("{}?limit=2000", t.path)).header("accept", accept).body(vec![]).unwrap();
        let (status, body) = send(&t.client, req).await;
        assert_eq!(status, 200);
        assert!(body.len() > 100_000);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.5)
}

/// p50 and p99 from a write being sent to each of `watchers` receiving its event, over 200 writes, and the server's
/// CPU time per write (the write and its fan-out); each watcher has its own client (connection), as separate
/// programs would.
async fn watch_latency(t: &Target, pids: &[u32], clients: &[kube::Client], watchers: usize) -> (f64, f64, f64) {
    let (client, path) = (&t.client, &t.path);
    let (_, body) = send(client, Request::get(format!("{path}?limit=1")).body(vec![]).unwrap()).await;
    let rv = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let writes = 200;
    let received: Arc<Vec<AtomicUsize>> = Arc::new((0..watchers).map(|_| AtomicUsize::new(0)).collect());
    let arrivals: Arc<Vec<parking_lot::Mutex<Vec<Instant>>>> =
        Arc::new((0..watchers).map(|_| parking_lot::Mutex::new(Vec::with_capacity(writes))).collect());
    let mut tasks = Vec::new();
    for w in 0..watchers {
        // One connection per watcher, as separate clients would have.
        let client = clients[w].clone();
        let req = Request::get(format!("{path}?watch=1&resourceVersion={rv}")).body(kube::client::Body::empty());
        let resp = client.send(req.unwrap()).await.unwrap();
        let (received, arrivals) = (received.clone(), arrivals.clone());
        tasks.push(tokio::spawn(async move {
            let mut frames = resp.into_body().into_data_stream();
            let mut pending = Vec::new();
            while let Some(Ok(chunk)) = frames.next().await {
                pending.extend_from_slice(&chunk);
                while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    pending.drain(..=pos);
                    arrivals[w].lock().push(Instant::now());
                    received[w].fetch_add(1, Ordering::Release);
                }
            }
        }));
    }
    let cpu = || pids.iter().map(|p| cpu_us(*p)).sum::<f64>();
    let cpu_before = cpu();
    let mut sent = Vec::with_capacity(writes);
    for i in 0..writes {
        let started = Instant::now();
        let req = Request::patch(format!("{path}/ps{i:06}"))
            .header("content-type", "application/merge-patch+json")
            .body(format!(r#"{{"metadata":{{"annotations":{{"round":"{watchers}-{i}"}}}}}}"#).into_bytes())
            .unwrap();
        assert_eq!(send(client, req).await.0, 200);
        sent.push(started);
        let deadline = Instant::now() + Duration::from_secs(30);
        while received.iter().any(|r| r.load(Ordering::Acquire) <= i) {
            assert!(Instant::now() < deadline, "a watcher missed event {i}");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    let cpu_per_write = (cpu() - cpu_before) / writes as f64;
    for t in tasks {
        t.abort();
    }
    let mut lat: Vec<f64> = arrivals
        .iter()
        .flat_map(|a| {
            a.lock().iter().zip(&sent).map(|(got, at)| (*got - *at).as_secs_f64() * 1000.0).collect::<Vec<_>>()
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    (percentile(&lat, 0.5), percentile(&lat, 0.99), cpu_per_write)
}

fn row(what: &str, figure: String, target: &str) {
    println!("{what:<44} {figure:>18}   {target}");
}

fn mem(pids: &[u32]) -> String {
    let (now, peak) = pids.iter().map(|p| rss_mb(*p)).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    format!("{now:.0} / {peak:.0} MB")
}

/// Memory at `n` objects, Table beside JSON, and watch latency: the figures taken from both servers.
async fn at_small_scale(t: &Target, pids: &[u32], n: usize, clients: &[kube::Client]) {
    row("RSS idle (current / peak)", mem(pids), "");
    create_range(t, 0, n).await;
    row(&format!("RSS at {n} PodSets"), mem(pids), "<= 64 MB at 10k");
    let (json_ms, table_ms) = (list_ms(t, "application/json").await, list_ms(t, TABLE).await);
    row("list 2000 as JSON (median)", format!("{json_ms:.1} ms"), "");
    row("list 2000 as Table (median)", format!("{table_ms:.1} ms ({:.2}x)", table_ms / json_ms), "Table <= 1.5x JSON");
    watch_rows(t, pids, clients).await;
}

async fn watch_rows(t: &Target, pids: &[u32], clients: &[kube::Client]) {
    for watchers in [10, 100] {
        let (p50, p99, cpu) = watch_latency(t, pids, clients, watchers).await;
        row(
            &format!("watch p50 / p99, {watchers} watchers, 200 writes"),
            format!("{p50:.2} / {p99:.2} ms"),
            "p99 <= 3 ms",
        );
        row(&format!("server CPU per write, {watchers} watchers"), format!("{cpu:.0} us"), "");
    }
}

/// `SCALE_ONLY=watch`: the objects the watch figures write to, then those figures `SCALE_ROUNDS` times.
async fn only_watch(t: &Target, pids: &[u32], n: usize, clients: &[kube::Client]) {
    create_range(t, 0, n).await;
    let rounds: usize = std::env::var("SCALE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for _ in 0..rounds {
        watch_rows(t, pids, clients).await;
    }
}

fn only_watch_asked() -> bool {
    std::env::var("SCALE_ONLY").as_deref() == Ok("watch")
}

/// Kills the server (`signal`) and starts it again on the same data: time to serving and memory right after.
async fn restart(server: Server, signal: &str) -> (Server, Duration) {
    let dir = server.data_dir.clone();
    let pid = server.pid().to_string();
    std::process::Command::new("kill").args([signal, &pid]).status().unwrap();
    let mut server = server;
    server.child.wait().unwrap();
    drop(server);
    let server = Server::start(&dir, &[]);
    // Serving means the store is loaded: the server binds only after that.
    let client = server.client();
    let (status, _) = send(&client, Request::get("/readyz").body(vec![]).unwrap()).await;
    assert_eq!(status, 200);
    let took = server.started_in;
    (server, took)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(ours());
    if std::env::var("SCALE_CRD").as_deref() != Ok("0") {
        rt.block_on(crd());
    }
}

async fn ours() {
    let n: usize = std::env::var("SCALE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let small = n.min(10_000);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let t = Target { path: PATH.into(), api_version: "demo.k8s.io/v1alpha1", client: server.client() };
    let pid = server.pid();
    println!("{:<44} {:>18}   target", "podset-apiserver (release)", "figure");
    let clients: Vec<_> = (0..100).map(|_| server.client()).collect();
    if only_watch_asked() {
        only_watch(&t, &[pid], small, &clients).await;
        // Ends as it would in service, so a profiler it runs under (PODSET_APISERVER_BIN) writes its figures.
        let mut server = server;
        std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        server.child.wait().unwrap();
        return;
    }
    at_small_scale(&t, &[pid], small, &clients).await;

    create_range(&t, small, n).await;
    row(&format!("RSS at {n} PodSets"), mem(&[pid]), "<= 300 MB at 100k");
    let data = dir_bytes(dir.path()) as f64 / 1e6;
    row(&format!("data dir at {n}"), format!("{data:.0} MB"), "report");

    let (server, took) = restart(server, "-9").await;
    row(&format!("serving after kill -9 at {n}"), format!("{:.2} s", took.as_secs_f64()), "<= 2 s");
    row("RSS right after that restart", mem(&[server.pid()]), "<= RSS before");
    let (server, took) = restart(server, "-TERM").await;
    row(&format!("serving after SIGTERM at {n}"), format!("{:.2} s", took.as_secs_f64()), "<= 2 s");
    row("RSS right after that restart", mem(&[server.pid()]), "<= RSS before");

    let t = Target { client: server.client(), ..t };
    churn(&t, n, n).await;
    let data = dir_bytes(dir.path()) as f64 / 1e6;
    row(&format!("data dir after {n} updates"), format!("{data:.0} MB"), "bounded");
    row("RSS after the updates", mem(&[server.pid()]), "");
}

/// The same figures at 10k from kube-apiserver + etcd, PodSet as a CRD.
async fn crd() {
    let n: usize = std::env::var("SCALE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000).min(10_000);
    let bin = std::env::var("PODSET_APISERVER_BIN").unwrap_or_else(|_| common::BIN.to_owned());
    let cluster = Cluster::start(ServerCommand { program: bin.into(), args: Vec::new() });
    cluster.apply_text("crd.yaml", CRD);
    cluster.kubectl(&["create", "namespace", "bench"]);
    cluster.wait_for("the CRD to be served", Duration::from_secs(60), |c| {
        c.kubectl_try(&["get", &format!("podsets.{CRD_GROUP}"), "-n", "bench"]).is_ok()
    });
    let pids = [cluster.pid("kube-apiserver").unwrap(), cluster.pid("etcd").unwrap()];
    let client = cluster.client().await;
    let t = Target {
        path: format!("/apis/{CRD_GROUP}/v1alpha1/namespaces/bench/podsets"),
        api_version: "demo.example.com/v1alpha1",
        client: client.clone(),
    };
    println!();
    println!("{:<44} {:>18}", "kube-apiserver 1.20 + etcd, PodSet as CRD", "figure");
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(cluster.client().await);
    }
    if only_watch_asked() {
        return only_watch(&t, &pids, n, &clients).await;
    }
    at_small_scale(&t, &pids, n, &clients).await;
}
