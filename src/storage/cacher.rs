//! The cache every request reads: objects once, the event history, and the watch fan-out, fed by a durable
//! `Backend` through its change stream — kube-apiserver's cacher and watch cache over `storage.Interface`.
//!
//! Writes go to the backend; a write returns once the cache has applied its revision, so a client reads its own
//! writes and every watcher sees changes in revision order.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::RwLock;
use tokio::sync::watch;
use tracing::Instrument;

use super::state::State;
use super::{
    Backend, ChangeStream, Draft, Event, HistoryLimits, ListOptions, ListResult, Object, Result, Revision,
    StorageError, Store, StoreStats, WatchStream, Write,
};

/// Most events a watcher takes from the log under one read lock.
const WATCH_BATCH: usize = 256;
/// Pause before watching the backend again after its change stream failed; doubled up to `REWATCH_MAX`.
const REWATCH_DELAY: Duration = Duration::from_millis(200);
const REWATCH_MAX: Duration = Duration::from_secs(5);
/// How long a consistent read waits for the cache to reach the backend's revision (kube-apiserver's 3 s).
const SYNC_TIMEOUT: Duration = Duration::from_secs(3);

struct Inner {
    state: RwLock<State>,
    /// The revision the state has reached; closed when the cache stops following the backend.
    applied: watch::Receiver<Revision>,
    limits: HistoryLimits,
}

/// A `Store` served from memory over any `Backend`. Cloning shares the cache; dropping the last clone drops the
/// backend (which, for sled, commits what is pending and closes the database).
#[derive(Clone)]
pub struct Cacher {
    inner: Arc<Inner>,
    backend: Arc<dyn Backend>,
}

