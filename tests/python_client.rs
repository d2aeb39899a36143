//! The official Python `kubernetes` client watches PodSets from a resourceVersion.

mod common;

use common::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use podset_apiserver::api::PodSet;
use serde_json::json;

#[tokio::test]
async fn python_client_watch_replays_and_follows() {
    let server = TestServer::start(&[]);
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    let a = api.create(&PostParams::default(), &serde_json::from_value(podset("a", 1)).unwrap()).await.unwrap();
    let rv = a.metadata.resource_version.unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    api.create(&PostParams::default(), &serde_json::from_value(podset("b", 1)).unwrap()).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();

    let python = assets_dir().join("python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/watch_podsets.py");
    let out = tokio::process::Command::new(python)
        .args([script, &server.url(), server.ca.to_str().unwrap(), "default", &rv, "3"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let first: u64 = rv.parse().unwrap();
    let expected = format!("MODIFIED a {}\nADDED b {}\nDELETED a {}\n", first + 1, first + 2, first + 3);
    assert_eq!(stdout, expected);
}
