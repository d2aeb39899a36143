//! The namespaces' ResourceQuotas as the plugin reads and writes them (upstream's `resource_access.go`): a watched
//! cache; a live list, kept 30 s, for a namespace the cache has none in (a quota made a moment ago); the newest
//! status this server wrote, preferred over an older cached copy; and status writes with the quota's
//! resourceVersion, so a concurrent writer's change is a conflict, never overwritten.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ListParams, PostParams};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::admission::cache::Cache;

/// How long a live list of a namespace with no cached quota is reused.
const LIVE_LOOKUP_TTL: Duration = Duration::from_secs(30);
/// Statuses written, and live lists, kept at most (upstream's LRU sizes).
const KEPT: usize = 100;
/// How long one call to the main API server may take: a create waits 10 s for its verdict in all.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// `call`, failed if the main API server does not answer within [`CALL_TIMEOUT`].
async fn answered<T>(call: impl std::future::Future<Output = kube::Result<T>>) -> Result<T, Failure> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(Arc::new),
        Err(_) => Err(Arc::new(kube::Error::Service("the main API server did not answer in time".into()))),
    }
}

/// The main API server's ResourceQuotas.
#[derive(Clone)]
pub struct Quotas {
    cache: Cache<ResourceQuota>,
    client: Option<kube::Client>,
    /// Per namespace: when it was listed live, and what the list held.
    live: Arc<Mutex<HashMap<String, Listed>>>,
    /// Per namespace/name: the newest quota this server wrote the status of.
    written: Arc<Mutex<HashMap<(String, String), ResourceQuota>>>,
}

type Failure = Arc<kube::Error>;

/// A live list of one namespace's quotas, and when it was made.
type Listed = (Instant, Vec<ResourceQuota>);

impl Quotas {
    /// Watches every ResourceQuota until `stop`.
    pub fn watch(client: kube::Client, stop: CancellationToken) -> Self {
        let cache = Cache::watch(Api::all(client.clone()), "resourcequotas", stop);
        Self::over(cache, Some(client))
    }

    /// A cache holding `quotas` and nothing else, with no main API server behind it (status writes fail).
    pub fn fixed(quotas: Vec<ResourceQuota>) -> Self {
        Self::over(Cache::fixed(quotas), None)
    }

    /// A cache holding `quotas`, and `client` for status writes and live lists: a main API server whose state
    /// has moved on from the cache's.
    #[cfg(test)]
    pub(crate) fn fixed_with_client(quotas: Vec<ResourceQuota>, client: kube::Client) -> Self {
        Self::over(Cache::fixed(quotas), Some(client))
    }

    fn over(cache: Cache<ResourceQuota>, client: Option<kube::Client>) -> Self {
        Self { cache, client, live: Arc::default(), written: Arc::default() }
    }

    pub fn has_synced(&self) -> bool {
        self.cache.has_synced()
    }

    pub(crate) async fn wait_for_ready(&self) -> bool {
        self.cache.wait_for_ready().await
    }

    /// Whether a quota may apply to a write: one exists (cached, or found by a live list), or the first list is
    /// still to come.
    pub(crate) fn may_apply(&self) -> bool {
        !self.has_synced() || !self.cache.store.is_empty() || self.live.lock().values().any(|(_, q)| !q.is_empty())
    }

    /// The quotas of `namespace`, each the newest this server knows.
    pub(crate) async fn get(&self, namespace: &str) -> Result<Vec<ResourceQuota>, Failure> {
        let mut quotas: Vec<ResourceQuota> = self
            .cache
            .store
            .state()
            .iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(namespace))
            .map(|q| (**q).clone())
            .collect();
        if quotas.is_empty() {
            quotas = self.live(namespace).await?;
        }
        let written = self.written.lock();
        for q in &mut quotas {
            let key = (namespace.to_owned(), q.metadata.name.clone().unwrap_or_default());
            if let Some(w) = written.get(&key).filter(|w| revision(w) > revision(q)) {
                *q = w.clone();
            }
        }
        // In name order, so a refusal names the same quota each time.
        quotas.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(quotas)
    }

    /// `namespace`'s quotas as the main API server has them now, for a retry after a status write lost a race:
    /// the cache may not have the write that won yet, and a retry against it would only lose again.
    pub(crate) async fn get_live(&self, namespace: &str) -> Result<Vec<ResourceQuota>, Failure> {
        let Some(client) = &self.client else { return self.get(namespace).await };
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
        let mut quotas = answered(api.list(&ListParams::default())).await?.items;
        quotas.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(quotas)
    }

    /// A live list of `namespace`'s quotas, reused for [`LIVE_LOOKUP_TTL`].
    async fn live(&self, namespace: &str) -> Result<Vec<ResourceQuota>, Failure> {
        if let Some((at, quotas)) = self.live.lock().get(namespace) {
            if at.elapsed() < LIVE_LOOKUP_TTL {
                return Ok(quotas.clone());
            }
        }
        let Some(client) = &self.client else { return Ok(Vec::new()) };
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
        let quotas = answered(api.list(&ListParams::default())).await?.items;
        let mut live = self.live.lock();
        if live.len() >= KEPT {
            live.clear();
        }
        live.insert(namespace.to_owned(), (Instant::now(), quotas.clone()));
        Ok(quotas)
    }

    /// Writes `quota`'s status, on its resourceVersion.
    pub(crate) async fn update_status(&self, quota: &ResourceQuota) -> Result<(), Failure> {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        let name = quota.metadata.name.clone().unwrap_or_default();
        let Some(client) = &self.client else {
            return Err(Arc::new(kube::Error::Service("no main API server to write quota status to".into())));
        };
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), &namespace);
        let updated = answered(api.replace_status(&name, &PostParams::default(), quota)).await?;
        let mut written = self.written.lock();
        if written.len() >= KEPT {
            written.clear();
        }
        written.insert((namespace, name), updated);
        Ok(())
    }
}

fn revision(q: &ResourceQuota) -> u64 {
    q.metadata.resource_version.as_deref().and_then(|rv| rv.parse().ok()).unwrap_or(0)
}
