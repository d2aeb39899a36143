//! The embedded backend: sled on local disk, with a single writer thread doing group commit.
//!
//! Writers send their operation to the writer thread, which takes every request waiting, applies them in order as
//! one atomic sled batch, flushes once, and only then publishes the changes (to the cache) and replies. So a reply
//! means the write is on disk, and concurrent writers share one fsync. Nothing of the objects is kept in memory
//! here: the cache above holds them, and compare-and-swap reads the stored record.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::codec::{self, EVENT_PREFIX, META_COMPACTED, META_PROBE, META_REVISION, OBJECT_PREFIX};
use super::{
    Backend, Change, ChangeStream, EventType, HistoryLimits, Object, Result, Revision, Snapshot, StorageError, Write,
};

/// Most requests committed by one flush.
const MAX_GROUP: usize = 1024;

/// How sled is opened.
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's own page cache. Every object is served from the cache above, so sled reads only for compare-and-swap
    /// and at start; its default (1 GiB) would hold a second copy of the data after a restart's full scan.
    pub cache_capacity: u64,
}

impl Default for SledOptions {
    fn default() -> Self {
        Self { cache_capacity: 16 << 20 }
    }
}

enum Op {
    Write(Write, oneshot::Sender<Result<Arc<Object>>>),
    /// Drop history up to `compact_to`, even if no write comes to carry it.
    Compact,
    /// Can the store write? (Recovers first if it could not.)
    Check(oneshot::Sender<Result<()>>),
}

type Subscriber = mpsc::UnboundedSender<Result<Vec<Change>>>;

/// What the writer has made durable and told subscribers about.
struct Published {
    revision: Revision,
    compacted: Revision,
    subscribers: Vec<Subscriber>,
}

struct Shared {
    /// `None` only while the writer reopens it.
    db: RwLock<Option<sled::Db>>,
    published: Mutex<Published>,
    /// History the cache no longer needs; dropped from disk with the next write.
    compact_to: AtomicU64,
    /// An `Op::Compact` is queued.
    compact_queued: AtomicBool,
}

/// The sled `Backend`. When dropped, pending writes are committed and the database is closed before the drop
/// returns.
pub struct SledBackend {
    shared: Arc<Shared>,
    requests: Option<mpsc::Sender<Op>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn backend(e: sled::Error) -> StorageError {
    StorageError::Backend(e.to_string())
}

fn open_db(dir: &Path, options: &SledOptions) -> Result<sled::Db> {
    sled::Config::new().path(dir).cache_capacity(options.cache_capacity).open().map_err(backend)
}

fn read_counter(db: &sled::Db, key: &[u8]) -> Result<u64> {
    db.get(key).map_err(backend)?.map(|v| codec::decode_u64(&v)).transpose().map(|v| v.unwrap_or(0))
}

impl SledBackend {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path, options: SledOptions) -> Result<Self> {
        let db = open_db(dir, &options)?;
        let revision = read_counter(&db, META_REVISION)?;
        let compacted = read_counter(&db, META_COMPACTED)?;
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(db)),
            published: Mutex::new(Published { revision, compacted, subscribers: Vec::new() }),
            compact_to: AtomicU64::new(compacted),
            compact_queued: AtomicBool::new(false),
        });
        let (requests, rx) = mpsc::channel(4 * MAX_GROUP);
        let writer = Writer { shared: shared.clone(), dir: dir.to_owned(), options, revision, compacted, failed: None };
        let writer = std::thread::Builder::new()
            .name("sled-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StorageError::Backend(format!("cannot start writer thread: {e}")))?;
        Ok(Self { shared, requests: Some(requests), writer: Some(writer) })
    }

    fn db(&self) -> Result<sled::Db> {
        self.shared.db.read().clone().ok_or_else(|| StorageError::Backend("store is being reopened".into()))
    }
}

#[async_trait]
impl Backend for SledBackend {
    async fn load(&self, keep: &HistoryLimits) -> Result<Snapshot> {
        let (db, shared, keep) = (self.db()?, self.shared.clone(), *keep);
        tokio::task::spawn_blocking(move || load(&db, &shared, &keep))
            .await
            .map_err(|e| StorageError::Backend(format!("loading the store: {e}")))?
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.shared.db.read().as_ref().and_then(|db| db.size_on_disk().ok())
    }

