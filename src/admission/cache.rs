//! A cache of one kind of the main API server's objects, as the plugins read them: a reflector over a watch of
//! every object, or one filled by hand (tests) and kept open; whether its first list is in, and a bounded wait
//! for it (k8s.io/apiserver's `WaitForReady`).

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use tokio_util::sync::CancellationToken;

use super::READY_WAIT;

/// A reflector's store, and the writer of a store filled by hand (kept so it stays open).
#[derive(Clone)]
pub(crate) struct Cache<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    pub store: Store<K>,
    _writer: Option<Arc<parking_lot::Mutex<reflector::store::Writer<K>>>>,
}

impl<K> Cache<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    /// Every `K` of `api`, watched until `stop`; `what` names it in the log.
    pub fn watch(api: kube::Api<K>, what: &'static str, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::warn!(error = %e, "admission: watching {what}"),
                        None => return,
                    },
                }
            }
        });
        Self { store, _writer: None }
    }

    /// A cache holding `objects` and nothing else.
    pub fn fixed(objects: Vec<K>) -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Self { store, _writer: Some(Arc::new(parking_lot::Mutex::new(writer))) }
    }

    /// A cache whose first list never arrives.
    #[cfg(test)]
    pub fn never_synced() -> Self {
        let (store, writer) = reflector::store();
        Self { store, _writer: Some(Arc::new(parking_lot::Mutex::new(writer))) }
    }

    /// Whether the first list is in.
    pub fn has_synced(&self) -> bool {
        matches!(self.store.wait_until_ready().now_or_never(), Some(Ok(())))
    }

    /// Waits up to [`READY_WAIT`] for the first list.
    pub async fn wait_for_ready(&self) -> bool {
        matches!(tokio::time::timeout(READY_WAIT, self.store.wait_until_ready()).await, Ok(Ok(())))
    }
}
