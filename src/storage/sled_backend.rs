//! The embedded backend: sled on local disk, with a single writer thread doing group commit.
//!
//! Writers send their operation to the writer thread, which takes every request waiting, applies them in order as
//! one atomic sled batch, flushes once, and only then updates the in-memory state, wakes watchers and replies. So a
//! reply means the write is on disk, and concurrent writers share one fsync.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use super::codec::{self, EVENT_PREFIX, META_COMPACTED, META_REVISION, OBJECT_PREFIX};
use super::state::State;
use super::{
    stamp_resource_version, Event, EventType, HistoryLimits, ListOptions, ListResult, Object, Result, Revision,
    StorageError, Store, WatchStream,
};

/// Most requests committed by one flush.
const MAX_GROUP: usize = 1024;
/// Most events a watcher takes from the log under one read lock.
const WATCH_BATCH: usize = 256;

enum Op {
    Create { key: String, value: Value },
    Update { key: String, value: Value, expected: Option<Revision> },
    Delete { key: String, expected: Option<Revision> },
    Compact { revision: Revision },
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Option<Arc<Object>>>>,
}

struct Shared {
    state: RwLock<State>,
    revision: watch::Sender<Revision>,
    db: sled::Db,
    limits: HistoryLimits,
}

/// The sled-backed `Store`. Cloning shares the same store; when the last clone is dropped, pending writes are
/// committed and the database is closed before the drop returns.
#[derive(Clone)]
pub struct SledStore {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
}

