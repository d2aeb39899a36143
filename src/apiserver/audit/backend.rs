//! Where events go, and how: each backend (log, webhook) behind the mode k8s.io/apiserver wraps it in
//! (`truncate(mode(backend))`), and all of them behind one [`Union`].
//!
//! - `blocking`: the request waits while its event is written; a failure is counted, the request goes on.
//! - `blocking-strict`: as `blocking`, but a request whose `RequestReceived` event cannot be written fails (500).
//! - `batch`: events are queued (`--audit-*-batch-buffer-size`) and handed on by a thread of their own, in batches
//!   of up to `--audit-*-batch-max-size` at most `--audit-*-batch-max-wait` apart, at most
//!   `--audit-*-batch-throttle-qps` batches a second if throttled. A full queue drops the event
//!   (`apiserver_audit_error_total{plugin="buffered"}`); the request never waits.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{metrics, PluginLabel};
use super::Event;

/// Something that takes events.
pub trait Backend: Send + Sync + 'static {
    /// The plugin name errors are counted under.
    fn name(&self) -> &'static str;

    /// Takes the events; false if they were not all written (only `blocking-strict` acts on it).
    fn process(&self, events: &[Event]) -> bool;
}

/// Events named one by one in a plugin error's log line.
const NAMED_EVENTS: usize = 3;
/// A plugin's errors are logged at most this often (with how many events they cost since); kube logs every one,
/// which under a flood of drops (a full queue) makes the log the bottleneck.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// kube's `HandlePluginError`: counted per event (`apiserver_audit_error_total{plugin}`), logged with the first
/// events' one-line form, at most once a second per plugin.
pub fn plugin_error(plugin: &str, error: &str, events: &[Event]) {
    metrics().errors.get_or_create(&PluginLabel { plugin: plugin.into() }).inc_by(events.len() as u64);
    static LAST: parking_lot::Mutex<Vec<(String, Instant, u64)>> = parking_lot::Mutex::new(Vec::new());
    let since = {
        let mut last = LAST.lock();
        let at = match last.iter().position(|(p, ..)| p == plugin) {
            Some(i) => i,
            None => {
                last.push((plugin.to_owned(), Instant::now().checked_sub(LOG_EVERY).unwrap_or_else(Instant::now), 0));
                last.len() - 1
            }
        };
        let entry = &mut last[at];
        entry.2 += events.len() as u64;
        if entry.1.elapsed() < LOG_EVERY {
            return;
        }
        entry.1 = Instant::now();
        std::mem::take(&mut entry.2)
    };
    let lines: Vec<String> = events.iter().take(NAMED_EVENTS).map(Event::legacy_line).collect();
    tracing::error!(plugin, error, events = since, impacted = lines.join("\n"), "audit plugin error");
}

/// `--audit-*-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Batch,
    Blocking,
    BlockingStrict,
}

/// `--audit-*-batch-*`.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    pub buffer_size: usize,
    pub max_batch_size: usize,
    pub max_batch_wait: Duration,
    /// Batches a second, and the burst above it; `None`: not throttled.
    pub throttle: Option<(f64, u32)>,
}

/// `--audit-*-truncate-*`.
#[derive(Debug, Clone, Copy)]
pub struct TruncateConfig {
    pub max_event_size: usize,
    pub max_batch_size: usize,
}

/// A backend in its mode, truncating if asked.
pub fn wrap(
    backend: Arc<dyn Backend>,
    mode: Mode,
    batch: &BatchConfig,
    truncate: Option<TruncateConfig>,
) -> Arc<dyn Backend> {
    let moded: Arc<dyn Backend> = match mode {
        Mode::BlockingStrict => backend,
        Mode::Blocking => Arc::new(IgnoreErrors(backend)),
        Mode::Batch => Arc::new(Buffered::start(backend, batch.clone())),
    };
    match truncate {
        Some(cfg) => Arc::new(Truncate { delegate: moded, cfg }),
        None => moded,
    }
}

/// `blocking`: the delegate's failures are its own (counted there); the request goes on.
struct IgnoreErrors(Arc<dyn Backend>);

impl Backend for IgnoreErrors {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn process(&self, events: &[Event]) -> bool {
        self.0.process(events);
        true
    }
}