impl Cacher {
    /// Loads the backend into memory and follows its changes; the task applying them runs on the current Tokio
    /// runtime.
    /// `new`, waiting (paced as a rewatch) while the backend does not answer: etcd starting, electing a leader or
    /// cut off, as kube-apiserver's cacher lists again. Other errors are returned.
    pub async fn open(backend: Arc<dyn Backend>, limits: HistoryLimits) -> Result<Self> {
        let mut delay = REWATCH_DELAY;
        loop {
            match Self::new(backend.clone(), limits).await {
                Err(e @ (StorageError::Unavailable(_) | StorageError::Timeout(_))) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot load the storage cache yet; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(REWATCH_MAX);
                }
                done => return done,
            }
        }
    }

    pub async fn new(backend: Arc<dyn Backend>, limits: HistoryLimits) -> Result<Self> {
        let state = State::from_snapshot(backend.load(&limits).await?, &limits, Instant::now());
        // The backend may have left old history out already; either way it can drop what the cache no longer holds.
        backend.compact(state.compacted);
        tracing::info!(
            objects = state.objects.len(),
            revision = state.revision,
            history = state.log.len(),
            history_bytes = state.log_bytes,
            "storage cache loaded"
        );
        let changes = backend.watch(state.revision)?;
        let (applied_tx, applied) = watch::channel(state.revision);
        let inner = Arc::new(Inner { state: RwLock::new(state), applied, limits });
        tokio::spawn(follow(inner.clone(), changes, applied_tx, Arc::downgrade(&backend)));
        Ok(Self { inner, backend })
    }

    /// Number of objects currently stored.
    pub fn len(&self) -> usize {
        self.inner.state.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Serialized bytes the event history holds.
    pub fn history_bytes(&self) -> usize {
        self.inner.state.read().log_bytes
    }

    async fn write(&self, write: Write) -> Result<Arc<Object>> {
        // k8s.io/apiserver's etcd3 store names its spans so (`Create etcd3`); the backend's own span is its child.
        let (verb, key) = match &write {
            Write::Create { key, .. } => ("Create", key),
            Write::Update { key, .. } => ("GuaranteedUpdate", key),
            Write::Delete { key, .. } => ("Delete", key),
        };
        let span = tracing::info_span!("cacher.write", otel.name = verb, key = %key);
        self.write_in_cache(write).instrument(span).await
    }

    /// A write, answered once the cache holds it.
    async fn write_in_cache(&self, write: Write) -> Result<Arc<Object>> {
        match self.backend.write(write).await {
            Ok(obj) => {
                // Read-your-writes: reply once the cache holds the write. If the change stream is down, the write
                // is still durable: say so rather than fail it.
                if self.applied(obj.mod_revision, SYNC_TIMEOUT).await.is_err() {
                    tracing::warn!(revision = obj.mod_revision, "write acknowledged before the cache applied it");
                }
                Ok(obj)
            }
            // Another replica wrote first: catch up, so a retry reads the state that refused this write (a conflict
            // names its revision; for the others, ask the backend).
            Err(e @ StorageError::Conflict { actual, .. }) => {
                let _ = self.applied(actual, SYNC_TIMEOUT).await;
                Err(e)
            }
            Err(e @ (StorageError::NotFound { .. } | StorageError::AlreadyExists { .. })) => {
                let _ = self.sync().await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Waits until the cache has applied `revision`, at most `timeout`.
    async fn applied(&self, revision: Revision, timeout: Duration) -> Result<()> {
        let mut applied = self.inner.applied.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if *applied.borrow_and_update() >= revision {
                return Ok(());
            }
            tokio::select! {
                changed = applied.changed() => changed.map_err(|_| StorageError::Stopped)?,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(StorageError::Timeout(format!(
                        "the cache did not reach revision {revision} within {timeout:?} (at {})",
                        *applied.borrow()
                    )));
                }
            }
        }
    }
}

/// Applies the backend's changes until the backend is gone. After a stream failure it watches again from the last
/// revision applied; if the backend no longer has that history, it reads everything again (watchers from before
/// get `Expired`).
async fn follow(
    inner: Arc<Inner>,
    mut changes: ChangeStream,
    applied: watch::Sender<Revision>,
    backend: Weak<dyn Backend>,
) {
    let mut delay = REWATCH_DELAY;
    loop {
        let mut expired = false;
        while let Some(batch) = changes.next().await {
            let batch = match batch {
                Ok(f) => f,
                Err(StorageError::Expired { requested, oldest }) => {
                    tracing::warn!(requested, oldest, "storage backend compacted past the cache; reloading");
                    expired = true;
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "storage change stream failed");
                    break;
                }
            };
            delay = REWATCH_DELAY;
            let (revision, compacted) = {
                let mut state = inner.state.write();
                if let Err(e) = state.apply(batch, Instant::now()) {
                    // A gap would serve wrong data; stop, so writes fail and health checks say why.
                    tracing::error!(error = %e, "storage cache is inconsistent with its backend; stopping");
                    return;
                }
                let trimmed = state.trim(&inner.limits, Instant::now());
                (state.revision, trimmed.then_some(state.compacted))
            };
            applied.send_if_modified(|r| std::mem::replace(r, revision) != revision);
            if let (Some(c), Some(b)) = (compacted, backend.upgrade()) {
                b.compact(c);
            }
        }
        drop(changes);
        loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(REWATCH_MAX);
            let Some(b) = backend.upgrade() else { return };
            if expired {
                match b.load(&inner.limits).await {
                    Ok(snap) => {
                        let state = State::from_snapshot(snap, &inner.limits, Instant::now());
                        let revision = state.revision;
                        *inner.state.write() = state;
                        applied.send_replace(revision);
                        tracing::info!(revision, "storage cache reloaded");
                        expired = false;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot reload the storage cache; retrying");
                        continue;
                    }
                }
            }
            let from = inner.state.read().revision;
            match b.watch(from) {
                Ok(c) => {
                    changes = c;
                    break;
                }
                Err(StorageError::Expired { .. }) => expired = true,
                Err(e) => tracing::error!(error = %e, revision = from, "cannot follow the storage backend; retrying"),
            }
        }
    }
}

