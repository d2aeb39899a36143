//! What a ResourceQuota costs a create: PodSets through the aggregator (charged by podset-apiserver's ResourceQuota
//! plugin) and ConfigMaps on kube-apiserver (charged by its own), each in a namespace without a quota and in one
//! with a quota counting them, on the same control plane, one after the other.
//!
//! `cargo bench --bench quota` (as root, with KUBEBUILDER_ASSETS set: see hack/test.sh). `QUOTA_CREATES` sets the
//! creates per measurement (default 2000), `QUOTA_CLIENTS` the concurrent clients (default 8).

use std::time::{Duration, Instant};

use podset_envtest::{reenter_namespace, Cluster, ServerCommand};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Clone, Copy)]
enum Kind {
    ConfigMap,
    PodSet,
}

impl Kind {
    fn collection(self, ns: &str) -> String {
        match self {
            Kind::ConfigMap => format!("/api/v1/namespaces/{ns}/configmaps"),
            Kind::PodSet => format!("/apis/demo.k8s.io/v1alpha1/namespaces/{ns}/podsets"),
        }
    }

    fn body(self, name: &str) -> Value {
        match self {
            Kind::ConfigMap => {
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}})
            }
            Kind::PodSet => {
                json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": name}, "spec": {"replicas": 0}})
            }
        }
    }
}

async fn send(client: &kube::Client, method: &str, uri: &str, body: Option<&Value>) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body.map(|b| b.to_string().into_bytes()).unwrap_or_default()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// Creates per second in `ns`: `creates` objects named `<prefix>-<n>` by `clients` concurrent clients.
async fn create_rate(client: &kube::Client, kind: Kind, ns: &str, prefix: &str, creates: usize, clients: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, prefix, uri) = (client.clone(), prefix.to_owned(), kind.collection(ns));
            tokio::spawn(async move {
                for n in (c..creates).step_by(clients) {
                    let (code, body) = send(&client, "POST", &uri, Some(&kind.body(&format!("{prefix}-{n}")))).await;
                    assert_eq!(code, 201, "{body}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    creates as f64 / started.elapsed().as_secs_f64()
}

/// `status.used[resource]` of quota `q` in `ns`.
async fn used(client: &kube::Client, ns: &str, resource: &str) -> Option<String> {
    let (_, body) = send(client, "GET", &format!("/api/v1/namespaces/{ns}/resourcequotas/q"), None).await;
    let q: Value = serde_json::from_str(&body).ok()?;
    q["status"]["used"][resource].as_str().map(str::to_owned)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let (creates, clients) = (env_or("QUOTA_CREATES", 2000), env_or("QUOTA_CLIENTS", 8));
    let cluster = Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.client().await;
        for ns in ["free", "quota"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            assert_eq!(send(&client, "POST", "/api/v1/namespaces", Some(&body)).await.0, 201);
        }
        let (cms, podsets) = ("count/configmaps", "count/podsets.demo.k8s.io");
        let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
                           "spec": {"hard": {cms: "1000000", podsets: "1000000"}}});
        assert_eq!(send(&client, "POST", "/api/v1/namespaces/quota/resourcequotas", Some(&quota)).await.0, 201);
        let deadline = Instant::now() + Duration::from_secs(120);
        while used(&client, "quota", cms).await.is_none() || used(&client, "quota", podsets).await.is_none() {
            assert!(Instant::now() < deadline, "kube-controller-manager never filled in the quota's status");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // Warm both paths (connections, caches) before measuring.
        for kind in [Kind::ConfigMap, Kind::PodSet] {
            for ns in ["free", "quota"] {
                create_rate(&client, kind, ns, "warm", 200, clients).await;
            }
        }
        let mut rows = Vec::new();
        for (name, kind, resource) in [
            ("ConfigMap (kube-apiserver)", Kind::ConfigMap, cms),
            ("PodSet (podset-apiserver, aggregated)", Kind::PodSet, podsets),
        ] {
            let free = create_rate(&client, kind, "free", "m", creates, clients).await;
            let before = used(&client, "quota", resource).await.and_then(|u| u.parse::<usize>().ok()).unwrap_or(0);
            let charged = create_rate(&client, kind, "quota", "m", creates, clients).await;
            let after = used(&client, "quota", resource).await.and_then(|u| u.parse::<usize>().ok()).unwrap_or(0);
            // kube-controller-manager may recount meanwhile, so this is shown, not asserted.
            println!("{name}: status.used went from {before} to {after} over {creates} creates");
            rows.push((name, free, charged));
        }
        println!("creates/s through kube-apiserver 1.20, {creates} per row, {clients} concurrent clients");
        println!("{:<44} {:>10} {:>10} {:>9}", "", "no quota", "quota", "with/without");
        for (name, free, charged) in &rows {
            println!("{name:<44} {free:>10.0} {charged:>10.0} {:>9.2}", charged / free);
        }
        println!("PodSet/ConfigMap with the quota: {:.2}", rows[1].2 / rows[0].2);
    });
    drop(cluster);
}