/// Every backend configured; an event failed if any of them failed it.
pub struct Union(pub Vec<Arc<dyn Backend>>);

impl Backend for Union {
    fn name(&self) -> &'static str {
        "union"
    }

    fn process(&self, events: &[Event]) -> bool {
        // Every backend gets the events, whatever the others did.
        let mut ok = true;
        for b in &self.0 {
            ok &= b.process(events);
        }
        ok
    }
}

/// `batch`: a bounded queue, and a thread that hands batches on.
pub struct Buffered {
    tx: SyncSender<Event>,
}

impl Buffered {
    pub fn start(delegate: Arc<dyn Backend>, cfg: BatchConfig) -> Self {
        let (tx, rx) = sync_channel(cfg.buffer_size.max(1));
        let name = format!("audit-{}", delegate.name());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run_batches(rx, delegate, cfg))
            .expect("starting the audit batch thread");
        Self { tx }
    }
}

impl Backend for Buffered {
    fn name(&self) -> &'static str {
        "buffered"
    }

    fn process(&self, events: &[Event]) -> bool {
        for (i, ev) in events.iter().enumerate() {
            match self.tx.try_send(ev.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    plugin_error("buffered", "audit buffer queue blocked", &events[i..]);
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    plugin_error("buffered", "audit backend shut down", &events[i..]);
                    break;
                }
            }
        }
        // As kube's: the request is never failed for a full queue.
        true
    }
}

fn run_batches(rx: Receiver<Event>, delegate: Arc<dyn Backend>, cfg: BatchConfig) {
    let mut bucket = cfg.throttle.map(|(qps, burst)| TokenBucket::new(qps, burst));
    let max = cfg.max_batch_size.max(1);
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + cfg.max_batch_wait;
        while batch.len() < max {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(ev) => batch.push(ev),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if let Some(b) = bucket.as_mut() {
            b.take();
        }
        delegate.process(&batch);
    }
}

/// client-go's token bucket: `qps` tokens a second, up to `burst` saved; `take` waits for one.
struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps: qps.max(f64::MIN_POSITIVE), burst, tokens: burst, at: Instant::now() }
    }

    fn take(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.qps).min(self.burst);
        self.at = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.qps);
            std::thread::sleep(wait);
            self.tokens = 1.0;
            self.at = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

/// The annotation a truncated event carries.
pub const TRUNCATED: &str = "audit.k8s.io/truncated";

/// `--audit-*-truncate-enabled`: an event above `max_event_size` loses its request and response objects (a
/// Request or RequestResponse one; any other is dropped), and batches are split to stay within `max_batch_size`.
struct Truncate {
    delegate: Arc<dyn Backend>,
    cfg: TruncateConfig,
}

fn size_of(ev: &Event) -> usize {
    serde_json::to_vec(ev).map(|v| v.len()).unwrap_or(usize::MAX)
}

impl Backend for Truncate {
    fn name(&self) -> &'static str {
        "truncate"
    }

    fn process(&self, events: &[Event]) -> bool {
        let mut ok = true;
        let (mut batch, mut batch_size) = (Vec::new(), 0usize);
        for ev in events {
            let mut size = size_of(ev);
            let mut ev = std::borrow::Cow::Borrowed(ev);
            if size > self.cfg.max_event_size && ev.level >= super::Level::Request {
                let mut t = ev.into_owned();
                t.request_object = None;
                t.response_object = None;
                t.annotations.insert(TRUNCATED.into(), "true".into());
                size = size_of(&t);
                ev = std::borrow::Cow::Owned(t);
            }
            if size > self.cfg.max_event_size {
                // Dropped, counted; as kube's, not a failure of the request.
                plugin_error("truncate", "event is too large even after truncating", std::slice::from_ref(&*ev));
                continue;
            }
            if !batch.is_empty() && batch_size + size > self.cfg.max_batch_size {
                ok = self.delegate.process(&batch) && ok;
                (batch, batch_size) = (Vec::new(), 0);
            }
            batch.push(ev.into_owned());
            batch_size += size;
        }
        if !batch.is_empty() {
            ok = self.delegate.process(&batch) && ok;
        }
        ok
    }
}

#[cfg(test)]
mod tests;
