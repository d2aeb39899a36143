//! A resourceVersion precondition is judged on the newest state: a replica whose cache has not yet applied a
//! write another replica acknowledged must not answer 409 for the resourceVersion that write returned (found by
//! the robustness checker, issue 23: a client read rv N through the aggregator, sent an update with N, and got a
//! Conflict from the other replica while N was still current in etcd). A real etcd from KUBEBUILDER_ASSETS.

use std::sync::Arc;
use std::time::Duration;

use podset_apiserver::api::{Subresource, UserInfo};
use podset_apiserver::registry::{DeleteOptions, Preconditions, WriteOptions};
use podset_apiserver::resources::podset::{PodSetKey, PodSets as Registry};
use podset_apiserver::storage::{Cacher, EtcdBackend, EtcdOptions, HistoryLimits};
use podset_envtest::etcd::Etcd;
use serde_json::json;

async fn replica(etcd: &Etcd) -> Registry {
    let options = EtcdOptions {
        servers: vec![etcd.url()],
        group: "demo.k8s.io".into(),
        compaction_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let backend = EtcdBackend::connect(options).await.unwrap();
    Registry::new(Arc::new(Cacher::new(Arc::new(backend), HistoryLimits::default()).await.unwrap()))
}

fn podset(name: &str, replicas: u32, rv: Option<String>) -> serde_json::Value {
    json!({
        "apiVersion": "demo.k8s.io/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": name}}}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precondition_from_another_replica_is_met_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let (a, b) = (replica(&etcd).await, replica(&etcd).await);
    let opts = WriteOptions::manager("test", UserInfo::default());
    // Each round: a write on A, then at once a conditional update, and a conditional delete, on B with the
    // resourceVersion A returned. B's cache learns of A's write a moment later; a judgement on it says 409.
    for i in 0..30 {
        let name = format!("ps-{i}");
        let key = PodSetKey::new("ns", &name);
        let made = a.create("ns", podset(&name, 1, None), &opts).await.unwrap().object.resource_version();
        let body = podset(&name, 2, Some(made.to_string()));
        let updated = b.replace(&key, body, Subresource::Main, &opts).await.expect("B takes A's resourceVersion");
        let rv = a
            .replace(
                &key,
                podset(&name, 3, Some(updated.object.resource_version().to_string())),
                Subresource::Main,
                &opts,
            )
            .await
            .expect("A takes B's resourceVersion")
            .object
            .resource_version();
        let precondition = Preconditions { uid: None, resource_version: Some(rv.to_string()) };
        let delete = DeleteOptions { preconditions: Some(precondition), ..Default::default() };
        b.delete(&key, &delete, &opts).await.expect("B deletes at A's resourceVersion");
    }
}
