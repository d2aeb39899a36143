//! Memory, restart and fan-out at scale, against the release server binary over HTTPS on loopback:
//! RSS (current and peak) idle, at 10k and at 100k PodSets of ~0.7 KB each; RSS and time to serving after
//! kill -9 and after SIGTERM at 100k; data dir size, also after churn; a list of 2000 in each served version as
//! JSON, and as Table and metadata-only (PartialObjectMetadataList) beside it;
//! watch latency (write sent → event received) with 10 and 100 watchers on connections of their own and with 100
//! sharing one HTTP/2 connection, and the server's CPU time per write then; memory while 100 watches that start
//! with every object are left unread.
//!
//! The same figures at 10k are then taken from kube-apiserver + etcd serving PodSet as a CRD on the local control
//! plane (1.20), memory being kube-apiserver's plus etcd's.
//!
//! `cargo bench --bench scale` as root with KUBEBUILDER_ASSETS set (see hack/test.sh);
//! SCALE_N=20000 for a quicker run, SCALE_CRD=0 to skip kube-apiserver, SCALE_ONLY=watch for only the watch figures
//! (SCALE_ROUNDS=3 to repeat them), SCALE_ONLY=list for only the lists (with SCALE_N objects, at most 10k; the
//! version other than --storage-version, set with PODSET_APISERVER_ARGS, is the converted one; SCALE_VERSIONS to
//! list fewer versions, e.g. v1alpha1 against a build that serves only it),
//! SCALE_CHURN_ROUNDS (3) for the rounds of updates. Figures and targets are printed; nothing is asserted on time.

mod common;

use std::time::Duration;

use futures::StreamExt;
use http::Request;

use common::workload::{create_range, list_ms, name, watch_latency, Target, Watchers, CONCURRENCY};
use common::{dir_bytes, rss_mb, send, Server, PATH};
use podset_envtest::reenter_namespace;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
/// As client-go's metadata client asks.
const METADATA: &str = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json";

/// The versions listed: ours both (`SCALE_VERSIONS=v1alpha1` for a build that serves only that one), the CRD
/// v1alpha1 only.
fn versions(ours: bool) -> Vec<String> {
    let asked = std::env::var("SCALE_VERSIONS").unwrap_or_else(|_| "v1alpha1,v1beta1".into());
    if ours {
        asked.split(',').map(str::to_owned).collect()
    } else {
        vec!["v1alpha1".into()]
    }
}

/// Lists of 2000 in each version `t` serves: JSON, then Table and metadata-only with their ratio to that JSON.
async fn list_rows(t: &Target, ours: bool) {
    for v in versions(ours) {
        let path = t.path.replace("/v1alpha1/", &format!("/{v}/"));
        let t = Target { path, api_version: t.api_version, clients: t.clients.clone() };
        let json_ms = list_ms(&t, "application/json").await;
        row(&format!("list 2000 in {v} as JSON (median)"), format!("{json_ms:.1} ms"), "");
        for (what, accept) in [("Table", TABLE), ("metadata", METADATA)] {
            let ms = list_ms(&t, accept).await;
            let figure = format!("{ms:.1} ms ({:.2}x)", ms / json_ms);
            row(&format!("list 2000 in {v} as {what} (median)"), figure, goal(ours, "<= 1.2x JSON"));
        }
    }
}

