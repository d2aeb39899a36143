//! What a validating admission webhook costs a create: PodSets through the aggregator and ConfigMaps on
//! kube-apiserver, each without a webhook and with one allowing ValidatingWebhookConfiguration (the tests' HTTPS
//! webhook, in this process), on the same control plane, one after the other.
//!
//! `cargo bench --bench admission` (as root, with KUBEBUILDER_ASSETS set: see hack/test.sh).
//! `ADMISSION_CREATES` sets the creates per measurement (default 2000), `ADMISSION_CLIENTS` the concurrent
//! clients (default 8).

#[path = "../tests/common/webhook.rs"]
mod webhook;

use std::time::{Duration, Instant};

use base64::Engine as _;
use podset_envtest::{reenter_namespace, Cluster, ServerCommand, NODE_IP};
use serde_json::{json, Value};
use webhook::WebhookServer;

const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");
const NS: &str = "bench";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Clone, Copy)]
enum Kind {
    ConfigMap,
    PodSet,
}

impl Kind {
    fn collection(self) -> String {
        match self {
            Kind::ConfigMap => format!("/api/v1/namespaces/{NS}/configmaps"),
            Kind::PodSet => format!("/apis/demo.k8s.io/v1alpha1/namespaces/{NS}/podsets"),
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

async fn post(client: &kube::Client, uri: &str, body: &Value) -> (u16, String) {
    let req = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// Creates per second: `creates` objects named `<prefix>-<n>` by `clients` concurrent clients.
async fn create_rate(client: &kube::Client, kind: Kind, prefix: &str, creates: usize, clients: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, prefix) = (client.clone(), prefix.to_owned());
            tokio::spawn(async move {
                for n in (c..creates).step_by(clients) {
                    let (code, body) = post(&client, &kind.collection(), &kind.body(&format!("{prefix}-{n}"))).await;
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let (creates, clients) = (env_or("ADMISSION_CREATES", 2000), env_or("ADMISSION_CLIENTS", 8));
    let cluster = Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.client().await;
        let s = WebhookServer::start(NODE_IP.parse().unwrap()).await;
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        assert_eq!(post(&client, "/api/v1/namespaces", &ns).await.0, 201);
        // Warm both paths (connections, caches) before measuring.
        for kind in [Kind::ConfigMap, Kind::PodSet] {
            create_rate(&client, kind, "warm", 200, clients).await;
        }
        let cm_none = create_rate(&client, Kind::ConfigMap, "none", creates, clients).await;
        let ps_none = create_rate(&client, Kind::PodSet, "none", creates, clients).await;

        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "bench-allow"},
            "webhooks": [{
                "name": "allow.bench.test",
                "clientConfig": {"url": s.url("/allow"), "caBundle": base64::engine::general_purpose::STANDARD.encode(&s.ca_pem)},
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE"]},
                    {"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets"], "operations": ["CREATE"]},
                ],
                "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
            }],
        });
        let path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
        assert_eq!(post(&client, path, &config).await.0, 201);
        // Both servers watch configurations: wait until each calls the webhook.
        let deadline = Instant::now() + Duration::from_secs(60);
        for (kind, resource) in [(Kind::ConfigMap, "configmaps"), (Kind::PodSet, "podsets")] {
            let called = || s.received("/allow").iter().any(|r| r.review["request"]["resource"]["resource"] == resource);
            while !called() {
                assert!(Instant::now() < deadline, "{resource}: the webhook is never called");
                let uri = format!("{}?dryRun=All", kind.collection());
                post(&client, &uri, &kind.body("probe")).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for kind in [Kind::ConfigMap, Kind::PodSet] {
            create_rate(&client, kind, "warm-hook", 200, clients).await;
        }
        s.clear();
        let connections = s.connections();
        let cm_hook = create_rate(&client, Kind::ConfigMap, "hook", creates, clients).await;
        let ps_hook = create_rate(&client, Kind::PodSet, "hook", creates, clients).await;
        let calls = s.received("/allow").len();
        let new_connections = s.connections() - connections;

        println!("creates/s through kube-apiserver 1.20, {creates} per row, {clients} concurrent clients");
        println!("{:<44} {:>10} {:>10} {:>9}", "", "no webhook", "webhook", "with/without");
        for (name, none, hook) in [
            ("ConfigMap (kube-apiserver)", cm_none, cm_hook),
            ("PodSet (podset-apiserver, aggregated)", ps_none, ps_hook),
        ] {
            println!("{name:<44} {none:>10.0} {hook:>10.0} {:>9.2}", hook / none);
        }
        println!("PodSet/ConfigMap with the webhook: {:.2}", ps_hook / cm_hook);
        println!("webhook: {calls} calls over {new_connections} new TCP connections during the measured creates");
    });
    drop(cluster);
}
