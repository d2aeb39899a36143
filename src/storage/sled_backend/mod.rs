//! The embedded backend: sled on local disk, with a single writer thread doing group commit.
//!
//! Writers send their operation to the writer thread, which takes every request waiting, applies them in order as
//! one atomic sled batch, flushes once, and only then publishes the changes (to the cache) and replies. So a reply
//! means the write is on disk, and concurrent writers share one fsync. Nothing of the objects is kept in memory
//! here: the cache above holds them, and compare-and-swap reads the stored record.

pub(crate) mod metrics;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use sled::IVec;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::codec::{self, EVENT_PREFIX, META_COMPACTED, META_PROBE, META_REVISION, OBJECT_PREFIX};
use super::value::Transformer;
use super::{
    Backend, Change, ChangeStream, EventType, HistoryLimits, Object, Result, Revision, Snapshot, StorageError, Write,
};

/// Most requests committed by one flush.
const MAX_GROUP: usize = 1024;

/// Free disk space a write group leaves untouched, beyond twice its own size: room for sled's log segments (512 KiB
/// each) and its flush. A write that would cut into it is refused before sled sees the disk fill up, because sled
/// does not always come back from a write that failed for lack of space (its next flush can wait forever).
const FREE_SPACE_RESERVE: u64 = 4 << 20;

/// How sled is opened.
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's own page cache. Every object is served from the cache above, so sled reads only for compare-and-swap
    /// and at start; its default (1 GiB) would hold a second copy of the data after a restart's full scan.
    pub cache_capacity: u64,
    /// A writer busy with one group for longer than this is stuck (in sled, on a broken disk): the store is then
    /// not alive (`/livez` fails, so the process is restarted).
    pub stuck_after: std::time::Duration,
    /// How values are encrypted at rest.
    pub values: Transformer,
}

impl Default for SledOptions {
    fn default() -> Self {
        Self { cache_capacity: 16 << 20, stuck_after: std::time::Duration::from_secs(60), values: Transformer::plain() }
    }
}

enum Op {
    /// With the span of the request that asked, which the group commit's span follows.
    Write(Write, oneshot::Sender<Result<Arc<Object>>>, tracing::Span),
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
    /// When the writer took up the group it is busy with (ms since `epoch`), 0 when idle.
    busy_since: AtomicU64,
    epoch: std::time::Instant,
    values: Transformer,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        // Never 0, which means idle.
        self.epoch.elapsed().as_millis() as u64 + 1
    }
}

/// The sled `Backend`. When dropped, pending writes are committed and the database is closed before the drop
/// returns.
pub struct SledBackend {
    shared: Arc<Shared>,
    stuck_after: std::time::Duration,
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

/// Opens sled in `dir`. A handle just dropped (a reopen, a restart in the same process) may still hold the
/// directory's lock for a moment while sled's flusher thread lets go: that is waited for, up to 5 s.
fn open_db(dir: &Path, options: &SledOptions) -> Result<sled::Db> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::Config::new().path(dir).cache_capacity(options.cache_capacity).open() {
            // sled words it `could not acquire lock on "<dir>": ... WouldBlock ...`, as an `Other` error.
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => return opened.map_err(backend),
        }
    }
}

/// Brings a store written by an older layout to `codec::FORMAT`. Format 1 kept each event's object and previous
/// state in its value; those events are dropped, so history starts again at the current revision (a watch from
/// before it gets 410 Gone, as after a compaction). The objects are the same in both.
fn upgrade(db: &sled::Db) -> Result<()> {
    if let Some(v) = db.get(codec::META_FORMAT).map_err(backend)? {
        return match codec::decode_u64(&v)? {
            codec::FORMAT => Ok(()),
            other => Err(StorageError::Corrupt(format!(
                "the store has format {other}, newer than this server's {}",
                codec::FORMAT
            ))),
        };
    }
    let mut batch = sled::Batch::default();
    let mut dropped = 0usize;
    for k in db.scan_prefix(EVENT_PREFIX).keys() {
        batch.remove(k.map_err(backend)?);
        dropped += 1;
    }
    let revision = read_counter(db, META_REVISION)?;
    batch.insert(META_COMPACTED, &codec::encode_u64(revision));
    batch.insert(codec::META_FORMAT, &codec::encode_u64(codec::FORMAT));
    db.apply_batch(batch).map_err(backend)?;
    db.flush().map_err(backend)?;
    if dropped > 0 {
        tracing::info!(dropped, revision, "store upgraded to format {}: history starts again here", codec::FORMAT);
    }
    Ok(())
}

