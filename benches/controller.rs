//! Time for a 500-replica PodSet to reach 500 Pods and back to 0, beside a 500-replica ReplicaSet reconciled by
//! kube-controller-manager, on the same local control plane (etcd + kube-apiserver 1.20, no kubelet).
//!
//! `cargo bench --bench controller` (as root, with KUBEBUILDER_ASSETS set: see hack/test.sh).

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use podset_apiserver::api::PodSet;
use podset_envtest::{reenter_namespace, Cluster, ServerCommand};
use serde_json::json;

const REPLICAS: usize = 500;
const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");

fn template(app: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}
    })
}

async fn live(pods: &Api<Pod>, app: &str) -> usize {
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap();
    list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count()
}

/// Seconds until `app` has exactly `want` live Pods.
async fn time_to(pods: &Api<Pod>, app: &str, want: usize, started: Instant) -> f64 {
    let deadline = started + Duration::from_secs(300);
    while live(pods, app).await != want {
        assert!(Instant::now() < deadline, "{app} never reached {want} pods");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    started.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let cluster = Cluster::start(ServerCommand { program: BIN.into(), args: Vec::new() });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.client().await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
        let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");

        let ps: PodSet = serde_json::from_value(json!({
            "metadata": {"name": "bench"},
            "spec": {"replicas": REPLICAS, "template": template("bench")}
        }))
        .unwrap();
        let t = Instant::now();
        podsets.create(&PostParams::default(), &ps).await.unwrap();
        let ps_up = time_to(&pods, "bench", REPLICAS, t).await;
        let t = Instant::now();
        podsets.patch("bench", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}}))).await.unwrap();
        let ps_down = time_to(&pods, "bench", 0, t).await;

        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "rs"},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "rs"}}, "template": template("rs")}
        }))
        .unwrap();
        let t = Instant::now();
        replicasets.create(&PostParams::default(), &rs).await.unwrap();
        let rs_up = time_to(&pods, "rs", REPLICAS, t).await;
        let t = Instant::now();
        replicasets
            .patch("rs", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
            .await
            .unwrap();
        let rs_down = time_to(&pods, "rs", 0, t).await;

        println!("{REPLICAS} replicas, seconds until every Pod exists / is gone (target: 3 s each way)");
        println!("{:<34} {:>8} {:>8}", "", "0 -> 500", "500 -> 0");
        println!("{:<34} {ps_up:>8.2} {ps_down:>8.2}", "PodSet (podset-apiserver)");
        println!("{:<34} {rs_up:>8.2} {rs_down:>8.2}", "ReplicaSet (kube-controller-manager)");
        println!("{:<34} {:>7.1}x {:>7.1}x", "speed-up", rs_up / ps_up, rs_down / ps_down);
    });
    drop(cluster);
}
