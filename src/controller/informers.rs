//! Whether the controller's caches have their first full list (`informer-sync` on `/readyz`, as k8s.io/apiserver's
//! check on its shared informers). The controller registers its caches here; the wiring turns it into a health check.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Caches that must have their first full list before this replica serves consistently, by name (`informer-sync`,
/// as k8s.io/apiserver's check on its shared informers). An entry lives as long as its [`InformerHandle`]: a
/// controller that stops (lost leadership) takes its caches out of the check.
#[derive(Clone, Default)]
pub struct InformerSync {
    informers: Arc<Mutex<Informers>>,
}

/// Registered caches by (name, registration), and whether each has synced.
#[derive(Default)]
struct Informers {
    next: u64,
    synced: BTreeMap<(String, u64), bool>,
}

/// One registered cache; mark it synced once its first list is in, dropped when the cache goes away.
pub struct InformerHandle {
    key: (String, u64),
    informers: Arc<Mutex<Informers>>,
}

impl InformerHandle {
    pub fn synced(&self) {
        if let Some(s) = self.informers.lock().synced.get_mut(&self.key) {
            *s = true;
        }
    }
}

impl Drop for InformerHandle {
    fn drop(&mut self) {
        self.informers.lock().synced.remove(&self.key);
    }
}

impl std::fmt::Debug for InformerSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerSync").field("synced", &self.informers.lock().synced).finish()
    }
}

impl InformerSync {
    /// Registers a cache that has not synced yet.
    pub fn register(&self, name: &str) -> InformerHandle {
        let mut informers = self.informers.lock();
        informers.next += 1;
        let key = (name.to_owned(), informers.next);
        informers.synced.insert(key.clone(), false);
        InformerHandle { key, informers: self.informers.clone() }
    }

    /// Ok when every registered cache has synced, else kube-apiserver's "N informers not started yet: [..]".
    pub fn check(&self) -> Result<(), String> {
        let informers = self.informers.lock();
        let pending: Vec<&str> =
            informers.synced.iter().filter(|(_, s)| !**s).map(|((name, _), _)| name.as_str()).collect();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!("{} informers not started yet: [{}]", pending.len(), pending.join(" ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn informer_sync_waits_for_every_registered_cache() {
        let sync = InformerSync::default();
        assert_eq!(sync.check(), Ok(()), "no caches: nothing to wait for");
        let pods = sync.register("pods");
        let podsets = sync.register("podsets");
        assert_eq!(sync.check(), Err("2 informers not started yet: [pods podsets]".into()));
        pods.synced();
        assert_eq!(sync.check(), Err("1 informers not started yet: [podsets]".into()));
        podsets.synced();
        assert_eq!(sync.check(), Ok(()));
        let again = sync.register("pods");
        assert!(sync.check().is_err(), "a restarted cache must sync again");
        drop(pods);
        assert!(sync.check().is_err(), "the old cache going away does not unregister the new one");
        drop(again);
        drop(podsets);
        assert_eq!(sync.check(), Ok(()), "a stopped controller's caches no longer count");
    }
}
