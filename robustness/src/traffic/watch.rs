//! Watches as clients hold them. Watchers open short watches one after another: from a revision seen, from
//! `resourceVersion` unset or `0`, or with `sendInitialEvents`. Informers hold one for the whole run as client-go's
//! reflector does: list (or a WatchList), watch from the list's revision, resume from the last revision told after
//! every break, list again after 410.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::Resource;
use podset_apiserver::api::PodSet;
use rand::rngs::StdRng;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::{failure, record, seen_meta, Recorder, Route, CALL_TIMEOUT, NAMESPACES};
use crate::model::history::{ReadFrom, Request, Response, Watch, WatchEnd, WatchItem, WatchStart};

/// A watch that told nothing for this long is taken as broken.
const SILENCE: Duration = Duration::from_secs(15);

fn api(route: &Route, namespace: &str) -> Api<PodSet> {
    if namespace.is_empty() {
        Api::all(route.client.clone())
    } else {
        Api::namespaced(route.client.clone(), namespace)
    }
}

fn key_of_meta(meta: &kube::core::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""))
}

/// Reads a watch until it ends or `stop`; `told` sees each item as it comes.
async fn follow<K: Resource>(
    stream: impl Stream<Item = kube::Result<WatchEvent<K>>>,
    stop: &CancellationToken,
    mut told: impl FnMut(&WatchItem),
) -> (Vec<WatchItem>, WatchEnd) {
    let mut stream = std::pin::pin!(stream);
    let mut items = Vec::new();
    let end = loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break WatchEnd::Stopped,
            n = tokio::time::timeout(SILENCE, stream.next()) => n,
        };
        let event = match next {
            Err(_) => break WatchEnd::Silent,
            Ok(None) => break WatchEnd::Closed,
            Ok(Some(Err(e))) => break WatchEnd::Failed(e.to_string()),
            Ok(Some(Ok(e))) => e,
        };
        let object = |o: &K| seen_meta(o.meta()).map(|s| (key_of_meta(o.meta()), s));
        let item = match &event {
            WatchEvent::Added(o) => object(o).map(|(key, seen)| WatchItem::Added { key, seen }),
            WatchEvent::Modified(o) => object(o).map(|(key, seen)| WatchItem::Modified { key, seen }),
            WatchEvent::Deleted(o) => object(o).map(|(key, s)| WatchItem::Deleted {
                key,
                resource_version: s.resource_version,
                marker: Some(s.marker),
            }),
            WatchEvent::Bookmark(b) => {
                b.metadata.resource_version.parse().ok().map(|rv| WatchItem::Bookmark { resource_version: rv })
            }
            WatchEvent::Error(s) if s.code == 410 => Some(WatchItem::Expired),
            WatchEvent::Error(s) => {
                break WatchEnd::Failed(format!("ERROR event {} {}: {}", s.code, s.reason, s.message))
            }
        };
        let Some(item) = item else { break WatchEnd::Failed(format!("an event without a resourceVersion: {event:?}")) };
        told(&item);
        let expired = item == WatchItem::Expired;
        items.push(item);
        if expired {
            break WatchEnd::Expired;
        }
    };
    (items, end)
}

/// Starts a watch and reads it to its end: full objects or metadata only.
async fn watch_once(
    api: &Api<PodSet>,
    wp: &WatchParams,
    rv: &str,
    metadata_only: bool,
    stop: &CancellationToken,
    told: impl FnMut(&WatchItem),
) -> (Vec<WatchItem>, WatchEnd) {
    let refused = |e: kube::Error| match e {
        kube::Error::Api(s) if s.code == 410 => (vec![WatchItem::Expired], WatchEnd::Expired),
        e => (Vec::new(), WatchEnd::NotStarted(e.to_string())),
    };
    let timed_out = || (Vec::new(), WatchEnd::NotStarted("no answer".into()));
    if metadata_only {
        match tokio::time::timeout(CALL_TIMEOUT, api.watch_metadata(wp, rv)).await {
            Ok(Ok(stream)) => follow(stream, stop, told).await,
            Ok(Err(e)) => refused(e),
            Err(_) => timed_out(),
        }
    } else {
        match tokio::time::timeout(CALL_TIMEOUT, api.watch(wp, rv)).await {
            Ok(Ok(stream)) => follow(stream, stop, told).await,
            Ok(Err(e)) => refused(e),
            Err(_) => timed_out(),
        }
    }
}

/// Short watches, one after another, each from a start drawn at random, on a namespace or all of them.
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
        let namespace = match rng.random_range(0..4) {
            0 => "",
            i => NAMESPACES[i % NAMESPACES.len()],
        };
        let mut wp = WatchParams::default().timeout(rng.random_range(3..10));
        let (start, from) = match rng.random_range(0..20) {
            0..3 => (WatchStart::Latest, 0),
            3..5 => (WatchStart::Any, 0),
            5..8 => {
                wp = wp.initial_events();
                (WatchStart::InitialEvents, 0)
            }
            // Mostly near the newest revision; sometimes far back, to replay (or be told 410 by a cache that
            // started later).
            8..12 => (WatchStart::From, rng.random_range(1..=latest)),
            _ => (WatchStart::From, latest.saturating_sub(rng.random_range(0..40)).max(1)),
        };
        let rv = match start {
            WatchStart::From => from.to_string(),
            WatchStart::Any => "0".into(),
            _ => String::new(),
        };
        let call = rec.now();
        let (items, end) = watch_once(&api(&route, namespace), &wp, &rv, false, &stop, |_| {}).await;
        if matches!(end, WatchEnd::NotStarted(_)) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        rec.watches.lock().unwrap().push(Watch {
            client: id,
            route: route.name.clone(),
            namespace: namespace.into(),
            from,
            call,
            items,
            start,
            end,
            ..Default::default()
        });
    }
}

