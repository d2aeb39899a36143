//! A work queue of PodSet keys with client-go's guarantees: a key waits at most once, is never processed by two
//! workers at a time, and a key added while processed runs again after; failures requeue with exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
}

#[derive(Default)]
pub struct Queue {
    state: Mutex<State>,
    notify: Notify,
}

const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(60);

impl Queue {
    pub fn add(&self, key: &str) {
        let mut s = self.state.lock();
        if !s.dirty.insert(key.to_owned()) {
            return;
        }
        if !s.processing.contains(key) {
            s.queue.push_back(key.to_owned());
            drop(s);
            self.notify.notify_one();
        }
    }

    pub fn add_after(self: &Arc<Self>, key: &str, delay: Duration) {
        let (q, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(&key);
        });
    }

    /// Requeues a failed key after 5 ms · 2^failures, at most a minute.
    pub fn add_rate_limited(self: &Arc<Self>, key: &str) {
        let delay = {
            let mut s = self.state.lock();
            let n = s.failures.entry(key.to_owned()).or_default();
            *n += 1;
            BASE_DELAY.saturating_mul(2u32.saturating_pow((*n - 1).min(20))).min(MAX_DELAY)
        };
        self.add_after(key, delay);
    }

    pub fn forget(&self, key: &str) {
        self.state.lock().failures.remove(key);
    }

    /// Waits for the next key and marks it processing.
    pub async fn get(&self) -> String {
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

    pub fn done(&self, key: &str) {
        let mut s = self.state.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.to_owned());
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
        let q = Arc::new(Queue::default());
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.get().await, "a");
        q.add("a"); // while processing: runs again after done
        assert_eq!(q.get().await, "b");
        let next = tokio::time::timeout(Duration::from_millis(50), q.get()).await;
        assert!(next.is_err(), "a is still being processed");
        q.done("a");
        assert_eq!(q.get().await, "a");
    }

    #[tokio::test]
    async fn failures_back_off_exponentially() {
        let q = Arc::new(Queue::default());
        for _ in 0..6 {
            q.add_rate_limited("a");
        }
        // The sixth failure waits 160 ms; the first ones arrive sooner and dedupe into one.
        assert_eq!(q.get().await, "a");
        assert_eq!(q.state.lock().failures["a"], 6);
        q.forget("a");
        assert!(q.state.lock().failures.is_empty());
    }
}
