//! Watches through kube-apiserver's aggregator, as a cluster's clients hold them: 500 at once, each getting its
//! event (kube-apiserver multiplexes them to us over HTTP/2); client-go's reflector's streaming list in its
//! metadata-only form (kube-controller-manager's quota monitor and garbage collector, 1.35+) and kube-rs's
//! watcher with streaming lists, both through the aggregator.

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime};
use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use http::Request;
use http_body_util::BodyExt;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use serde_json::Value;

const METADATA_WATCH_ACCEPT: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

#[test]
fn watches_and_streaming_lists_through_the_aggregator() {
    in_namespace("watches_and_streaming_lists_through_the_aggregator", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let api: Api<PodSet> = Api::namespaced(client.clone(), "default");
            let first = api.create(&PostParams::default(), &serde_json::from_value(common::podset("a", 0)).unwrap()).await.unwrap();
            let rv = first.metadata.resource_version.unwrap();

            // kube-controller-manager's metadata informer, 1.35: a streaming list through the aggregator.
            let path = "/apis/demo.k8s.io/v1alpha1/podsets?allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=30&watch=true";
            let req = Request::get(path).header("accept", METADATA_WATCH_ACCEPT).body(Vec::new()).unwrap();
            let resp = client.send(req.map(kube::client::Body::from)).await.unwrap();
            assert_eq!(resp.status(), 200);
            let mut lines = kube::client::Body::into_data_stream(resp.into_body())
                .map_err(std::io::Error::other)
                .into_async_read()
                .lines();
            let mut got = Vec::new();
            let read = async {
                while let Some(line) = lines.next().await {
                    let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
                    let end = event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true";
                    got.push(event);
                    if end {
                        break;
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(20), read).await.expect("the initial events and their end");
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!((got[0]["type"].as_str(), got[0]["object"]["kind"].as_str()), (Some("ADDED"), Some("PartialObjectMetadata")));
            assert_eq!((got[1]["type"].as_str(), got[1]["object"]["kind"].as_str()), (Some("BOOKMARK"), Some("PartialObjectMetadata")));
            // At the list's revision: no older than the object (the controller may have written its status since).
            let revision = |e: &Value| e["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap();
            assert!(revision(&got[1]) >= revision(&got[0]) && revision(&got[0]) >= rv.parse().unwrap(), "{got:?}");

            // kube-rs's watcher, streaming lists, through the aggregator.
            assert_eq!(common::streaming_list_names(api.clone()).await, ["a"]);

            // 500 watches held at once through kube-apiserver, each getting the next change.
            const WATCHES: usize = 500;
            let wp = WatchParams::default().timeout(290);
            let streams = futures::future::try_join_all((0..WATCHES).map(|_| api.watch(&wp, &rv))).await.unwrap();
            // Each watch is open once kube-apiserver answered it; give the proxied streams a moment to reach us.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let made = api.create(&PostParams::default(), &serde_json::from_value(common::podset("b", 0)).unwrap()).await.unwrap();
            let want = made.metadata.resource_version.unwrap();
            let firsts = futures::future::join_all(streams.into_iter().map(|s| async move {
                let mut s = s.boxed();
                loop {
                    match s.try_next().await {
                        // The controller's status writes to "a" come first.
                        Ok(Some(WatchEvent::Bookmark(_) | WatchEvent::Modified(_))) => continue,
                        Ok(Some(WatchEvent::Added(p))) => return p.metadata.resource_version,
                        other => panic!("unexpected: {other:?}"),
                    }
                }
            }));
            let got = tokio::time::timeout(Duration::from_secs(120), firsts).await.expect("every watch to get the event");
            assert_eq!(got.iter().filter(|rv| rv.as_deref() == Some(want.as_str())).count(), WATCHES);
        });
    });
}