    async fn write(&self, write: Write) -> Result<Arc<Object>> {
        let (reply, rx) = oneshot::channel();
        let requests = self.requests.as_ref().ok_or(StorageError::Closed)?;
        requests.send(Op::Write(write, reply)).await.map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    fn watch(&self, after: Revision) -> Result<ChangeStream> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Under the publish lock: the replay below and the live changes after it meet without a gap.
        let mut published = self.shared.published.lock();
        if after < published.compacted {
            return Err(StorageError::Expired { requested: after, oldest: published.compacted });
        }
        if after > published.revision {
            return Err(StorageError::TooLarge { requested: after, current: published.revision });
        }
        if after < published.revision {
            let db = self.db()?;
            let _ = tx.send(read_changes(&db, after, published.revision));
        }
        published.subscribers.push(tx);
        Ok(Box::pin(UnboundedReceiverStream::new(rx)))
    }

    async fn check(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        let requests = self.requests.as_ref().ok_or(StorageError::Closed)?;
        requests.send(Op::Check(reply)).await.map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    fn compact(&self, revision: Revision) {
        self.shared.compact_to.fetch_max(revision, Ordering::Relaxed);
        if !self.shared.compact_queued.swap(true, Ordering::AcqRel) {
            if let Some(r) = &self.requests {
                // A full queue means writes are coming, and they carry the compaction.
                let _ = r.try_send(Op::Compact);
            }
        }
    }
}

/// Reads every object and the history the cache keeps. Blocking.
fn load(db: &sled::Db, shared: &Shared, keep: &HistoryLimits) -> Result<Snapshot> {
    let published = shared.published.lock();
    let mut snap = Snapshot { revision: published.revision, compacted: published.compacted, ..Default::default() };
    let mut seen = HashMap::new();
    for kv in db.scan_prefix(OBJECT_PREFIX) {
        let (k, v) = kv.map_err(backend)?;
        let key = std::str::from_utf8(&k[OBJECT_PREFIX.len()..])
            .map_err(|_| StorageError::Corrupt("object key is not UTF-8".into()))?;
        snap.objects.push(codec::decode_shared(key, &v, &mut seen)?);
    }
    // Newest first, only as much history as the cache keeps: what it would drop at once is never decoded.
    let mut kept = Vec::new();
    let (mut expected, mut bytes) = (snap.revision, 0usize);
    for kv in db.scan_prefix(EVENT_PREFIX).rev() {
        let (k, v) = kv.map_err(backend)?;
        let revision = codec::decode_u64(&k[EVENT_PREFIX.len()..])?;
        if revision <= snap.compacted {
            break; // dropped from the counter, not yet from disk
        }
        if revision != expected {
            return Err(StorageError::Corrupt(format!(
                "event log has a gap: expected revision {expected}, found {revision}"
            )));
        }
        bytes += codec::split_event(&v)?.object.len().saturating_sub(8);
        if !kept.is_empty() && (kept.len() >= keep.max_events || bytes > keep.max_bytes) {
            snap.compacted = revision;
            break;
        }
        kept.push(v);
        expected -= 1;
    }
    if expected != snap.compacted {
        return Err(StorageError::Corrupt(format!(
            "event log starts after revision {expected}, but history is kept from revision {}",
            snap.compacted + 1
        )));
    }
    let first = snap.revision + 1 - kept.len() as u64;
    for (revision, v) in (first..).zip(kept.iter().rev()) {
        let raw = codec::split_event(v)?;
        let object = codec::decode_shared(raw.key, raw.object, &mut seen)?;
        let prev = match raw.prev {
            [] => None,
            p => Some(codec::decode_shared(raw.key, p, &mut seen)?),
        };
        snap.events.push(Arc::new(super::Event { revision, kind: raw.kind, object, prev }));
    }
    Ok(snap)
}

/// The changes `after + 1 ..= until` from the event log.
fn read_changes(db: &sled::Db, after: Revision, until: Revision) -> Result<Vec<Change>> {
    let mut out = Vec::with_capacity((until - after) as usize);
    for kv in db.range(codec::event_key(after + 1)..=codec::event_key(until)) {
        let (k, v) = kv.map_err(backend)?;
        let revision = codec::decode_u64(&k[EVENT_PREFIX.len()..])?;
        let raw = codec::split_event(&v)?;
        let object = Arc::new(codec::decode_object(raw.key, raw.object)?);
        out.push(Change { revision, kind: raw.kind, object });
    }
    if out.len() as u64 != until - after {
        return Err(StorageError::Corrupt(format!("event log between {after} and {until} has a gap")));
    }
    Ok(out)
}

/// The state of a key before a write: written earlier in the same group, or as stored.
enum Current {
    Written(Arc<Object>),
    Stored(sled::IVec),
}

impl Current {
    fn revision(&self) -> Result<Revision> {
        match self {
            Current::Written(o) => Ok(o.mod_revision),
            Current::Stored(raw) => codec::record_revision(raw),
        }
    }