struct Handle {
    requests: Option<mpsc::Sender<Request>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl SledStore {
    /// Opens (or creates) the store in `dir` and loads it into memory.
    pub fn open(dir: &Path, limits: HistoryLimits) -> Result<Self> {
        let db = sled::Config::new().path(dir).open().map_err(backend)?;
        let state = load(&db)?;
        tracing::info!(
            path = %dir.display(),
            objects = state.objects.len(),
            revision = state.revision,
            history = state.log.len(),
            "opened sled store"
        );
        let (revision, _) = watch::channel(state.revision);
        let shared = Arc::new(Shared { state: RwLock::new(state), revision, db, limits });
        let (requests, rx) = mpsc::channel(4 * MAX_GROUP);
        let writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("sled-writer".into())
            .spawn(move || run_writer(writer, rx))
            .map_err(|e| StorageError::Backend(format!("cannot start writer thread: {e}")))?;
        Ok(Self { shared, handle: Arc::new(Handle { requests: Some(requests), writer: Some(writer) }) })
    }

    /// Number of objects currently stored.
    pub fn len(&self) -> usize {
        self.shared.state.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn submit(&self, op: Op) -> Result<Option<Arc<Object>>> {
        let (reply, rx) = oneshot::channel();
        let requests = self.handle.requests.as_ref().ok_or(StorageError::Closed)?;
        requests.send(Request { op, reply }).await.map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }
}

fn backend(e: sled::Error) -> StorageError {
    StorageError::Backend(e.to_string())
}

fn load(db: &sled::Db) -> Result<State> {
    let mut state = State::default();
    let meta = |k: &[u8]| -> Result<u64> {
        db.get(k).map_err(backend)?.map(|v| codec::decode_u64(&v)).transpose().map(|v| v.unwrap_or(0))
    };
    state.revision = meta(META_REVISION)?;
    state.compacted = meta(META_COMPACTED)?;
    for kv in db.scan_prefix(OBJECT_PREFIX) {
        let (k, v) = kv.map_err(backend)?;
        let key = std::str::from_utf8(&k[OBJECT_PREFIX.len()..])
            .map_err(|_| StorageError::Corrupt("object key is not UTF-8".into()))?
            .to_owned();
        let obj = codec::decode_object(&key, &v)?;
        state.objects.insert(key, Arc::new(obj));
    }
    let now = Instant::now();
    let mut expected = state.compacted + 1;
    for kv in db.scan_prefix(EVENT_PREFIX) {
        let (k, v) = kv.map_err(backend)?;
        let revision = codec::decode_u64(&k[EVENT_PREFIX.len()..])?;
        if revision != expected {
            return Err(StorageError::Corrupt(format!(
                "event log has a gap: expected revision {expected}, found {revision}"
            )));
        }
        expected += 1;
        state.log.push_back((now, Arc::new(codec::decode_event(revision, &v)?)));
    }
    if expected != state.revision + 1 {
        return Err(StorageError::Corrupt(format!(
            "event log ends at revision {} but the store is at {}",
            expected - 1,
            state.revision
        )));
    }
    Ok(state)
}

fn run_writer(shared: Arc<Shared>, mut rx: mpsc::Receiver<Request>) {
    while let Some(first) = rx.blocking_recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        shared.commit(group);
    }
    if let Err(e) = shared.db.flush() {
        tracing::error!(error = %e, "final flush of the store failed");
    }
}

fn make_object(key: &str, mut value: Value, revision: Revision) -> Result<Object> {
    stamp_resource_version(&mut value, revision)?;
    let bytes = Bytes::from(serde_json::to_vec(&value).map_err(|e| StorageError::Backend(e.to_string()))?);
    Ok(Object { key: key.to_owned(), value: Arc::new(value), bytes, mod_revision: revision })
}

type Reply = (oneshot::Sender<Result<Option<Arc<Object>>>>, Result<Option<Arc<Object>>>);

impl Shared {
    fn commit(&self, group: Vec<Request>) {
        let now = Instant::now();
        let mut batch = sled::Batch::default();
        let mut overlay: HashMap<String, Option<Arc<Object>>> = HashMap::new();
        let mut events: Vec<Arc<Event>> = Vec::new();
        let mut replies: Vec<Reply> = Vec::with_capacity(group.len());
        let mut compact_to = None;
        let (start_revision, compacted, drop_count) = {
            let state = self.state.read();
            let mut revision = state.revision;
            for Request { op, reply } in group {
                let result =
                    self.apply(&state, &mut overlay, &mut batch, &mut revision, op, &mut events, &mut compact_to);
                replies.push((reply, result));
            }
            let drop_count = state.events_to_drop(&self.limits, events.len(), now);
            (state.revision, state.compacted, drop_count)
        };
        let end_revision = start_revision + events.len() as u64;

        // History to let go: what the limits drop, or an explicit compaction, whichever reaches further.
        let mut new_compacted = compacted;
        if drop_count > 0 {
            new_compacted = new_compacted.max((compacted + drop_count as u64).min(end_revision));
        }
        if let Some(r) = compact_to {
            new_compacted = new_compacted.max(r.min(end_revision));
        }
        for r in compacted + 1..=new_compacted {
            batch.remove(codec::event_key(r));
        }
        if new_compacted != compacted {
            batch.insert(META_COMPACTED, &codec::encode_u64(new_compacted));
        }
        if events.is_empty() && new_compacted == compacted {
            for (reply, result) in replies {
                let _ = reply.send(result);
            }
            return;
        }
        batch.insert(META_REVISION, &codec::encode_u64(end_revision));

        let durable = self.db.apply_batch(batch).and_then(|_| self.db.flush().map(|_| ()));
        if let Err(e) = durable {
            tracing::error!(error = %e, "store write failed; the whole group is refused");
            for (reply, result) in replies {
                let _ = reply.send(result.and(Err(StorageError::Backend(e.to_string()))));
            }
            return;
        }

        {
            let mut state = self.state.write();
            for (key, obj) in overlay {
                match obj {
                    Some(o) => state.objects.insert(key, o),
                    None => state.objects.remove(&key),
                };
            }
            state.revision = end_revision;
            for ev in events {
                state.log.push_back((now, ev));
            }
            state.compact_to(new_compacted);
        }
        self.revision.send_replace(end_revision);
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        state: &State,
        overlay: &mut HashMap<String, Option<Arc<Object>>>,
        batch: &mut sled::Batch,
        revision: &mut Revision,
        op: Op,
        events: &mut Vec<Arc<Event>>,
        compact_to: &mut Option<Revision>,
    ) -> Result<Option<Arc<Object>>> {
        let current = |key: &str| match overlay.get(key) {
            Some(o) => o.clone(),
            None => state.objects.get(key).cloned(),
        };
        let (key, kind, object, prev) = match op {
            Op::Compact { revision: r } => {
                *compact_to = Some(compact_to.unwrap_or(0).max(r));
                return Ok(None);
            }
            Op::Create { key, value } => {
                if current(&key).is_some() {
                    return Err(StorageError::AlreadyExists { key });
                }
                let obj = make_object(&key, value, *revision + 1)?;
                batch.insert(codec::object_key(&key), codec::encode_object(&obj));
                (key, EventType::Added, obj, None)
            }
            Op::Update { key, value, expected } => {
                let Some(prev) = current(&key) else {
                    return Err(StorageError::NotFound { key });
                };
                check_expected(&key, &prev, expected)?;
                let obj = make_object(&key, value, *revision + 1)?;
                batch.insert(codec::object_key(&key), codec::encode_object(&obj));
                (key, EventType::Modified, obj, Some(prev))
            }
            Op::Delete { key, expected } => {
                let Some(prev) = current(&key) else {
                    return Err(StorageError::NotFound { key });
                };
                check_expected(&key, &prev, expected)?;
                let obj = make_object(&key, (*prev.value).clone(), *revision + 1)?;
                batch.remove(codec::object_key(&key));
                (key, EventType::Deleted, obj, Some(prev))
            }
        };
        *revision += 1;
        let object = Arc::new(object);
        let event = Event { revision: *revision, kind, object: object.clone(), prev };
        batch.insert(codec::event_key(*revision), codec::encode_event(&event));
        events.push(Arc::new(event));
        overlay.insert(key, (kind != EventType::Deleted).then(|| object.clone()));
        Ok(Some(object))
    }
}

fn check_expected(key: &str, current: &Object, expected: Option<Revision>) -> Result<()> {
    match expected {
        Some(e) if e != current.mod_revision => {
            Err(StorageError::Conflict { key: key.to_owned(), expected: e, actual: current.mod_revision })
        }
        _ => Ok(()),
    }
}

#[async_trait]
impl Store for SledStore {
    async fn get(&self, key: &str) -> Result<Option<Arc<Object>>> {
        Ok(self.shared.state.read().objects.get(key).cloned())
    }