fn read_counter(db: &sled::Db, key: &[u8]) -> Result<u64> {
    db.get(key).map_err(backend)?.map(|v| codec::decode_u64(&v)).transpose().map(|v| v.unwrap_or(0))
}

impl SledBackend {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path, options: SledOptions) -> Result<Self> {
        let db = open_db(dir, &options)?;
        upgrade(&db)?;
        let revision = read_counter(&db, META_REVISION)?;
        let compacted = read_counter(&db, META_COMPACTED)?;
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(db)),
            published: Mutex::new(Published { revision, compacted, subscribers: Vec::new() }),
            compact_to: AtomicU64::new(compacted),
            compact_queued: AtomicBool::new(false),
            busy_since: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            values: options.values.clone(),
        });
        let (requests, rx) = mpsc::channel(4 * MAX_GROUP);
        let stuck_after = options.stuck_after;
        let writer = Writer { shared: shared.clone(), dir: dir.to_owned(), options, revision, compacted, failed: None };
        let writer = std::thread::Builder::new()
            .name("sled-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StorageError::Backend(format!("cannot start writer thread: {e}")))?;
        Ok(Self { shared, stuck_after, requests: Some(requests), writer: Some(writer) })
    }

    fn db(&self) -> Result<sled::Db> {
        self.shared.db.read().clone().ok_or_else(|| StorageError::Backend("store is being reopened".into()))
    }
}

#[async_trait]
impl Backend for SledBackend {
    async fn load(&self, keep: &HistoryLimits) -> Result<Snapshot> {
        let (shared, keep) = (self.shared.clone(), *keep);
        tokio::task::spawn_blocking(move || load(&shared, &keep))
            .await
            .map_err(|e| StorageError::Backend(format!("loading the store: {e}")))?
    }

    fn values(&self) -> &Transformer {
        &self.shared.values
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.shared.db.read().as_ref().and_then(|db| db.size_on_disk().ok())
    }

