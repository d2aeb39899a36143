//! ReplicaSet-style expectations: creates and deletes in flight per PodSet. Until the Pod watch has shown them (or
//! they expire), the controller does not act on that PodSet again, so a stale cache never makes extra Pods.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
struct Pending {
    adds: i64,
    deletes: HashSet<String>,
    since: Instant,
}

/// Expectations per key (a PodSet's).
#[derive(Debug)]
pub struct Expectations<K> {
    timeout: Duration,
    inner: Mutex<HashMap<K, Pending>>,
}

impl<K: Clone + Eq + Hash> Expectations<K> {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout, inner: Mutex::default() }
    }

    /// True when nothing is in flight for `key` (or what was in flight is too old to wait for).
    pub fn satisfied(&self, key: &K) -> bool {
        match self.inner.lock().get(key) {
            None => true,
            Some(p) => (p.adds <= 0 && p.deletes.is_empty()) || p.since.elapsed() > self.timeout,
        }
    }

    pub fn expect_creations(&self, key: &K, n: usize) {
        self.inner
            .lock()
            .insert(key.clone(), Pending { adds: n as i64, deletes: HashSet::new(), since: Instant::now() });
    }

    pub fn expect_deletions(&self, key: &K, pods: impl IntoIterator<Item = String>) {
        let deletes = pods.into_iter().collect();
        self.inner.lock().insert(key.clone(), Pending { adds: 0, deletes, since: Instant::now() });
    }

    /// A Pod of `key` appeared in the watch, or a create was given up.
    pub fn creation_observed(&self, key: &K) {
        if let Some(p) = self.inner.lock().get_mut(key) {
            p.adds -= 1;
        }
    }

    /// Pod `uid` of `key` went away (or started terminating) in the watch, or its delete was given up.
    pub fn deletion_observed(&self, key: &K, uid: &str) {
        if let Some(p) = self.inner.lock().get_mut(key) {
            p.deletes.remove(uid);
        }
    }

    pub fn forget(&self, key: &K) {
        self.inner.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_every_create_and_delete() {
        let e = Expectations::new(Duration::from_secs(60));
        assert!(e.satisfied(&"a"));
        e.expect_creations(&"a", 2);
        assert!(!e.satisfied(&"a"));
        e.creation_observed(&"a");
        assert!(!e.satisfied(&"a"));
        e.creation_observed(&"a");
        assert!(e.satisfied(&"a"));
        e.expect_deletions(&"a", ["u1".to_owned(), "u2".to_owned()]);
        e.deletion_observed(&"a", "u1");
        e.deletion_observed(&"a", "other");
        assert!(!e.satisfied(&"a"));
        e.deletion_observed(&"a", "u2");
        assert!(e.satisfied(&"a"));
    }

    #[test]
    fn expire_after_the_timeout() {
        let e = Expectations::new(Duration::from_millis(10));
        e.expect_creations(&"a", 5);
        assert!(!e.satisfied(&"a"));
        std::thread::sleep(Duration::from_millis(20));
        assert!(e.satisfied(&"a"));
    }
}
