//! Revisioned object storage: the `Store` the rest of the server reads and writes, served by one in-memory cache
//! (`Cacher`, as kube-apiserver's watch cache over `storage.Interface`) over a durable `Backend`: sled on local disk, or etcd for several replicas.
//!
//! The model is etcd's: one global, strictly increasing revision; every write gets the next revision and one event
//! in a bounded history; reads can be served at an older revision inside that history; watches replay it.

mod backend;
mod cacher;
mod codec;
mod etcd_backend;
mod object;
mod sled_backend;
mod state;
pub mod value;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use backend::{Backend, Change, ChangeStream, Snapshot, Write};
pub use cacher::Cacher;
pub use etcd_backend::{EtcdBackend, EtcdOptions};
pub use object::{Draft, Object, ObjectMeta};
pub(crate) use sled_backend::metrics::metrics as sled_metrics;
pub use sled_backend::{SledBackend, SledOptions};

/// A revision of the whole store. 0 means "nothing written yet".
pub type Revision = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// A change. For `Deleted`, `object` is the last state stamped with the deletion's revision (as kube-apiserver
/// reports it); `prev` is the state before this event, if any.
#[derive(Debug, Clone)]
pub struct Event {
    pub revision: Revision,
    pub kind: EventType,
    pub object: Arc<Object>,
    pub prev: Option<Arc<Object>>,
}

/// What a list reads.
#[derive(Default)]
pub struct ListOptions {
    /// Only keys starting with this.
    pub prefix: String,
    /// Read at this revision (must be inside the kept history); `None` = current.
    pub revision: Option<Revision>,
    /// First key to return (inclusive), for pagination.
    pub start_key: Option<String>,
    /// Maximum number of items (after filtering).
    pub limit: Option<usize>,
    /// Items that fail this are skipped (they do not count toward `limit`).
    pub predicate: Option<Predicate>,
    /// Leave out objects whose stored value no provider reads, instead of failing the list: for the server's own
    /// readers (the controller, the migration, counts), which cannot act on them anyway. Clients' lists fail.
    pub skip_unreadable: bool,
}

pub type Predicate = Box<dyn Fn(&Object) -> bool + Send + Sync>;

#[derive(Debug)]
pub struct ListResult {
    pub items: Vec<Arc<Object>>,
    /// The revision the list was read at.
    pub revision: Revision,
    /// When `limit` cut the list: the key the next page starts at.
    pub next_key: Option<String>,
    /// When `limit` cut the list and no predicate was given: how many items follow.
    pub remaining: Option<u64>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("key {key:?} not found")]
    NotFound { key: String },
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error("key {key:?}: expected revision {expected}, found {actual}")]
    Conflict { key: String, expected: Revision, actual: Revision },
    #[error("revision {requested} has been compacted (oldest kept: {oldest})")]
    Expired { requested: Revision, oldest: Revision },
    #[error("revision {requested} is newer than the current revision {current}")]
    TooLarge { requested: Revision, current: Revision },
    #[error("object has no metadata to stamp a resourceVersion on")]
    InvalidObject,
    #[error("storage is shutting down")]
    Closed,
    #[error("storage stopped following its backend; a restart is needed")]
    Stopped,
    #[error("storage backend: {0}")]
    Backend(String),
    /// The backend cannot be reached (if the connection broke under a write, the write may still have landed, as
    /// with etcd's own clients).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer in time; a write may or may not have been applied.
    #[error("storage timeout: {0}")]
    Timeout(String),
    #[error("corrupt data in storage: {0}")]
    Corrupt(String),
    /// No configured encryption provider reads the value stored at `key`.
    #[error("cannot read the stored value of {key:?}: {reason}")]
    Unreadable { key: String, reason: String },
    /// The value could not be encrypted for storage, so it was not written.
    #[error("cannot encrypt the value of {key:?} for storage: {reason}")]
    Unwritable { key: String, reason: String },
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A stream of events after a revision, in order, without gaps or duplicates. It yields one `Err(Expired)` and ends
/// if the watcher falls behind the kept history.
pub type WatchStream = BoxStream<'static, Result<Arc<Event>>>;

/// How much history the event log keeps for watches and old-revision reads.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Keep at least this many of the newest events (unless `max_bytes` says otherwise) ...
    pub min_events: usize,
    /// ... and events younger than this even beyond `min_events` ...
    pub min_age: Duration,
    /// ... but never more than this many ...
    pub max_events: usize,
    /// ... nor more than this many bytes of serialized objects (the newest event is always kept).
    pub max_bytes: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        // 32 MiB of history leaves room for 10k ~0.7 KB objects plus their churn inside a 64 MB server.
        Self { min_events: 10_000, min_age: Duration::from_secs(300), max_events: 200_000, max_bytes: 32 << 20 }
    }
}

/// How big a store is, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub objects: usize,
    pub history_events: usize,
    /// Serialized bytes of the objects the history's events carry.
    pub history_bytes: usize,
    /// The durable backend's files, when it can tell.
    pub data_bytes: Option<u64>,
}

/// A revisioned key-value store of Kubernetes objects. Writes are durable when they return, and visible to reads
/// and watches of the same store by then.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<Option<Arc<Object>>>;
    async fn list(&self, opts: ListOptions) -> Result<ListResult>;
    /// Creates `key`; sets `metadata.resourceVersion` to the new revision.
    async fn create(&self, key: &str, object: Draft) -> Result<Arc<Object>>;
    /// Replaces `key`, if its revision is still `expected` (when given).
    async fn update(&self, key: &str, object: Draft, expected: Option<Revision>) -> Result<Arc<Object>>;
    /// Removes `key`, if its revision is still `expected` (when given). Returns the deleted object.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Arc<Object>>;
    /// Events under `prefix` with a revision greater than `after`.
    fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream>;
    fn current_revision(&self) -> Revision;
    /// Waits until reads see every write acknowledged before this call, by this process or another writing to the
    /// same backend (a consistent read); returns the revision reads have reached.
    async fn sync(&self) -> Result<Revision>;
    /// Waits until reads have reached `revision`, at most `timeout` (then `Timeout`); returns the revision reached.
    async fn wait_for(&self, revision: Revision, timeout: Duration) -> Result<Revision>;
    /// The oldest revision a read or watch can still start from (`after` >= this).
    fn compacted_revision(&self) -> Revision;
    /// Drops history up to and including `revision`.
    async fn compact(&self, revision: Revision) -> Result<()>;
    /// Ok when writes can succeed now; tries to recover first if they could not (`/readyz`).
    async fn check_writable(&self) -> Result<()>;
    /// Ok unless the store can no longer serve until the process restarts (`/livez`).
    fn check_alive(&self) -> Result<()>;
    fn stats(&self) -> StoreStats;
    /// Whether `object`'s stored value should be written again, unchanged: another encryption provider than the one
    /// writing now wrote it (so a rewrite moves it to the current key).
    fn is_stale(&self, _object: &Object) -> bool {
        false
    }
}
