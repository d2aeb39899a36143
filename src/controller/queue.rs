//! A work queue of keys (PodSets') with client-go's guarantees: a key waits at most once, is never processed by two
//! workers at a time, and a key added while processed runs again after; failures requeue as client-go's
//! `DefaultControllerRateLimiter` has them wait: the longer of a per-key exponential backoff and a bucket shared by
//! every key.
//! A named queue exports client-go's `workqueue_*{name}` metrics.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::Notify;

use super::metrics::{metrics, NameLabel};

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    /// When each queued key was queued, and each processing key taken (for the durations).
    queued_at: HashMap<K, Instant>,
    started_at: HashMap<K, Instant>,
    bucket: Bucket,
}

/// Go's `rate.Limiter` as `Reserve` uses it: tokens refill at [`BUCKET_RATE`] per second up to [`BUCKET_BURST`],
/// and a reservation that finds none waits for its token.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn reserve(&mut self, now: Instant) -> Duration {
        let refilled = self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * BUCKET_RATE;
        self.tokens = refilled.min(BUCKET_BURST) - 1.0;
        self.at = now;
        match self.tokens < 0.0 {
            true => Duration::from_secs_f64(-self.tokens / BUCKET_RATE),
            false => Duration::ZERO,
        }
    }
}

/// This queue's series of client-go's workqueue metrics.
struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
}

impl QueueMetrics {
    fn new(name: &str) -> Self {
        let q = &metrics().workqueue;
        let l = NameLabel { name: name.to_owned() };
        Self {
            depth: q.depth.get_or_create(&l).clone(),
            adds: q.adds.get_or_create(&l).clone(),
            retries: q.retries.get_or_create(&l).clone(),
            queue_duration: q.queue_duration.get_or_create(&l).clone(),
            work_duration: q.work_duration.get_or_create(&l).clone(),
        }
    }
}

pub struct Queue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    metrics: Option<QueueMetrics>,
}

impl<K> Default for Queue<K> {
    fn default() -> Self {
        let state = State {
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            failures: HashMap::new(),
            queued_at: HashMap::new(),
            started_at: HashMap::new(),
            bucket: Bucket { tokens: BUCKET_BURST, at: Instant::now() },
        };
        Self { state: Mutex::new(state), notify: Notify::new(), metrics: None }
    }
}

impl<K> Queue<K> {
    /// A queue whose metrics carry `name` (kube-controller-manager names its queues after their controller).
    pub fn named(name: &str) -> Self {
        Self { metrics: Some(QueueMetrics::new(name)), ..Self::default() }
    }
}

/// `ItemExponentialFailureRateLimiter(5ms, 1000s)`.
const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1000);
/// `BucketRateLimiter{rate.NewLimiter(10, 100)}`: retries of all keys together, 10 a second after a burst of 100.
const BUCKET_RATE: f64 = 10.0;
const BUCKET_BURST: f64 = 100.0;

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Queue<K> {
    pub fn add(&self, key: &K) {
        let mut s = self.state.lock();
        if !s.dirty.insert(key.clone()) {
            return;
        }
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
        if !s.processing.contains(key) {
            self.push(&mut s, key);
            drop(s);
            self.notify.notify_one();
        }
    }

    fn push(&self, s: &mut State<K>, key: &K) {
        s.queue.push_back(key.clone());
        if let Some(m) = &self.metrics {
            m.depth.inc();
            s.queued_at.insert(key.clone(), Instant::now());
        }
    }

    pub fn add_after(self: &Arc<Self>, key: &K, delay: Duration) {
        let (q, key) = (self.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(&key);
        });
    }

    /// Requeues a failed key after the longer of 5 ms · 2^(failures - 1), at most 1000 s, and the shared bucket's
    /// wait.
    pub fn add_rate_limited(self: &Arc<Self>, key: &K) {
        let delay = self.retry_delay(key, Instant::now());
        self.add_after(key, delay);
    }

    fn retry_delay(&self, key: &K, now: Instant) -> Duration {
        let mut s = self.state.lock();
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
        let n = s.failures.entry(key.clone()).or_default();
        *n += 1;
        let backoff = BASE_DELAY.saturating_mul(2u32.saturating_pow((*n - 1).min(30))).min(MAX_DELAY);
        backoff.max(s.bucket.reserve(now))
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
                    if let Some(m) = &self.metrics {
                        m.depth.dec();
                        if let Some(at) = s.queued_at.remove(&key) {
                            m.queue_duration.observe(at.elapsed().as_secs_f64());
                        }
                        s.started_at.insert(key.clone(), Instant::now());
                    }
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
        if let Some(m) = &self.metrics {
            if let Some(at) = s.started_at.remove(key) {
                m.work_duration.observe(at.elapsed().as_secs_f64());
            }
        }
        if s.dirty.contains(key) {
            self.push(&mut s, key);
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
    async fn a_named_queue_reports_client_go_workqueue_metrics() {
        let name = "test-queue-metrics";
        let q = Arc::new(Queue::<&str>::named(name));
        q.add(&"a");
        q.add(&"b");
        q.add(&"a");
        let key = q.get().await;
        q.done(&key);
        q.add_rate_limited(&"c");
        let text = crate::metrics::encode();
        let series = |metric: &str| {
            let prefix = format!("{metric}{{name=\"{name}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_owned)
        };
        assert_eq!(series("workqueue_adds_total").as_deref(), Some("2"), "a queued key is added once");
        assert_eq!(series("workqueue_depth").as_deref(), Some("1"));
        assert_eq!(series("workqueue_retries_total").as_deref(), Some("1"));
        assert_eq!(series("workqueue_queue_duration_seconds_count").as_deref(), Some("1"));
        assert_eq!(series("workqueue_work_duration_seconds_count").as_deref(), Some("1"));
    }

    // Mirrors workqueue.DefaultControllerRateLimiter: MaxOf(ItemExponentialFailureRateLimiter(5ms, 1000s),
    // BucketRateLimiter(10/s, burst 100)).
    #[test]
    fn retries_wait_for_the_key_and_for_the_shared_bucket() {
        let q = Queue::<u32>::default();
        let now = Instant::now();
        let delays: Vec<Duration> = (1..=9).map(|_| q.retry_delay(&0, now)).collect();
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[8], Duration::from_millis(5 * 256));
        let delays: Vec<Duration> = (0..40).map(|_| q.retry_delay(&1, now)).collect();
        assert_eq!(delays[39], MAX_DELAY, "the backoff stops at 1000 s");
        // 49 tokens of 100 spent above; other keys' first failures go at once until the burst is gone, then one
        // every 100 ms.
        let first: Vec<Duration> = (2..53).map(|k| q.retry_delay(&k, now)).collect();
        assert!(first.iter().all(|d| *d == BASE_DELAY), "{first:?}");
        let waiting: Vec<Duration> = (53..56).map(|k| q.retry_delay(&k, now)).collect();
        let ms = |d: &Duration| (d.as_secs_f64() * 1000.0).round() as u64;
        assert_eq!(waiting.iter().map(ms).collect::<Vec<_>>(), [100, 200, 300]);
        // A second later ten tokens are back (three of them owed): the wait is the key's own again.
        let later = now + Duration::from_secs(1);
        assert_eq!(q.retry_delay(&99, later), BASE_DELAY);
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
