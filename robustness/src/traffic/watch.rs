//! Watches as the clients hold them: from a revision seen, a few seconds each, every event recorded.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use rand::rngs::StdRng;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::{key_of, seen, Recorder, Route, CALL_TIMEOUT, NAMESPACE};
use crate::model::history::{Watch, WatchItem};

/// Watches from a revision seen, a few seconds each, one after another.
pub(crate) async fn watcher(
    id: usize,
    routes: Arc<Vec<Route>>,
    rec: Arc<Recorder>,
    mut rng: StdRng,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let latest = rec.latest.load(Ordering::Relaxed);
        if latest == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let route = routes[rng.random_range(0..routes.len())].clone();
        let api: Api<PodSet> = Api::namespaced(route.client.clone(), NAMESPACE);
        // Mostly near the newest revision; sometimes far back, to replay (or be told 410 by a cache that started
        // later).
        let from = if rng.random_range(0..5) == 0 {
            rng.random_range(1..=latest)
        } else {
            latest.saturating_sub(rng.random_range(0..40)).max(1)
        };
        let wp = WatchParams::default().timeout(rng.random_range(3..10));
        let call = rec.now();
        let mut items = Vec::new();
        match tokio::time::timeout(CALL_TIMEOUT, api.watch(&wp, &from.to_string())).await {
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => items.push(WatchItem::Expired),
            Ok(Err(_)) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Ok(Ok(stream)) => {
                let mut stream = stream.boxed();
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => break,
                        n = tokio::time::timeout(Duration::from_secs(15), stream.next()) => n,
                    };
                    let item = match next {
                        Ok(Some(Ok(WatchEvent::Added(ps)))) => {
                            seen(&ps).map(|s| WatchItem::Added { key: key_of(&ps), seen: s })
                        }
                        Ok(Some(Ok(WatchEvent::Modified(ps)))) => {
                            seen(&ps).map(|s| WatchItem::Modified { key: key_of(&ps), seen: s })
                        }
                        Ok(Some(Ok(WatchEvent::Deleted(ps)))) => seen(&ps)
                            .map(|s| WatchItem::Deleted { key: key_of(&ps), resource_version: s.resource_version }),
                        Ok(Some(Ok(WatchEvent::Bookmark(b)))) => b
                            .metadata
                            .resource_version
                            .parse()
                            .ok()
                            .map(|rv| WatchItem::Bookmark { resource_version: rv }),
                        Ok(Some(Ok(WatchEvent::Error(s)))) if s.code == 410 => {
                            items.push(WatchItem::Expired);
                            break;
                        }
                        _ => break,
                    };
                    match item {
                        Some(i) => items.push(i),
                        None => break,
                    }
                }
            }
        }
        rec.watches.lock().unwrap().push(Watch {
            client: id,
            route: route.name.clone(),
            namespace: NAMESPACE.into(),
            from,
            call,
            items,
        });
    }
}