    fn record(&self) -> Cow<'_, [u8]> {
        match self {
            Current::Written(o) => Cow::Owned(codec::encode_object(o)),
            Current::Stored(raw) => Cow::Borrowed(raw),
        }
    }

    fn value(&self, key: &str) -> Result<Value> {
        let json = match self {
            Current::Written(o) => &o.bytes[..],
            Current::Stored(raw) => &raw[8..],
        };
        serde_json::from_slice(json).map_err(|e| StorageError::Corrupt(format!("object {key:?}: {e}")))
    }
}

struct Writer {
    shared: Arc<Shared>,
    dir: PathBuf,
    options: SledOptions,
    /// Durable and published.
    revision: Revision,
    /// Dropped from the disk's event log up to here.
    compacted: Revision,
    /// Why the last write failed, until the store is reopened and takes a write again.
    failed: Option<String>,
}

type Reply = (oneshot::Sender<Result<Arc<Object>>>, Result<Arc<Object>>);

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        while let Some(first) = rx.blocking_recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            self.commit(group);
        }
        if let Some(db) = self.shared.db.write().take() {
            if let Err(e) = db.flush() {
                tracing::error!(error = %e, "final flush of the store failed");
            }
        }
    }

    fn commit(&mut self, group: Vec<Op>) {
        let healthy = self.recover_if_failed();
        let db = self.shared.db.read().clone();
        let (db, group) = match (healthy, db) {
            (Ok(()), Some(db)) => (db, group),
            (result, _) => {
                let err = result.err().unwrap_or(StorageError::Closed);
                for op in group {
                    match op {
                        Op::Write(_, reply) => drop(reply.send(Err(clone_error(&err)))),
                        Op::Check(reply) => drop(reply.send(Err(clone_error(&err)))),
                        Op::Compact => {}
                    }
                }
                return;
            }
        };
        let mut checks = Vec::new();
        self.shared.compact_queued.store(false, Ordering::Release);
        let mut batch = sled::Batch::default();
        let mut overlay: HashMap<String, Option<Arc<Object>>> = HashMap::new();
        let mut changes: Vec<Change> = Vec::new();
        let mut replies: Vec<Reply> = Vec::with_capacity(group.len());
        let mut revision = self.revision;
        for op in group {
            match op {
                Op::Write(write, reply) => {
                    let result = apply(&db, &mut overlay, &mut batch, &mut revision, write, &mut changes);
                    replies.push((reply, result));
                }
                Op::Check(reply) => checks.push(reply),
                Op::Compact => {}
            }
        }
        let compact_to = self.shared.compact_to.load(Ordering::Relaxed).min(revision);
        if changes.is_empty() {
            for (reply, result) in replies {
                let _ = reply.send(result);
            }
            for reply in checks {
                let _ = reply.send(Ok(()));
            }
            if compact_to > self.compacted {
                self.compact_only(&db, compact_to);
            }
            return;
        }
        for r in self.compacted + 1..=compact_to {
            batch.remove(codec::event_key(r));
        }
        let compacted = self.compacted.max(compact_to);
        batch.insert(META_COMPACTED, &codec::encode_u64(compacted));
        batch.insert(META_REVISION, &codec::encode_u64(revision));

        let started = std::time::Instant::now();
        let durable = db.apply_batch(batch).and_then(|_| db.flush().map(|_| ()));
        let m = crate::metrics::global();
        m.storage_commit_duration.observe(started.elapsed().as_secs_f64());
        m.storage_commit_group_size.observe(changes.len() as f64);
        if let Err(e) = durable {
            tracing::error!(error = %e, "store write failed; the whole group is refused");
            // sled refuses everything after an I/O error, and its memory may hold the refused batch: the next
            // request reopens it from disk first.
            self.failed = Some(e.to_string());
            for (reply, result) in replies {
                let _ = reply.send(result.and(Err(StorageError::Backend(e.to_string()))));
            }
            for reply in checks {
                let _ = reply.send(Err(StorageError::Backend(e.to_string())));
            }
            return;
        }
        self.revision = revision;
        self.compacted = compacted;
        {
            let mut published = self.shared.published.lock();
            published.revision = revision;
            published.compacted = compacted;
            published.subscribers.retain(|s| s.send(Ok(changes.clone())).is_ok());
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
        for reply in checks {
            let _ = reply.send(Ok(()));
        }
    }

    fn recover_if_failed(&mut self) -> Result<()> {
        let Some(cause) = self.failed.clone() else { return Ok(()) };
        match self.reopen() {
            Ok(()) => {
                tracing::info!(previous_error = %cause, revision = self.revision, "store writable again after reopening");
                self.failed = None;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "store still cannot write");
                Err(StorageError::Backend(format!("store cannot write: {e} (first failure: {cause})")))
            }
        }
    }

    /// Drops the database, opens it again from disk, publishes any change a refused write left on disk (its client
    /// got an error, as from an etcd timeout; the change happened), and proves the disk takes a write.
    fn reopen(&mut self) -> Result<()> {
        let mut published = self.shared.published.lock();
        let mut slot = self.shared.db.write();
        drop(slot.take());
        let db = open_db(&self.dir, &self.options)?;
        let revision = read_counter(&db, META_REVISION)?;
        let compacted = read_counter(&db, META_COMPACTED)?;
        if revision < self.revision {
            return Err(StorageError::Corrupt(format!(
                "after reopening, the store is at revision {revision}, but {} was acknowledged",
                self.revision
            )));
        }
        if revision > self.revision {
            let changes = read_changes(&db, self.revision, revision)?;
            published.subscribers.retain(|s| s.send(Ok(changes.clone())).is_ok());
        }
        self.revision = revision;
        self.compacted = compacted;
        published.revision = revision;
        published.compacted = compacted;
        *slot = Some(db.clone());
        drop((slot, published));
        db.insert(META_PROBE, &codec::encode_u64(revision)).map_err(backend)?;
        db.flush().map_err(backend)?;
        Ok(())
    }
}