/// Updates `n` PodSets among the first `objects`, each to a replica count it did not have in the round before.
async fn churn(t: &Target, n: usize, objects: usize, round: usize) {
    futures::stream::iter(0..n)
        .map(|i| {
            let (client, path) = (t.client().clone(), t.path.clone());
            async move {
                let req = Request::patch(format!("{path}/{}", name(i % objects)))
                    .header("content-type", "application/merge-patch+json")
                    .body(format!(r#"{{"spec":{{"replicas":{}}}}}"#, (i + round) % 5 + 1).into_bytes())
                    .unwrap();
                assert_eq!(send(&client, req).await.0, 200);
            }
        })
        .buffer_unordered(CONCURRENCY)
        .count()
        .await;
}

fn row(what: &str, figure: String, target: &str) {
    println!("{what:<50} {figure:>18}   {target}");
}

/// Our targets are printed beside our figures only, not beside kube-apiserver's.
fn goal(ours: bool, target: &str) -> &str {
    if ours {
        target
    } else {
        ""
    }
}

fn mem(pids: &[u32]) -> String {
    let (now, peak) = pids.iter().map(|p| rss_mb(*p)).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    format!("{now:.0} / {peak:.0} MB")
}

/// Memory at `n` objects, Table beside JSON, and watch latency: the figures taken from both servers.
async fn at_small_scale(
    t: &Target,
    pids: &[u32],
    n: usize,
    clients: &[kube::Client],
    shared: &kube::Config,
    ours: bool,
) {
    row("RSS idle (current / peak)", mem(pids), "");
    create_range(t, pids, 0, n).await;
    row(&format!("RSS at {n} PodSets"), mem(pids), goal(ours, "<= 64 MB at 10k"));
    list_rows(t, ours).await;
    watch_rows(t, pids, clients, shared, ours).await;
    row("RSS, 100 watches from scratch left unread", unread_watches(t, pids, clients).await, "");
}

/// Memory while 100 watches opened without a resourceVersion (each sends an ADDED for every object first, as a
/// client starting up gets) are left unread, the state of a slow or stuck client.
async fn unread_watches(t: &Target, pids: &[u32], clients: &[kube::Client]) -> String {
    let mut open = Vec::new();
    for client in clients {
        let req = Request::get(format!("{}?watch=1", t.path)).body(kube::client::Body::empty()).unwrap();
        let resp = client.send(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        open.push(resp);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    mem(pids)
}

/// Watch latency with 10 and 100 watchers on connections of their own, and with 100 sharing one HTTP/2 connection.
async fn watch_rows(t: &Target, pids: &[u32], clients: &[kube::Client], shared: &kube::Config, ours: bool) {
    let cases = [
        (10, Watchers::Own(clients), ""),
        (100, Watchers::Own(clients), ""),
        (100, Watchers::Shared(shared), " on one HTTP/2"),
    ];
    for (watchers, how, on) in &cases {
        let (p50, p99, cpu) = watch_latency(t, pids, how, *watchers).await;
        row(
            &format!("watch p50 / p99, {watchers} watchers{on}"),
            format!("{p50:.2} / {p99:.2} ms"),
            goal(ours, "p99 <= 3 ms"),
        );
        row(&format!("server CPU per write, {watchers} watchers{on}"), format!("{cpu:.0} us"), "");
    }
}

/// `SCALE_ONLY=watch`: the objects the watch figures write to, then those figures `SCALE_ROUNDS` times.
async fn only_watch(t: &Target, pids: &[u32], n: usize, clients: &[kube::Client], shared: &kube::Config, ours: bool) {
    create_range(t, pids, 0, n).await;
    let rounds: usize = std::env::var("SCALE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for _ in 0..rounds {
        watch_rows(t, pids, clients, shared, ours).await;
    }
}

fn only_watch_asked() -> bool {
    std::env::var("SCALE_ONLY").as_deref() == Ok("watch")
}

fn only_list_asked() -> bool {
    std::env::var("SCALE_ONLY").as_deref() == Ok("list")
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
    let t = Target { path: PATH.into(), api_version: "demo.k8s.io/v1alpha1", clients: vec![server.client()] };
    let pid = server.pid();
    println!("{:<50} {:>18}   target", "podset-apiserver (release)", "figure");
    let clients: Vec<_> = (0..100).map(|_| server.client()).collect();
    let shared = server.config();
    if only_watch_asked() {
        only_watch(&t, &[pid], small, &clients, &shared, true).await;
        // Ends as it would in service, so a profiler it runs under (PODSET_APISERVER_BIN) writes its figures.
        let mut server = server;
        std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        server.child.wait().unwrap();
        return;
    }
    if only_list_asked() {
        create_range(&t, &[pid], 0, small).await;
        return list_rows(&t, true).await;
    }
    at_small_scale(&t, &[pid], small, &clients, &shared, true).await;

    create_range(&t, &[pid], small, n).await;
    row(&format!("RSS at {n} PodSets"), mem(&[pid]), "<= 300 MB at 100k");
    let data = dir_bytes(dir.path()) as f64 / 1e6;
    row(&format!("data dir at {n}"), format!("{data:.0} MB"), "report");

    let (server, took) = restart(server, "-9").await;
    row(&format!("serving after kill -9 at {n}"), format!("{:.2} s", took.as_secs_f64()), "<= 2 s");
    row("RSS right after that restart", mem(&[server.pid()]), "<= RSS before");
    let (server, took) = restart(server, "-TERM").await;
    row(&format!("serving after SIGTERM at {n}"), format!("{:.2} s", took.as_secs_f64()), "<= 2 s");
    row("RSS right after that restart", mem(&[server.pid()]), "<= RSS before");

    let t = Target { clients: vec![server.client()], ..t };
    // Several rounds: whether the data dir levels off under churn.
    let rounds: usize = std::env::var("SCALE_CHURN_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    for round in 1..=rounds {
        churn(&t, n, n, round).await;
        let data = dir_bytes(dir.path()) as f64 / 1e6;
        row(&format!("data dir after {} updates", round * n), format!("{data:.0} MB"), "bounded");
        row("RSS after the updates", mem(&[server.pid()]), "");
    }
}

/// The same figures at 10k from kube-apiserver + etcd, PodSet as a CRD.
async fn crd() {
    let n: usize = std::env::var("SCALE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000).min(10_000);
    let (cluster, t) = common::crd::start().await;
    let pids = [cluster.pid("kube-apiserver").unwrap(), cluster.pid("etcd").unwrap()];
    println!();
    println!("{:<50} {:>18}", "kube-apiserver 1.20 + etcd, PodSet as CRD", "figure");
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(cluster.client().await);
    }
    let shared = cluster.config().await;
    if only_watch_asked() {
        return only_watch(&t, &pids, n, &clients, &shared, false).await;
    }
    if only_list_asked() {
        create_range(&t, &pids, 0, n).await;
        return list_rows(&t, false).await;
    }
    at_small_scale(&t, &pids, n, &clients, &shared, false).await;
}