/// One informer: a route, a namespace (`""`: all), and how far it has got, for the run to wait on.
pub(crate) struct Informer {
    pub(crate) id: usize,
    pub(crate) client: usize,
    pub(crate) route: Route,
    pub(crate) namespace: String,
    pub(crate) metadata_only: bool,
    pub(crate) reached: Arc<AtomicU64>,
}

impl Informer {
    /// List and watch until `stop`, as a reflector.
    pub(crate) async fn run(self, rec: Arc<Recorder>, mut rng: StdRng, stop: CancellationToken) {
        let api = api(&self.route, &self.namespace);
        // Where to resume; None: list first.
        let mut from: Option<u64> = None;
        while !stop.is_cancelled() {
            let mut wp = WatchParams::default().timeout(rng.random_range(5..30));
            let (start, after_list, rv) = match from {
                Some(p) => (WatchStart::From, false, p),
                // A WatchList, as client-go's reflector does where the server allows it.
                None if rng.random_range(0..3) == 0 => {
                    wp = wp.initial_events();
                    (WatchStart::InitialEvents, true, 0)
                }
                None => match self.list(&api, &rec, &mut rng).await {
                    Some(rv) => (WatchStart::From, true, rv),
                    None => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            self.reached.fetch_max(rv, Ordering::Relaxed);
            let call = rec.now();
            let rv_param = if start == WatchStart::From { rv.to_string() } else { String::new() };
            let reached = self.reached.clone();
            let mut initial_done = start == WatchStart::From;
            let (items, end) = watch_once(&api, &wp, &rv_param, self.metadata_only, &stop, |item| {
                // Before the initial-events-end bookmark, items say nothing about how far the watch has got.
                match item {
                    WatchItem::Bookmark { resource_version } => {
                        initial_done = true;
                        reached.fetch_max(*resource_version, Ordering::Relaxed);
                    }
                    i if initial_done => {
                        if let Some((_, rv)) = i.event() {
                            reached.fetch_max(rv, Ordering::Relaxed);
                        }
                    }
                    _ => {}
                }
            })
            .await;
            from = match &end {
                WatchEnd::Expired => None,
                WatchEnd::NotStarted(_) => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    from.or((start == WatchStart::From).then_some(rv))
                }
                _ if start == WatchStart::InitialEvents
                    && !items.iter().any(|i| matches!(i, WatchItem::Bookmark { .. })) =>
                {
                    None
                }
                _ => Some(items.iter().filter_map(WatchItem::revision).fold(rv, u64::max)),
            };
            rec.watches.lock().unwrap().push(Watch {
                client: self.client,
                route: self.route.name.clone(),
                namespace: self.namespace.clone(),
                from: rv,
                call,
                items,
                start,
                end,
                informer: Some(self.id),
                after_list,
                metadata_only: self.metadata_only,
            });
        }
    }

    /// A list, recorded as a call: its revision, or None if it failed.
    async fn list(&self, api: &Api<PodSet>, rec: &Recorder, rng: &mut StdRng) -> Option<u64> {
        let any = rng.random_range(0..4) == 0;
        let limit = rng.random_range(2..6);
        let req = Request::List {
            namespace: self.namespace.clone(),
            from: if any { ReadFrom::Any } else { ReadFrom::Latest },
            group: None,
        };
        let metadata_only = self.metadata_only;
        let answer = record(rec, self.client, &self.route.name, req, async move {
            let mut items = Vec::new();
            let mut lp = if any { ListParams::default().match_any() } else { ListParams::default().limit(limit) };
            let mut at = None;
            loop {
                let page = if metadata_only {
                    api.list_metadata(&lp)
                        .await
                        .map(|l| (l.metadata, l.items.into_iter().map(|o| o.metadata).collect()))
                } else {
                    api.list(&lp).await.map(|l| (l.metadata, l.items.into_iter().map(|o| o.metadata).collect()))
                };
                let (metadata, page): (_, Vec<kube::core::ObjectMeta>) = match page {
                    Ok(p) => p,
                    // Judged as any list's 410 (only a continue token's may be one here).
                    Err(kube::Error::Api(s)) if s.code == 410 => {
                        return Response::Expired { revision: at.unwrap_or(0), continued: at.is_some() };
                    }
                    Err(e) => return failure(&e),
                };
                at = at.or(metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok()));
                for m in &page {
                    match seen_meta(m) {
                        Some(s) => items.push((key_of_meta(m), s)),
                        None => return Response::Refused("an item without a resourceVersion".into()),
                    }
                }
                match metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = ListParams::default().limit(limit).continue_token(&c),
                    None => break,
                }
            }
            match at {
                Some(resource_version) => Response::List { resource_version, items },
                None => Response::Refused("a list without a resourceVersion".into()),
            }
        })
        .await;
        match answer {
            Response::List { resource_version, .. } => Some(resource_version),
            _ => None,
        }
    }
}
