//! Throughput and latency of the server binary, driven over HTTPS on loopback:
//! create/s, get/s, server-side apply/s, list of 2000 objects, and watch latency (write acknowledged → event
//! received).
//!
//! `cargo bench --bench apiserver` prints each figure beside kube-apiserver + etcd serving the same type as a CRD
//! (measured on this project's 2-core machine), and the ratio.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");
const PATH: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/bench/podsets";
const CONCURRENCY: usize = 32;

// kube-apiserver + etcd with PodSet as a CRD, same machine (from the project's issue tracker).
const CRD_CREATE_PER_S: f64 = 1500.0;
const CRD_GET_PER_S: f64 = 3400.0;
const CRD_LIST_2000_MS: f64 = 200.0;
const CRD_WATCH_P99_MS: f64 = 5.0;

struct Server {
    child: Child,
    url: String,
    ca: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    // Another build of the server can be measured with this bench (before/after figures).
    let bin = std::env::var("PODSET_APISERVER_BIN").unwrap_or_else(|_| BIN.to_owned());
    let mut child = Command::new(bin)
        .args(["--insecure-allow-all", "--bind-address", "127.0.0.1", "--secure-port", "0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn,podset_apiserver::cmd=info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if let Some(a) = v.pointer("/fields/address").and_then(|a| a.as_str()) {
                    let _ = tx.send(a.to_owned());
                }
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("server start");
    let ca_pem = std::fs::read(dir.path().join("certs/ca.crt")).unwrap();
    use rustls::pki_types::pem::PemObject;
    let ca = rustls::pki_types::CertificateDer::pem_slice_iter(&ca_pem).next().unwrap().unwrap().to_vec();
    Server { child, url: format!("https://{addr}"), ca, _dir: dir }
}

fn client(s: &Server) -> kube::Client {
    podset_apiserver::apiserver::tls::provider();
    let mut cfg = kube::Config::new(s.url.parse().unwrap());
    cfg.root_cert = Some(vec![s.ca.clone()]);
    kube::Client::try_from(cfg).unwrap()
}

async fn send(client: &kube::Client, req: Request<Vec<u8>>) -> (u16, bytes::Bytes) {
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

fn body(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"replicas": 1}
    }))
    .unwrap()
}

/// CPU time the server process has used so far, in microseconds (from /proc; steadier than rates on a
/// shared machine).
fn server_cpu_us(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    let ticks = f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0);
    ticks * 1e6 / 100.0
}

/// Runs `n` requests made by `make(i)` with `CONCURRENCY` in flight; returns requests per second and the
/// server's CPU time per request (µs).
async fn throughput<F>(client: &kube::Client, pid: u32, n: usize, make: F) -> (f64, f64)
where
    F: Fn(usize) -> Request<Vec<u8>> + Send + Sync + 'static,
{
    let cpu_before = server_cpu_us(pid);
    let make = Arc::new(make);
    let started = Instant::now();
    let results: Vec<u16> = futures::stream::iter(0..n)
        .map(|i| {
            let (client, make) = (client.clone(), make.clone());
            async move { send(&client, make(i)).await.0 }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(results.iter().all(|s| *s < 300), "some requests failed: {:?}", results.iter().find(|s| **s >= 300));
    (n as f64 / elapsed, (server_cpu_us(pid) - cpu_before) / n as f64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
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
    let server = start();
    let client = client(&server);
    let pid = server.child.id();

    let creates = 3000;
    let (rate, cpu) = throughput(&client, pid, creates, |i| {
        Request::post(PATH).header("content-type", "application/json").body(body(&format!("c{i:05}"))).unwrap()
    })
    .await;
    report("create (durable)", rate, "/s", CRD_CREATE_PER_S, true);
    report_cpu("create", cpu);

    let (rate, cpu) = throughput(&client, pid, 20_000, move |i| {
        Request::get(format!("{PATH}/c{:05}", i % creates)).body(vec![]).unwrap()
    })
    .await;
    report("get", rate, "/s", CRD_GET_PER_S, true);
    report_cpu("get", cpu);

    // Server-side apply of a new label to existing objects: merge, ownership and conflict check, durable write.
    let probe = Request::patch(format!("{PATH}/c00000?fieldManager=bench"))
        .header("content-type", "application/apply-patch+yaml")
        .body(b"{}".to_vec())
        .unwrap();
    let apply_supported = send(&client, probe).await.0 != 415;
    let (rate, cpu) = if !apply_supported {
        (f64::NAN, f64::NAN)
    } else {
        throughput(&client, pid, creates, |i| {
            let cfg = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
                         "metadata": {"name": format!("c{i:05}"), "labels": {"applied": "yes"}}});
            Request::patch(format!("{PATH}/c{i:05}?fieldManager=bench"))
                .header("content-type", "application/apply-patch+yaml")
                .body(serde_json::to_vec(&cfg).unwrap())
                .unwrap()
        })
        .await
    };
    println!("{:<28} {rate:>10.1} /s", "apply (server-side, durable)");
    report_cpu("apply", cpu);

    let mut times = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let (status, body) = send(&client, Request::get(format!("{PATH}?limit=2000")).body(vec![]).unwrap()).await;
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["items"].as_array().unwrap().len(), 2000);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    report("list 2000 (median, parsed)", percentile(&times, 0.5), "ms", CRD_LIST_2000_MS, false);

    // Watch latency: from sending an update to seeing its event on an open watch.
    let rv = {
        let (_, body) = send(&client, Request::get(format!("{PATH}?limit=1")).body(vec![]).unwrap()).await;
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let watch = client
        .send(Request::get(format!("{PATH}?watch=1&resourceVersion={rv}")).body(kube::client::Body::empty()).unwrap())
        .await
        .unwrap();
    let mut frames = watch.into_body().into_data_stream();
    let mut lat = Vec::new();
    let mut pending = Vec::new();
    for i in 0..500 {
        let patch = format!(r#"{{"spec":{{"replicas":{}}}}}"#, i % 7 + 2);
        let started = Instant::now();
        let req = Request::patch(format!("{PATH}/c{:05}", i))
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
