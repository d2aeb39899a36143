//! Time for a 50-replica PodSet to have all its Pods Running and Ready on the local node, beside a 50-replica
//! ReplicaSet with the same template (kube-controller-manager's controller), on the same node, one after the other.
//! The template is the demo workload with a readiness probe (images/src/bin/podset-demo.rs), its image imported.
//!
//! `cargo bench --bench node` (as root, with KUBEBUILDER_ASSETS set: see hack/test.sh).

#[path = "../tests/common/node.rs"]
mod node;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use node::{demo_template, phase, ready};
use podset_apiserver::api::PodSet;
use podset_envtest::{reenter_namespace, Cluster, ServerCommand};
use serde_json::json;

const REPLICAS: usize = 50;
const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");

/// (Running, Running and Ready) Pods of `app`.
async fn counts(pods: &Api<Pod>, app: &str) -> (usize, usize, usize) {
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await.unwrap();
    let running: Vec<&Pod> = list.items.iter().filter(|p| phase(p) == "Running").collect();
    (list.items.len(), running.len(), running.iter().filter(|p| ready(p)).count())
}

/// Seconds until every one of `REPLICAS` Pods exists, is Running, and is Ready.
async fn time_to_ready(pods: &Api<Pod>, app: &str, started: Instant) -> (f64, f64, f64) {
    let deadline = started + Duration::from_secs(600);
    let (mut created, mut running) = (None, None);
    loop {
        let (all, run, ready) = counts(pods, app).await;
        let t = started.elapsed().as_secs_f64();
        if all >= REPLICAS && created.is_none() {
            created = Some(t);
        }
        if run >= REPLICAS && running.is_none() {
            running = Some(t);
        }
        if ready >= REPLICAS {
            return (created.unwrap_or(t), running.unwrap_or(t), t);
        }
        assert!(Instant::now() < deadline, "{app}: {ready} of {REPLICAS} ready after 600 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_gone(pods: &Api<Pod>, app: &str) {
    while counts(pods, app).await.0 > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let cluster = Cluster::start_with_node(ServerCommand { program: BIN.into(), args: Vec::new() });
    let image = cluster.demo_image().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.client().await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let podsets: Api<PodSet> = Api::namespaced(client.clone(), "default");
        let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");

        let ps: PodSet = serde_json::from_value(json!({
            "metadata": {"name": "bench"},
            "spec": {"replicas": REPLICAS, "template": demo_template(&image, "bench", 0)}
        }))
        .unwrap();
        let t = Instant::now();
        podsets.create(&PostParams::default(), &ps).await.unwrap();
        let podset = time_to_ready(&pods, "bench", t).await;
        podsets.delete("bench", &DeleteParams::foreground()).await.unwrap();
        wait_gone(&pods, "bench").await;

        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "rs"},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "rs"}}, "template": demo_template(&image, "rs", 0)}
        }))
        .unwrap();
        let t = Instant::now();
        replicasets.create(&PostParams::default(), &rs).await.unwrap();
        let replicaset = time_to_ready(&pods, "rs", t).await;

        println!("{REPLICAS} replicas on one node (containerd + runc, kubelet 1.20), seconds from create until every Pod");
        println!("{:<38} {:>8} {:>8} {:>8}", "", "exists", "Running", "Ready");
        for (name, (c, r, ready)) in
            [("PodSet (podset-apiserver)", podset), ("ReplicaSet (kube-controller-manager)", replicaset)]
        {
            println!("{name:<38} {c:>8.2} {r:>8.2} {ready:>8.2}");
        }
    });
    drop(cluster);
}
