//! The durable side under the cache: what any backend (sled, etcd) must offer so one `Cacher` can serve reads and
//! watches from memory — as kube-apiserver's cacher needs only `storage.Interface`'s list, watch and writes.

use std::sync::Arc;

use super::value::Transformer;
use super::{Draft, Event, EventType, HistoryLimits, Object, Result, Revision};
use async_trait::async_trait;
use futures::stream::BoxStream;

/// One write, checked and applied by the backend. The backend stamps `metadata.resourceVersion` with the revision
/// it assigns.
#[derive(Debug)]
pub enum Write {
    Create {
        key: String,
        object: Draft,
    },
    /// Replaces `key` if its revision is still `expected` (when given).
    Update {
        key: String,
        object: Draft,
        expected: Option<Revision>,
    },
    /// Removes `key` if its revision is still `expected` (when given).
    Delete {
        key: String,
        expected: Option<Revision>,
    },
}

/// A durable change, as the backend reports it. The cache knows the previous state itself, so none is carried.
#[derive(Debug, Clone)]
pub struct Change {
    pub revision: Revision,
    pub kind: EventType,
    /// The new state; for `Deleted`, the last state stamped with the deletion's revision.
    pub object: Arc<Object>,
}

/// Everything a backend holds, read at one revision: where a cache starts.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub revision: Revision,
    pub objects: Vec<Arc<Object>>,
    /// The backend's history before `revision` starts after this.
    pub compacted: Revision,
    /// The kept history, `compacted + 1 ..= revision`, oldest first, sharing objects with `objects` where equal.
    pub events: Vec<Arc<Event>>,
}

/// Changes after a revision, in revision order, without gaps, batched as they became durable. Revisions need not
/// be consecutive: etcd's count every key of the cluster.
pub type ChangeStream = BoxStream<'static, Result<Vec<Change>>>;

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Reads the whole store at its current revision: at start, and again if the change stream fell behind the
    /// backend's own history. History the cache would drop at once (beyond `keep`'s event and byte caps) may be left
    /// out, so a restart never holds it.
    async fn load(&self, keep: &HistoryLimits) -> Result<Snapshot>;
    /// Applies one write durably and returns the object it stored. The same change is also delivered by `watch`.
    async fn write(&self, write: Write) -> Result<Arc<Object>>;
    /// Every change after `after`. Ends with `Expired` if `after` is older than the kept history, or with another
    /// error if the backend cannot be followed for now (the cache then watches again).
    fn watch(&self, after: Revision) -> Result<ChangeStream>;
    /// The revision of the last write to the cache's keys, by any process, when others may write to the backend
    /// (etcd): a read that must see every acknowledged write waits until the cache has applied it. `None` when
    /// every write goes through this process, so the cache is always current.
    async fn last_write_revision(&self) -> Result<Option<Revision>> {
        Ok(None)
    }
    /// The cache no longer needs history up to `revision`; the backend may drop it when convenient (with its next
    /// write, say). Never blocks.
    fn compact(&self, revision: Revision);
    /// Ok when the backend can take writes. After a failed write it first tries to recover in place (sled: reopen
    /// the database), so a store whose cause went away (a disk that was full) heals without a restart.
    async fn check(&self) -> Result<()>;
    /// Ok unless the backend is stuck for good, so only a restart helps (`/livez`).
    fn check_alive(&self) -> Result<()> {
        Ok(())
    }
    /// How the backend transforms the values it stores (encryption at rest); plain by default.
    fn values(&self) -> &Transformer {
        static PLAIN: Transformer = Transformer::plain();
        &PLAIN
    }
    /// Bytes the backend's files take, if it can tell.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }
}