    async fn write(&self, write: Write) -> Result<Arc<Object>> {
        let (reply, rx) = oneshot::channel();
        let requests = self.requests.as_ref().ok_or(StorageError::Closed)?;
        let asking = if crate::trace::sampled() { tracing::Span::current() } else { tracing::Span::none() };
        requests.send(Op::Write(write, reply, asking)).await.map_err(|_| StorageError::Closed)?;
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
            let _ = tx.send(read_changes(&db, &self.shared.values, after, published.revision));
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

    fn check_alive(&self) -> Result<()> {
        let since = self.shared.busy_since.load(Ordering::Relaxed);
        if since == 0 {
            return Ok(());
        }
        let busy = std::time::Duration::from_millis(self.shared.now_ms().saturating_sub(since));
        if busy > self.stuck_after {
            return Err(StorageError::Backend(format!(
                "the store's writer has been busy with one write for {}s",
                busy.as_secs()
            )));
        }
        Ok(())
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
fn load(shared: &Shared, keep: &HistoryLimits) -> Result<Snapshot> {
    // Held while reading: the writer commits under it, so the objects and the log agree. The handle is taken under
    // it too, so a reopen cannot swap it in between.
    let published = shared.published.lock();
    let db = shared.db.read().clone().ok_or_else(|| StorageError::Backend("store is being reopened".into()))?;
    let mut snap = Snapshot { revision: published.revision, compacted: published.compacted, ..Default::default() };
    for kv in db.scan_prefix(OBJECT_PREFIX) {
        let (k, v) = kv.map_err(backend)?;
        let key = std::str::from_utf8(&k[OBJECT_PREFIX.len()..])
            .map_err(|_| StorageError::Corrupt("object key is not UTF-8".into()))?;
        snap.objects.push(Arc::new(codec::decode_object(key, &v, &shared.values)?));
        // sled's LRU hears of page accesses in blocks of 64 per shard (of 256), and a scan touches each leaf once:
        // too few to fill a block, so it would evict nothing and keep every leaf it read (~10 MB more at 100k than
        // before the restart). A point read per object touches its leaf again, so sled evicts down to its cache
        // capacity as the load goes; it costs ~0.5 µs an object.
        db.get(&k).map_err(backend)?;
    }
    // In key order, as scanned: the unwinding finds a key's current object without an index.
    let objects = &snap.objects;
    let mut unwind = codec::Unwind::new(
        |key: &str| Ok(objects.binary_search_by(|o| o.key.as_str().cmp(key)).ok().map(|i| objects[i].clone())),
        &shared.values,
    );
    // Newest first, only as much history as the cache keeps: what it would drop at once is never decoded.
    let mut unpublished = HashMap::new();
    let mut events = Vec::new();
    let (mut expected, mut bytes, mut compacted) = (snap.revision, 0usize, snap.compacted);
    for kv in db.scan_prefix(EVENT_PREFIX).rev() {
        let (k, v) = kv.map_err(backend)?;
        let event = codec::split_event_key(&k)?;
        if event.revision <= compacted {
            break; // dropped from the counter, not yet from disk
        }
        if event.revision > snap.revision {
            // A batch whose flush failed is in sled's memory until the store is reopened: not acknowledged, so its
            // keys are read as they were before it.
            let (_, before) = unwind.event(&event, &v)?;
            unpublished.insert(event.key.to_owned(), before);
            continue;
        }
        if event.revision != expected {
            return Err(StorageError::Corrupt(format!(
                "event log has a gap: expected revision {expected}, found {}",
                event.revision
            )));
        }
        let (object, prev) = unwind.event(&event, &v)?;
        bytes += object.bytes.len();
        if !events.is_empty() && (events.len() >= keep.max_events || bytes > keep.max_bytes) {
            compacted = event.revision;
            break;
        }
        events.push(Arc::new(super::Event { revision: event.revision, kind: event.kind, object, prev }));
        expected -= 1;
    }
    if expected != compacted {
        return Err(StorageError::Corrupt(format!(
            "event log starts after revision {expected}, but history is kept from revision {}",
            compacted + 1
        )));
    }
    for (key, before) in unpublished {
        match (snap.objects.binary_search_by(|o| o.key.as_str().cmp(&key)), before) {
            (Ok(i), Some(o)) => snap.objects[i] = o,
            (Ok(i), None) => drop(snap.objects.remove(i)),
            (Err(i), Some(o)) => snap.objects.insert(i, o),
            (Err(_), None) => {}
        }
    }
    events.reverse();
    snap.events = events;
    snap.compacted = compacted;
    Ok(snap)
}

/// The changes `after + 1 ..= until` from the event log. The caller holds the published lock, so no commit lands
/// while it reads.
fn read_changes(db: &sled::Db, values: &Transformer, after: Revision, until: Revision) -> Result<Vec<Change>> {
    let mut unwind = codec::Unwind::new(
        |key: &str| {
            db.get(codec::object_key(key))
                .map_err(backend)?
                .map(|r| codec::decode_object(key, &r, values).map(Arc::new))
                .transpose()
        },
        values,
    );
    let mut out = Vec::with_capacity((until - after).min(4096) as usize);
    for kv in db.range(codec::event_prefix(after + 1)..codec::EVENT_END.to_vec()).rev() {
        let (k, v) = kv.map_err(backend)?;
        let event = codec::split_event_key(&k)?;
        let (object, _) = unwind.event(&event, &v)?;
        if event.revision <= until {
            out.push(Change { revision: event.revision, kind: event.kind, object });
        }
    }
    out.reverse();
    if out.len() as u64 != until - after || out.iter().zip(after + 1..).any(|(c, r)| c.revision != r) {
        return Err(StorageError::Corrupt(format!("event log between {after} and {until} has a gap")));
    }
    Ok(out)
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
            self.shared.busy_since.store(self.shared.now_ms(), Ordering::Relaxed);
            self.commit(group);
            self.shared.busy_since.store(0, Ordering::Relaxed);
        }
        if let Some(db) = self.shared.db.write().take() {
            if let Err(e) = db.flush() {
                tracing::error!(error = %e, "final flush of the store failed");
            }
        }
    }

    fn commit(&mut self, group: Vec<Op>) {
        // Any compaction queued is taken up by this group, or dropped with it if it is refused: let the next one queue.
        self.shared.compact_queued.store(false, Ordering::Release);
        let (mut writes, mut checks, mut asked) = (Vec::new(), Vec::new(), Vec::new());
        for op in group {
            match op {
                Op::Write(write, reply, span) => {
                    writes.push((write, reply));
                    asked.push(span);
                }
                Op::Check(reply) => checks.push(reply),
                Op::Compact => {}
            }
        }
        let db = match self.recover_if_failed().and_then(|()| self.shared.db.read().clone().ok_or(StorageError::Closed))
        {
            Ok(db) => db,
            Err(e) => return refuse(writes.into_iter().map(|(_, reply)| (reply, Err(e.clone()))), checks, &e),
        };
        let mut pending = Pending::new(self.revision);
        let replies: Vec<_> =
            writes.into_iter().map(|(write, reply)| (reply, pending.apply(&db, &self.shared.values, write))).collect();
        let compact_to = self.shared.compact_to.load(Ordering::Relaxed).min(pending.revision);
        if !pending.changes.is_empty() || !checks.is_empty() {
            if let Err(e) = self.enough_space(pending.bytes) {
                return refuse(replies, checks, &e);
            }
        }
        if pending.changes.is_empty() {
            reply(replies, checks);
            if compact_to > self.compacted {
                self.compact_only(&db, compact_to);
            }
            return;
        }
        let Pending { mut batch, changes, revision, .. } = pending;
        let compacted = match remove_events(&db, &mut batch, self.compacted, compact_to) {
            Ok(()) => self.compacted.max(compact_to),
            Err(e) => {
                tracing::warn!(error = %e, "dropping old history from disk failed");
                self.compacted
            }
        };
        batch.insert(META_COMPACTED, &codec::encode_u64(compacted));
        batch.insert(META_REVISION, &codec::encode_u64(revision));

        // One span for the group's batch and fsync, a child of the first traced request's span and linked to the
        // other ones'; none when no request of the group is traced.
        let mut traced = asked.iter().filter_map(tracing::Span::id);
        let span = match traced.next() {
            Some(first) => crate::trace::in_sampled_sync(
                || tracing::info_span!(parent: first, "sled.commit", writes = changes.len()),
            ),
            None => tracing::Span::none(),
        };
        for other in traced {
            span.follows_from(other);
        }
        let _commit = span.enter();
        let started = std::time::Instant::now();
        // Under the publish lock: a replay from the log (`watch`) or a load never sees a batch not yet published.
        let mut published = self.shared.published.lock();
        let durable = db.apply_batch(batch).and_then(|_| db.flush().map(|_| ()));
        let m = metrics::metrics();
        m.duration.observe(started.elapsed().as_secs_f64());
        m.group_size.observe(changes.len() as f64);
        if let Err(e) = durable {
            drop(published);
            tracing::error!(error = %e, "store write failed; the whole group is refused");
            // sled refuses everything after an I/O error, and its memory may hold the refused batch: the next
            // request reopens it from disk first.
            self.failed = Some(e.to_string());
            return refuse(replies, checks, &backend(e));
        }
        self.revision = revision;
        self.compacted = compacted;
        published.revision = revision;
        published.compacted = compacted;
        published.subscribers.retain(|s| s.send(Ok(changes.clone())).is_ok());
        drop(published);
        reply(replies, checks);
    }

    /// Refuses a write that would leave less than `FREE_SPACE_RESERVE` free on the store's disk (a check asks
    /// whether any write could go through).
    fn enough_space(&self, bytes: u64) -> Result<()> {
        let needed = FREE_SPACE_RESERVE + 2 * bytes;
        match fs2::available_space(&self.dir) {
            Ok(free) if free < needed => Err(StorageError::Backend(format!(
                "no space left for the store: {free} bytes free on the disk of {}, {needed} needed",
                self.dir.display()
            ))),
            // An unknown amount of space is sled's to find out.
            _ => Ok(()),
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
            let changes = read_changes(&db, &self.shared.values, self.revision, revision)?;
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

type Reply = (oneshot::Sender<Result<Arc<Object>>>, Result<Arc<Object>>);

/// Sends each write its result, and each check its Ok.
fn reply(replies: Vec<Reply>, checks: Vec<oneshot::Sender<Result<()>>>) {
    for (reply, result) in replies {
        let _ = reply.send(result);
    }
    for reply in checks {
        let _ = reply.send(Ok(()));
    }
}

/// Sends every write and check `err`, unless the write failed on its own already.
fn refuse(replies: impl IntoIterator<Item = Reply>, checks: Vec<oneshot::Sender<Result<()>>>, err: &StorageError) {
    for (reply, result) in replies {
        let _ = reply.send(result.and(Err(err.clone())));
    }
    for reply in checks {
        let _ = reply.send(Err(err.clone()));
    }
}

impl Writer {
    /// Drops history without a flush of its own: losing it in a crash only means a longer history after restart.
    fn compact_only(&mut self, db: &sled::Db, to: Revision) {
        let mut batch = sled::Batch::default();
        let mut published = self.shared.published.lock();
        let done = remove_events(db, &mut batch, self.compacted, to).and_then(|()| {
            batch.insert(META_COMPACTED, &codec::encode_u64(to));
            // Flushed as a write group is: values a rotated-out key wrote must not come back after a restart.
            db.apply_batch(batch).and_then(|()| db.flush().map(drop)).map_err(backend)
        });
        match done {
            Ok(()) => {
                self.compacted = to;
                published.compacted = to;
            }
            Err(e) => tracing::warn!(error = %e, "dropping old history from disk failed"),
        }
    }
}

/// A write group being built: the batch, the changes it makes, and the records written so far.
struct Pending {
    batch: sled::Batch,
    /// Each key's record as this group leaves it (`None`: deleted).
    overlay: HashMap<String, Option<IVec>>,
    changes: Vec<Change>,
    revision: Revision,
    /// Keys and values the batch writes.
    bytes: u64,
}

impl Pending {
    fn new(revision: Revision) -> Self {
        Self { batch: Default::default(), overlay: HashMap::new(), changes: Vec::new(), revision, bytes: 0 }
    }

    /// The key's record: written earlier in the same group, or as stored.
    fn current(&self, db: &sled::Db, key: &str) -> Result<Option<IVec>> {
        match self.overlay.get(key) {
            Some(record) => Ok(record.clone()),
            None => db.get(codec::object_key(key)).map_err(backend),
        }
    }

    fn apply(&mut self, db: &sled::Db, values: &Transformer, write: Write) -> Result<Arc<Object>> {
        let next = self.revision + 1;
        let (key, kind, object, record, prev) = match write {
            Write::Create { key, object } => {
                if self.current(db, &key)?.is_some() {
                    return Err(StorageError::AlreadyExists { key });
                }
                let (obj, record) = codec::stamp(&key, object, next, values)?;
                (key, EventType::Added, obj, Some(record), IVec::default())
            }
            Write::Update { key, object, expected } => {
                let Some(prev) = self.current(db, &key)? else {
                    return Err(StorageError::NotFound { key });
                };
                check_expected(&key, codec::record_revision(&prev)?, expected)?;
                let (obj, record) = codec::stamp(&key, object, next, values)?;
                (key, EventType::Modified, obj, Some(record), prev)
            }
            Write::Delete { key, expected } => {
                let Some(prev) = self.current(db, &key)? else {
                    return Err(StorageError::NotFound { key });
                };
                check_expected(&key, codec::record_revision(&prev)?, expected)?;
                let obj = codec::deletion(&codec::decode_object(&key, &prev, values)?, next)?;
                (key, EventType::Deleted, obj, None, prev)
            }
        };
        self.revision = next;
        let (object_key, event_key) = (codec::object_key(&key), codec::event_key(next, kind, &key));
        self.bytes += (object_key.len() + event_key.len() + prev.len() + record.as_ref().map_or(0, |r| r.len())) as u64;
        match &record {
            Some(record) => self.batch.insert(object_key, record.clone()),
            None => self.batch.remove(object_key),
        }
        // The previous record as it was stored: the same buffer, not a copy (see `codec::event_key`).
        self.batch.insert(event_key, prev);
        let object = Arc::new(object);
        self.overlay.insert(key, record);
        self.changes.push(Change { revision: next, kind, object: object.clone() });
        Ok(object)
    }
}

/// Adds the removal of the log's events after `from` up to `to` to `batch`.
fn remove_events(db: &sled::Db, batch: &mut sled::Batch, from: Revision, to: Revision) -> Result<()> {
    if to > from {
        for k in db.range(codec::event_prefix(from + 1)..codec::event_prefix(to + 1)).keys() {
            batch.remove(k.map_err(backend)?);
        }
    }
    Ok(())
}

fn check_expected(key: &str, actual: Revision, expected: Option<Revision>) -> Result<()> {
    match expected {
        Some(e) if e != actual => Err(StorageError::Conflict { key: key.to_owned(), expected: e, actual }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