fn clone_error(e: &StorageError) -> StorageError {
    StorageError::Backend(e.to_string())
}

impl Writer {
    /// Drops history without a flush of its own: losing it in a crash only means a longer history after restart.
    fn compact_only(&mut self, db: &sled::Db, to: Revision) {
        let mut batch = sled::Batch::default();
        for r in self.compacted + 1..=to {
            batch.remove(codec::event_key(r));
        }
        batch.insert(META_COMPACTED, &codec::encode_u64(to));
        match db.apply_batch(batch) {
            Ok(()) => {
                self.compacted = to;
                self.shared.published.lock().compacted = to;
            }
            Err(e) => tracing::warn!(error = %e, "dropping old history from disk failed"),
        }
    }
}

fn apply(
    db: &sled::Db,
    overlay: &mut HashMap<String, Option<Arc<Object>>>,
    batch: &mut sled::Batch,
    revision: &mut Revision,
    write: Write,
    changes: &mut Vec<Change>,
) -> Result<Arc<Object>> {
    let current = |key: &str| -> Result<Option<Current>> {
        match overlay.get(key) {
            Some(o) => Ok(o.clone().map(Current::Written)),
            None => Ok(db.get(codec::object_key(key)).map_err(backend)?.map(Current::Stored)),
        }
    };
    let next = *revision + 1;
    let (key, kind, object, event) = match write {
        Write::Create { key, object } => {
            if current(&key)?.is_some() {
                return Err(StorageError::AlreadyExists { key });
            }
            let obj = Object::from_draft(&key, object, next);
            let record = codec::encode_object(&obj);
            let event = codec::encode_event(EventType::Added, &key, &record, None);
            batch.insert(codec::object_key(&key), record);
            (key, EventType::Added, obj, event)
        }
        Write::Update { key, object, expected } => {
            let Some(prev) = current(&key)? else {
                return Err(StorageError::NotFound { key });
            };
            check_expected(&key, prev.revision()?, expected)?;
            let obj = Object::from_draft(&key, object, next);
            let record = codec::encode_object(&obj);
            let event = codec::encode_event(EventType::Modified, &key, &record, Some(&prev.record()));
            batch.insert(codec::object_key(&key), record);
            (key, EventType::Modified, obj, event)
        }
        Write::Delete { key, expected } => {
            let Some(prev) = current(&key)? else {
                return Err(StorageError::NotFound { key });
            };
            check_expected(&key, prev.revision()?, expected)?;
            let obj = Object::new(&key, prev.value(&key)?, next)?;
            let event =
                codec::encode_event(EventType::Deleted, &key, &codec::encode_object(&obj), Some(&prev.record()));
            batch.remove(codec::object_key(&key));
            (key, EventType::Deleted, obj, event)
        }
    };
    *revision = next;
    batch.insert(codec::event_key(next), event);
    let object = Arc::new(object);
    overlay.insert(key, (kind != EventType::Deleted).then(|| object.clone()));
    changes.push(Change { revision: next, kind, object: object.clone() });
    Ok(object)
}

fn check_expected(key: &str, actual: Revision, expected: Option<Revision>) -> Result<()> {
    match expected {
        Some(e) if e != actual => Err(StorageError::Conflict { key: key.to_owned(), expected: e, actual }),
        _ => Ok(()),
    }
}