#[async_trait]
impl Store for Cacher {
    async fn get(&self, key: &str) -> Result<Option<Arc<Object>>> {
        tracing::info_span!("cacher.Get", key).in_scope(|| {
            let object = self.inner.state.read().objects.get(key).cloned();
            if let Some(o) = &object {
                o.check_readable()?;
            }
            Ok(object)
        })
    }

    async fn list(&self, opts: ListOptions) -> Result<ListResult> {
        tracing::info_span!("cacher.GetList").in_scope(|| self.inner.state.read().list(&opts))
    }

    async fn create(&self, key: &str, object: Draft) -> Result<Arc<Object>> {
        self.write(Write::Create { key: key.to_owned(), object }).await
    }

    async fn update(&self, key: &str, object: Draft, expected: Option<Revision>) -> Result<Arc<Object>> {
        self.write(Write::Update { key: key.to_owned(), object, expected }).await
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Arc<Object>> {
        self.write(Write::Delete { key: key.to_owned(), expected }).await
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        {
            let state = self.inner.state.read();
            if after < state.compacted {
                return Err(StorageError::Expired { requested: after, oldest: state.compacted });
            }
        }
        let cursor = WatchCursor {
            inner: self.inner.clone(),
            changed: self.inner.applied.clone(),
            prefix: prefix.to_owned(),
            after,
            pending: VecDeque::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(cursor, WatchCursor::next)))
    }

    fn current_revision(&self) -> Revision {
        self.inner.state.read().revision
    }

    async fn sync(&self) -> Result<Revision> {
        self.check_alive()?;
        if let Some(target) = self.backend.last_write_revision().await? {
            self.applied(target, SYNC_TIMEOUT).await?;
        }
        Ok(self.current_revision())
    }

    async fn wait_for(&self, revision: Revision, timeout: Duration) -> Result<Revision> {
        self.check_alive()?;
        self.applied(revision, timeout).await?;
        Ok(self.current_revision())
    }

    fn compacted_revision(&self) -> Revision {
        self.inner.state.read().compacted
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let compacted = {
            let mut state = self.inner.state.write();
            state.compact_to(revision);
            state.compacted
        };
        self.backend.compact(compacted);
        Ok(())
    }

    async fn check_writable(&self) -> Result<()> {
        self.check_alive()?;
        self.backend.check().await
    }

    fn stats(&self) -> StoreStats {
        let (objects, history_events, history_bytes) = {
            let state = self.inner.state.read();
            (state.objects.len(), state.log.len(), state.log_bytes)
        };
        StoreStats { objects, history_events, history_bytes, data_bytes: self.backend.size_on_disk() }
    }

    fn is_stale(&self, object: &Object) -> bool {
        self.backend.values().is_stale(&object.key, object.stored_with.as_ref())
    }

    fn check_alive(&self) -> Result<()> {
        // The applier holds the sender; once it has stopped, nothing written would ever be read back.
        match self.inner.applied.has_changed() {
            Ok(_) => self.backend.check_alive(),
            Err(_) => Err(StorageError::Stopped),
        }
    }
}

struct WatchCursor {
    inner: Arc<Inner>,
    changed: watch::Receiver<Revision>,
    prefix: String,
    after: Revision,
    pending: VecDeque<Arc<Event>>,
    done: bool,
}

impl WatchCursor {
    async fn next(mut self) -> Option<(Result<Arc<Event>>, Self)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(ev) = self.pending.pop_front() {
                return Some((Ok(ev), self));
            }
            // Mark the current revision seen before reading, so a change applied after the read still wakes us.
            self.changed.borrow_and_update();
            let read = self.inner.state.read().events_after(&self.prefix, self.after, WATCH_BATCH);
            match read {
                Err(e) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
                Ok((events, reached)) => {
                    self.after = reached;
                    if !events.is_empty() {
                        self.pending.extend(events);
                        continue;
                    }
                }
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }
}
