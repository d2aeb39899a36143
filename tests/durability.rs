//! Every acknowledged write survives `kill -9`, and watches resume across the restart.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let mut server = TestServer::start(&[]);
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    let acked: Arc<Mutex<HashMap<String, i32>>> = Default::default();
    let max_rv = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let mut writers = Vec::new();
    for w in 0..8 {
        let (api, acked, max_rv, stop) = (api.clone(), acked.clone(), max_rv.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{i}");
                let ps: PodSet = serde_json::from_value(podset(&name, 0)).unwrap();
                let Ok(created) = api.create(&PostParams::default(), &ps).await else { return };
                note(&max_rv, &created);
                acked.lock().unwrap().insert(name.clone(), 0);
                for r in 1..=3 {
                    let patch = Patch::Merge(json!({"spec": {"replicas": r}}));
                    let Ok(p) = api.patch(&name, &PatchParams::default(), &patch).await else { return };
                    note(&max_rv, &p);
                    acked.lock().unwrap().insert(name.clone(), r);
                }
                i += 1;
            }
        }));
    }
    // Kill while writes are in flight.
    while acked.lock().unwrap().len() < 150 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let last_seen = max_rv.load(Ordering::Relaxed);

    let server = server.restart();
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    let stored: HashMap<String, i32> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.metadata.name.unwrap(), p.spec.replicas.unwrap()))
        .collect();
    for (name, replicas) in &acked {
        let got = stored.get(name).unwrap_or_else(|| panic!("acknowledged create of {name} was lost"));
        assert!(got >= replicas, "{name}: acknowledged replicas={replicas}, stored {got}");
    }

    // A watch from the last revision a client saw continues after the restart.
    let mut stream = api.watch(&WatchParams::default().timeout(20), &last_seen.to_string()).await.unwrap().boxed();
    let fresh =
        api.create(&PostParams::default(), &serde_json::from_value(podset("after-restart", 1)).unwrap()).await.unwrap();
    let fresh_rv: u64 = fresh.metadata.resource_version.unwrap().parse().unwrap();
    let mut previous = last_seen;
    loop {
        let ev = stream.try_next().await.unwrap().expect("watch ended early");
        let p = match ev {
            WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => p,
            other => panic!("unexpected {other:?}"),
        };
        let rv: u64 = p.metadata.resource_version.unwrap().parse().unwrap();
        assert_eq!(rv, previous + 1, "no gap, no duplicate");
        previous = rv;
        if rv == fresh_rv {
            break;
        }
    }
}

fn note(max: &AtomicU64, p: &PodSet) {
    let rv: u64 = p.metadata.resource_version.as_deref().unwrap().parse().unwrap();
    max.fetch_max(rv, Ordering::Relaxed);
}
