//! What delegated authentication and authorization cost: gets per second straight at podset-apiserver (in the local
//! control plane) as a `system:masters` member (no review), as a user whose SubjectAccessReview is cached, and with
//! a ServiceAccount token (TokenReview and SubjectAccessReview cached), plus the latency of a request whose review
//! is not cached (one SubjectAccessReview round trip to kube-apiserver).
//!
//! `cargo bench --bench auth` (as root, with the test assets installed).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use podset_envtest::{reenter_namespace, Cluster, Credential, ServerCommand};

const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");
const PATH: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets/bench";
const CONCURRENCY: usize = 32;
const GETS: usize = 20_000;

type Headers = &'static [(&'static str, &'static str)];

const ADMIN: Headers = &[("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")];
const BOB: Headers = &[("X-Remote-User", "bob"), ("X-Remote-Group", "system:authenticated")];

async fn get(client: &kube::Client, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::get(PATH);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client.send(req.body(kube::client::Body::empty()).unwrap()).await.expect("request");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// Gets per second with `CONCURRENCY` in flight.
async fn rate(client: &kube::Client, headers: Headers) -> f64 {
    let client = Arc::new(client.clone());
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(0..GETS)
        .map(|_| {
            let client = client.clone();
            async move { get(&client, headers).await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 200), "some gets failed: {:?}", statuses.iter().find(|s| **s != 200));
    GETS as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let cluster = Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() });
    cluster.apply_text(
        "bench.yaml",
        "apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata: {name: bench, namespace: default}\nspec: {replicas: 0}\n",
    );
    cluster.kubectl(&["create", "rolebinding", "bob", "--clusterrole=podsets-view", "--user=bob"]);
    cluster.kubectl(&["create", "serviceaccount", "reader"]);
    cluster.kubectl(&[
        "create",
        "rolebinding",
        "reader",
        "--clusterrole=podsets-view",
        "--serviceaccount=default:reader",
    ]);
    let token = cluster.kubectl(&["create", "token", "reader"]).trim().to_owned();
    let proxy = cluster.client_cert("front-proxy-ca", "front-proxy-client", None);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let via_proxy = cluster.podset_client(Credential::Cert(&proxy));
        // RBAC in kube-apiserver takes a moment to see new bindings.
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while get(&via_proxy, BOB).await != 200 {
            assert!(Instant::now() < deadline, "bob never allowed");
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        // Warm up connections and the server before anything is timed.
        rate(&via_proxy, ADMIN).await;
        let masters = rate(&via_proxy, ADMIN).await;
        let cached_sar = rate(&via_proxy, BOB).await;
        let sa = cluster.podset_client(Credential::Token(&token));
        let cached_token = rate(&sa, &[]).await;

        // Each request a new user: every one needs a SubjectAccessReview (denied, which is cached just as long).
        let mut latencies: Vec<f64> = Vec::new();
        for i in 0..300 {
            let user = format!("nobody-{i}");
            let started = Instant::now();
            let status = get(&via_proxy, &[("X-Remote-User", &user)]).await;
            assert_eq!(status, 403);
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        let p50 = latencies[latencies.len() / 2];
        let p99 = latencies[latencies.len() * 99 / 100];

        println!("gets straight at podset-apiserver, {CONCURRENCY} in flight, {GETS} each");
        println!("{:<52} {masters:>9.0} /s", "front proxy, system:masters (no review)");
        println!(
            "{:<52} {cached_sar:>9.0} /s  ({:.2}x)",
            "front proxy, bob (SubjectAccessReview cached)",
            cached_sar / masters
        );
        println!(
            "{:<52} {cached_token:>9.0} /s  ({:.2}x)",
            "ServiceAccount token (TokenReview + SAR cached)",
            cached_token / masters
        );
        println!("{:<52} p50 {p50:.2} ms, p99 {p99:.2} ms", "uncached SubjectAccessReview, one request at a time");
    });
    drop(cluster);
}