    async fn list(&self, opts: ListOptions) -> Result<ListResult> {
        self.shared.state.read().list(&opts)
    }

    async fn create(&self, key: &str, value: Value) -> Result<Arc<Object>> {
        let obj = self.submit(Op::Create { key: key.to_owned(), value }).await?;
        obj.ok_or(StorageError::Closed)
    }

    async fn update(&self, key: &str, value: Value, expected: Option<Revision>) -> Result<Arc<Object>> {
        let obj = self.submit(Op::Update { key: key.to_owned(), value, expected }).await?;
        obj.ok_or(StorageError::Closed)
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Arc<Object>> {
        let obj = self.submit(Op::Delete { key: key.to_owned(), expected }).await?;
        obj.ok_or(StorageError::Closed)
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        {
            let state = self.shared.state.read();
            if after < state.compacted {
                return Err(StorageError::Expired { requested: after, oldest: state.compacted });
            }
        }
        let cursor = WatchCursor {
            shared: self.shared.clone(),
            changed: self.shared.revision.subscribe(),
            prefix: prefix.to_owned(),
            after,
            pending: Default::default(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(cursor, WatchCursor::next)))
    }

    fn current_revision(&self) -> Revision {
        self.shared.state.read().revision
    }

    fn compacted_revision(&self) -> Revision {
        self.shared.state.read().compacted
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.submit(Op::Compact { revision }).await.map(|_| ())
    }
}

struct WatchCursor {
    shared: Arc<Shared>,
    changed: watch::Receiver<Revision>,
    prefix: String,
    after: Revision,
    pending: std::collections::VecDeque<Arc<Event>>,
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
            // Mark the current revision seen before reading, so a commit after the read still wakes us.
            self.changed.borrow_and_update();
            let read = self.shared.state.read().events_after(&self.prefix, self.after, WATCH_BATCH);
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
