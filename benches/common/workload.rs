//! The workload the benches drive over HTTPS, against our server or kube-apiserver serving PodSet as a CRD:
//! requests with `CONCURRENCY` in flight, PodSets of about 0.7 KB, lists of 2000, and watch latency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use http::Request;
use http_body_util::BodyExt;
use serde_json::json;

use super::{cpu_us, percentile, send};

pub const CONCURRENCY: usize = 32;

/// Where PodSets are served, and how to reach it.
#[derive(Clone)]
pub struct Target {
    pub path: String,
    pub api_version: &'static str,
    /// One client per server: several when replicas share the store, request `i` going to `clients[i % len]`.
    pub clients: Vec<kube::Client>,
}

impl Target {
    /// The first server's client, for requests made one at a time.
    pub fn client(&self) -> &kube::Client {
        &self.clients[0]
    }
}

/// Runs `n` requests made by `make(i)` with `CONCURRENCY` in flight, request `i` sent by `clients[i % len]`; returns
/// requests per second and the CPU time per request (µs) of the processes `pids`.
pub async fn throughput<F>(clients: &[kube::Client], pids: &[u32], n: usize, make: F) -> (f64, f64)
where
    F: Fn(usize) -> Request<Vec<u8>> + Send + Sync + 'static,
{
    let cpu = || pids.iter().map(|p| cpu_us(*p)).sum::<f64>();
    let cpu_before = cpu();
    let make = Arc::new(make);
    let started = Instant::now();
    let results: Vec<u16> = futures::stream::iter(0..n)
        .map(|i| {
            let (client, make) = (clients[i % clients.len()].clone(), make.clone());
            async move { send(&client, make(i)).await.0 }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(results.iter().all(|s| *s < 300), "some requests failed: {:?}", results.iter().find(|s| **s >= 300));
    (n as f64 / elapsed, (cpu() - cpu_before) / n as f64)
}

/// [`throughput`] for `how_long` rather than a count: requests `0, 1, ...` in batches of 2000 until the time is up;
/// requests per second and the CPU time per request (µs) of `pids`.
pub async fn throughput_for<F>(clients: &[kube::Client], pids: &[u32], how_long: Duration, make: F) -> (f64, f64)
where
    F: Fn(usize) -> Request<Vec<u8>> + Send + Sync + 'static,
{
    const BATCH: usize = 2000;
    let make = Arc::new(make);
    let (started, mut done, mut cpu) = (Instant::now(), 0usize, 0.0);
    while started.elapsed() < how_long {
        let (from, make) = (done, make.clone());
        let (_, cpu_each) = throughput(clients, pids, BATCH, move |i| make(from + i)).await;
        cpu += cpu_each * BATCH as f64;
        done += BATCH;
    }
    (done as f64 / started.elapsed().as_secs_f64(), cpu / done as f64)
}

/// A PodSet of about 0.7 KB as a client sends it (the server adds managedFields, uid, timestamps).
pub fn podset(api_version: &str, name: &str) -> Vec<u8> {
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

/// The name of the `i`th PodSet `create_range` makes.
pub fn name(i: usize) -> String {
    format!("ps{i:06}")
}

/// Creates PodSets `from..to` (spread over the target's servers); returns creates per second and the CPU time per
/// create of `pids`.
pub async fn create_range(t: &Target, pids: &[u32], from: usize, to: usize) -> (f64, f64) {
    let (path, api_version) = (t.path.clone(), t.api_version);
    throughput(&t.clients, pids, to - from, move |i| {
        Request::post(&path)
            .header("content-type", "application/json")
            .body(podset(api_version, &name(from + i)))
            .unwrap()
    })
    .await
}

/// Median time to receive a list of 2000 in `accept` (not parsed: what the server spends, plus the transfer), the
/// lists taking turns over the target's servers.
pub async fn list_ms(t: &Target, accept: &str) -> f64 {
    let mut times = Vec::new();
    for i in 0..15 {
        let started = Instant::now();
        let req = Request::get(format!("{}?limit=2000", t.path)).header("accept", accept).body(vec![]).unwrap();
        let (status, body) = send(&t.clients[i % t.clients.len()], req).await;
        assert_eq!(status, 200);
        assert!(body.len() > 100_000);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.5)
}

/// Writes per `watch_latency`.
pub const WATCH_WRITES: usize = 200;

/// Makes every watch round's writes change something (a write that changes nothing makes no event).
static WATCH_ROUND: AtomicUsize = AtomicUsize::new(0);

/// How the watchers of `watch_latency` reach the server.
pub enum Watchers<'a> {
    /// Each over a connection of its own (HTTP/1.1), as separate programs would: watcher `w` uses `clients[w]`
    /// (which may reach another replica than the writes).
    Own(&'a [kube::Client]),
    /// All as streams of one HTTP/2 connection, as one Go program's watches (client-go's informers) share one.
    Shared(&'a kube::Config),
}

/// A watch response's body, as chunks.
type Chunks = futures::stream::BoxStream<'static, Result<bytes::Bytes, Box<dyn std::error::Error + Send + Sync>>>;

impl Watchers<'_> {
    /// Opens `n` watches of `path` from `rv`.
    async fn open(&self, path: &str, rv: &str, n: usize) -> Vec<Chunks> {
        let uri = format!("{path}?watch=1&resourceVersion={rv}");
        let mut out = Vec::new();
        match self {
            Watchers::Own(clients) => {
                for client in &clients[..n] {
                    let req = Request::get(&uri).body(kube::client::Body::empty()).unwrap();
                    let body = client.send(req).await.unwrap().into_body();
                    out.push(body.into_data_stream().map_err(|e| e.into()).boxed());
                }
            }
            Watchers::Shared(cfg) => {
                let mut conn = h2_connection(cfg).await;
                let base = cfg.cluster_url.to_string();
                for _ in 0..n {
                    let req = Request::get(format!("{}{uri}", base.trim_end_matches('/')))
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .unwrap();
                    conn.ready().await.unwrap();
                    let resp = conn.send_request(req).await.unwrap();
                    assert_eq!(resp.status(), 200);
                    out.push(resp.into_body().into_data_stream().map_err(|e| e.into()).boxed());
                }
            }
        }
        out
    }
}

/// One HTTP/2 connection to the server `cfg` names, with its TLS settings and credentials.
async fn h2_connection(
    cfg: &kube::Config,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    use kube::client::ConfigExt;
    let mut tls = cfg.rustls_client_config().unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let host = cfg.cluster_url.host().unwrap().to_owned();
    let port = cfg.cluster_url.port_u16().unwrap();
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from(host).unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the server speaks HTTP/2");
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// p50 and p99 from a write being sent (by the target's first client) to each of `watchers` receiving its event,
/// over `WATCH_WRITES` writes to PodSets `create_range` made, and the CPU time per write of `pids` (the write and its
/// fan-out).
pub async fn watch_latency(t: &Target, pids: &[u32], how: &Watchers<'_>, watchers: usize) -> (f64, f64, f64) {
    let (client, path) = (t.client(), &t.path);
    let round = WATCH_ROUND.fetch_add(1, Ordering::Relaxed);
    let (_, body) = send(client, Request::get(format!("{path}?limit=1")).body(vec![]).unwrap()).await;
    let rv = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let writes = WATCH_WRITES;
    let received: Arc<Vec<AtomicUsize>> = Arc::new((0..watchers).map(|_| AtomicUsize::new(0)).collect());
    let arrivals: Arc<Vec<parking_lot::Mutex<Vec<Instant>>>> =
        Arc::new((0..watchers).map(|_| parking_lot::Mutex::new(Vec::with_capacity(writes))).collect());
    let mut tasks = Vec::new();
    for (w, mut frames) in how.open(path, &rv, watchers).await.into_iter().enumerate() {
        let (received, arrivals) = (received.clone(), arrivals.clone());
        tasks.push(tokio::spawn(async move {
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
        let req = Request::patch(format!("{path}/{}", name(i)))
            .header("content-type", "application/merge-patch+json")
            .body(format!(r#"{{"metadata":{{"annotations":{{"round":"{round}-{watchers}-{i}"}}}}}}"#).into_bytes())
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

/// A bench's setting from the environment, else `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Creates `n` PodSets named `r<round>-<i>` on `server`, `CONCURRENCY` in flight: (per second, server CPU µs per
/// request).
pub async fn creates(server: &super::Server, round: usize, n: usize) -> (f64, f64) {
    let create = move |i: usize| {
        let req = Request::post(super::PATH).header("content-type", "application/json");
        req.body(podset("demo.k8s.io/v1alpha1", &format!("r{round}-{i:05}"))).unwrap()
    };
    throughput(&[server.client()], &[server.pid()], n, create).await
}

/// Gets of the PodSets [`creates`] made for `how_long`, `CONCURRENCY` in flight.
pub async fn gets(server: &super::Server, round: usize, n: usize, how_long: Duration) -> (f64, f64) {
    let get = move |i: usize| Request::get(format!("{}/r{round}-{:05}", super::PATH, i % n)).body(vec![]).unwrap();
    throughput_for(&[server.client()], &[server.pid()], how_long, get).await
}

/// [`creates`] then [`gets`] on each server in turn, `rounds` times (so a busy moment on a shared machine falls on
/// all alike); prints each one's median rates and CPU per request, with the ratios to the first server's.
pub async fn creates_and_gets_in_turn(servers: &[(&str, super::Server)], n: usize, get_for: Duration, rounds: usize) {
    let mut results = vec![[Vec::new(), Vec::new(), Vec::new(), Vec::new()]; servers.len()];
    for round in 0..rounds {
        for (i, (_, server)) in servers.iter().enumerate() {
            let (c, c_cpu) = creates(server, round, n).await;
            let (g, g_cpu) = gets(server, round, n, get_for).await;
            for (all, x) in results[i].iter_mut().zip([c, c_cpu, g, g_cpu]) {
                all.push(x);
            }
        }
    }
    println!("{n} creates then {}s of gets, {CONCURRENCY} in flight, {rounds} rounds (medians)", get_for.as_secs());
    let medians: Vec<[f64; 4]> = results.into_iter().map(|r| r.map(median)).collect();
    let (first, base) = (servers[0].0, medians[0]);
    for ((name, _), m) in servers.iter().zip(&medians) {
        println!(
            "{name:<10} create {:>7.0}/s {:>6.1} us CPU ({:.2}x {first}'s rate)   get {:>7.0}/s {:>6.1} us CPU ({:.2}x {first}'s rate)",
            m[0],
            m[1],
            m[0] / base[0],
            m[2],
            m[3],
            m[2] / base[2]
        );
    }
}
