//! A work queue of keys (PodSets') with client-go's guarantees: a key waits at most once, is never processed by two
//! workers at a time, and a key added while processed runs again after; failures requeue with exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
}

pub struct Queue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K> Default for Queue<K> {
    fn default() -> Self {
        let state = State {
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            failures: HashMap::new(),
        };
        Self { state: Mutex::new(state), notify: Notify::new() }
    }
}

const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(60);

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Queue<K> {
    pub fn add(&self, key: &K) {
        let mut s = self.state.lock();
        if !s.dirty.insert(key.clone()) {
            return;
        }
        if !s.processing.contains(key) {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    pub fn add_after(self: &Arc<Self>, key: &K, delay: Duration) {
        let (q, key) = (self.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(&key);
        });
    }

    /// Requeues a failed key after 5 ms · 2^failures, at most a minute.
    pub fn add_rate_limited(self: &Arc<Self>, key: &K) {
        let delay = {
            let mut s = self.state.lock();
            let n = s.failures.entry(key.clone()).or_default();
            *n += 1;
            BASE_DELAY.saturating_mul(2u32.saturating_pow((*n - 1).min(20))).min(MAX_DELAY)
        };
        self.add_after(key, delay);
    }

    pub fn forget(&self, key: &K) {
        self.state.lock().failures.remove(key);
    }

    /// Waits for the next key and marks it processing.
    pub async fn get(&self) -> K {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    if !s.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    pub fn done(&self, key: &K) {
        let mut s = self.state.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_queued_once_and_never_processed_twice_at_a_time() {
        let q = Arc::new(Queue::<&str>::default());
        q.add(&"a");
        q.add(&"a");
        q.add(&"b");
        assert_eq!(q.get().await, "a");
        q.add(&"a"); // while processing: runs again after done
        assert_eq!(q.get().await, "b");
        let next = tokio::time::timeout(Duration::from_millis(50), q.get()).await;
        assert!(next.is_err(), "a is still being processed");
        q.done(&"a");
        assert_eq!(q.get().await, "a");
    }

    #[tokio::test]
    async fn failures_back_off_exponentially() {
        let q = Arc::new(Queue::<&str>::default());
        for _ in 0..6 {
            q.add_rate_limited(&"a");
        }
        // The sixth failure waits 160 ms; the first ones arrive sooner and dedupe into one.
        assert_eq!(q.get().await, "a");
        assert_eq!(q.state.lock().failures["a"], 6);
        q.forget(&"a");
        assert!(q.state.lock().failures.is_empty());
    }
}
