//! A recorded history: what each client asked, what it was told, and when. Times are nanoseconds since the run
//! started, taken just before the request left and just after its answer (or failure) came back.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Nanoseconds since the run started.
pub type Time = u64;

/// A call's answer (a watch's first, or 410) comes within this, or is lost.
pub const ANSWER_WITHIN: Time = 10_000_000_000;

/// An answer that never came (timeout, connection cut, 5xx) leaves the call pending until the end of the run.
pub const NEVER: Time = Time::MAX;

/// The route of calls through kube-apiserver's aggregator, which may send each to any replica.
pub const AGGREGATOR: &str = "aggregator";

/// `namespace/name` of a PodSet.
pub type Key = String;

/// Which revision a read asks for, as `resourceVersion` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadFrom {
    /// `resourceVersion=""`: the latest, linearizable.
    Latest,
    /// `resourceVersion="0"`: any revision the server has.
    Any,
    /// `resourceVersion=N`: any revision not older than N.
    AtLeast(u64),
    /// `resourceVersion=N&resourceVersionMatch=Exact` (lists): revision N itself.
    Exact(u64),
}

/// What a client asked for. Every write carries a marker unique to it (an annotation), so a state read back says
/// which write made it; writes of the controller (status) keep the marker they found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Create {
        key: Key,
        marker: String,
    },
    /// PUT; `precondition` is the `metadata.resourceVersion` sent.
    Update {
        key: Key,
        marker: String,
        precondition: Option<u64>,
    },
    /// A merge or JSON patch: an unconditional write of an existing object.
    Patch {
        key: Key,
        marker: String,
    },
    /// Server-side apply with force: creates or overwrites.
    Apply {
        key: Key,
        marker: String,
    },
    Delete {
        key: Key,
        precondition: Option<u64>,
    },
    Get {
        key: Key,
        from: ReadFrom,
    },
    /// A namespace's list (`""`: every namespace), all pages; the answer is one snapshot. `group`: only the
    /// PodSets of that [`group_of`] (a label selector).
    List {
        namespace: String,
        from: ReadFrom,
        #[serde(default)]
        group: Option<String>,
    },
    /// A write of `/scale`: `spec.replicas` only. Its answer (a Scale) carries no marker; the object keeps its own.
    Scale {
        key: Key,
        replicas: u32,
        precondition: Option<u64>,
    },
    /// A write of `/status`: the object keeps its marker, and the answer shows it.
    Status {
        key: Key,
        precondition: Option<u64>,
    },
}

/// The label every PodSet of the run carries, and its value for a key: `even` or `odd` by the number its name
/// ends in, so a label-selected list's expected items follow from etcd's record.
pub const GROUP_LABEL: &str = "robustness.demo.k8s.io/group";

pub fn group_of(key: &str) -> &'static str {
    let n: u64 = key.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    if n.is_multiple_of(2) {
        "even"
    } else {
        "odd"
    }
}

impl Request {
    pub fn key(&self) -> Option<&str> {
        match self {
            Request::Create { key, .. }
            | Request::Update { key, .. }
            | Request::Patch { key, .. }
            | Request::Apply { key, .. }
            | Request::Delete { key, .. }
            | Request::Scale { key, .. }
            | Request::Status { key, .. }
            | Request::Get { key, .. } => Some(key),
            Request::List { .. } => None,
        }
    }

    pub fn marker(&self) -> Option<&str> {
        match self {
            Request::Create { marker, .. }
            | Request::Update { marker, .. }
            | Request::Patch { marker, .. }
            | Request::Apply { marker, .. } => Some(marker),
            _ => None,
        }
    }

    pub fn is_write(&self) -> bool {
        !matches!(self, Request::Get { .. } | Request::List { .. })
    }

    /// A write that leaves the object's marker as it was (a subresource's).
    pub fn keeps_marker(&self) -> bool {
        matches!(self, Request::Scale { .. } | Request::Status { .. })
    }
}

/// One state of a PodSet as a client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Seen {
    pub resource_version: u64,
    /// The marker of the client write the content came from.
    pub marker: String,
}

/// What a client was told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A write's object, or a get's.
    Object(Seen),
    /// A delete's answer: the last state, stamped with the deletion's revision.
    Deleted {
        resource_version: u64,
    },
    /// A delete's answer without the object (a `Status`): deleted, at a revision it does not say.
    Gone,
    /// A list: its revision and every item, by key.
    List {
        resource_version: u64,
        items: Vec<(Key, Seen)>,
    },
    NotFound,
    AlreadyExists,
    Conflict,
    /// 410 Gone: `revision` (asked for, or the revision of a list whose next page was asked for: `continued`) is
    /// older than the server keeps.
    Expired {
        revision: u64,
        continued: bool,
    },
    /// No answer (timeout, connection cut, 5xx): a write may or may not have happened.
    Lost,
    /// Any other definite refusal (4xx): nothing changed.
    Refused(String),
}

/// One call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub client: usize,
    /// Where it went (a replica or the aggregator), for the report.
    pub route: String,
    pub call: Time,
    /// [`NEVER`] when the answer was lost.
    pub ret: Time,
    pub request: Request,
    pub response: Response,
}

impl Operation {
    pub fn lost(&self) -> bool {
        self.response == Response::Lost
    }

    /// The revision an acknowledged write made (each write carries a new marker, so none is a no-op).
    pub fn written_revision(&self) -> Option<u64> {
        match (&self.request, &self.response) {
            (r, Response::Object(s)) if r.is_write() => Some(s.resource_version),
            (Request::Delete { .. }, Response::Deleted { resource_version }) => Some(*resource_version),
            _ => None,
        }
    }
}

/// A time for the report: seconds since the run started.
pub(crate) fn secs(t: Time) -> String {
    if t == NEVER {
        "never".into()
    } else {
        format!("{:.3}", t as f64 / 1e9)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>9} .. {:>9}] client {} via {}: {:?} -> {:?}",
            secs(self.call),
            secs(self.ret),
            self.client,
            self.route,
            self.request,
            self.response
        )
    }
}

/// What a watch was told, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchItem {
    Added {
        key: Key,
        seen: Seen,
    },
    Modified {
        key: Key,
        seen: Seen,
    },
    /// The last state, stamped with the deletion's revision: its marker says which state it was.
    Deleted {
        key: Key,
        resource_version: u64,
        /// `None` in histories from before it was recorded.
        #[serde(default)]
        marker: Option<String>,
    },
    Bookmark {
        resource_version: u64,
    },
    /// 410 Gone, at the start or as an ERROR event.
    Expired,
}

impl WatchItem {
    /// The revision it tells the watch has reached: an event's, or a bookmark's.
    pub fn revision(&self) -> Option<u64> {
        match self {
            WatchItem::Bookmark { resource_version } => Some(*resource_version),
            i => i.event().map(|(_, rv)| rv),
        }
    }

    pub fn event(&self) -> Option<(&str, u64)> {
        match self {
            WatchItem::Added { key, seen } | WatchItem::Modified { key, seen } => Some((key, seen.resource_version)),
            WatchItem::Deleted { key, resource_version, .. } => Some((key, *resource_version)),
            _ => None,
        }
    }
}

/// How a watch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum WatchStart {
    /// `resourceVersion=<from>`: the changes after it.
    #[default]
    From,
    /// `resourceVersion` unset: ADDED for every object at a revision no older than any write acknowledged before
    /// the call, then the changes after it.
    Latest,
    /// `resourceVersion=0`: the same from any revision.
    Any,
    /// `sendInitialEvents=true&resourceVersionMatch=NotOlderThan`, `resourceVersion` unset (a WatchList): as
    /// [`WatchStart::Latest`], with a bookmark at that revision after the initial events.
    InitialEvents,
}

/// Why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum WatchEnd {
    /// Not recorded (histories from before).
    #[default]
    Unknown,
    /// The run stopped it.
    Stopped,
    /// The server ended the stream (its timeout, or a connection closed cleanly).
    Closed,
    /// Told 410 Gone (see [`WatchItem::Expired`]).
    Expired,
    /// Nothing came for 15 s.
    Silent,
    /// The stream failed: a connection error or an event that could not be read.
    Failed(String),
    /// The watch never started: the error it got instead.
    NotStarted(String),
}

/// One watch: `?watch=1` on a namespace (`""`: every namespace), with bookmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    pub client: usize,
    pub route: String,
    pub namespace: String,
    /// The `resourceVersion` it started from ([`WatchStart::From`]); 0 otherwise.
    pub from: u64,
    pub call: Time,
    pub items: Vec<WatchItem>,
    #[serde(default)]
    pub start: WatchStart,
    #[serde(default)]
    pub end: WatchEnd,
    /// The informer this watch belongs to: it lists, watches from the list's revision, and resumes from the last
    /// revision it was told after every break, for the whole run.
    #[serde(default)]
    pub informer: Option<usize>,
    /// `from` is the revision of a list the informer made just before (a start or a relist after 410), not a resume.
    #[serde(default)]
    pub after_list: bool,
    /// Asked for `PartialObjectMetadata` only.
    #[serde(default)]
    pub metadata_only: bool,
}

impl Watch {
    /// Whether a key is in the watch's namespace.
    pub fn covers(&self, key: &str) -> bool {
        in_namespace(&self.namespace, key)
    }
}

/// Whether `key` is in `namespace` (`""`: every namespace).
pub fn in_namespace(namespace: &str, key: &str) -> bool {
    namespace.is_empty() || key.split_once('/').is_some_and(|(ns, _)| ns == namespace)
}

/// One change in the store, as etcd recorded it (ground truth for watches and reads).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub resource_version: u64,
    pub key: Key,
    /// The new state's marker; `None` for a deletion.
    pub marker: Option<String>,
}

/// Owned Pods of one PodSet at one moment: read in `[call, ret]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodCount {
    pub key: Key,
    pub call: Time,
    pub ret: Time,
    /// Owned by the PodSet, not terminating.
    pub active: u32,
    /// `spec.replicas` as read just before the Pods.
    pub replicas: u32,
    /// The controller had reported this spec done (`observedGeneration` is the generation, `status.replicas` is
    /// `spec.replicas`).
    pub settled: bool,
}

/// `spec.replicas` as a client set it: acknowledged writes, with their interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicasSet {
    pub key: Key,
    pub call: Time,
    pub ret: Time,
    pub replicas: u32,
}

/// A replica's process started (just before it was spawned). Its cache keeps every change after the revision it
/// read the store at, which it did before it answered anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStart {
    /// The route its clients use (`replica <i>`).
    pub route: String,
    pub at: Time,
    /// A cache that began again inside a running process (it reloaded after etcd compacted past it): it began
    /// after `at`, and answers every call made from this time on.
    #[serde(default)]
    pub answers_from: Option<Time>,
}

/// A replica's process that ended although no fault stopped it: a server must not exit on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaExit {
    pub route: String,
    /// Its exit status, as the process table told it.
    pub status: String,
    /// The last lines it logged.
    pub log_tail: Vec<String>,
}

/// etcd compacted to a revision during the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    pub at: Time,
    pub revision: u64,
}

/// An etcd member defragmented during the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defragmentation {
    pub at: Time,
    pub member: usize,
}

/// Everything one run recorded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub seed: u64,
    pub operations: Vec<Operation>,
    pub watches: Vec<Watch>,
    /// Every change to PodSets in order, read back from etcd after the run; empty when not known.
    pub changes: Vec<Change>,
    /// When each replica's process was started, the first ones at 0: where its cache's history begins.
    #[serde(default)]
    pub replica_starts: Vec<ReplicaStart>,
    /// Replicas found exited at the end of the run.
    #[serde(default)]
    pub replica_exits: Vec<ReplicaExit>,
    pub pod_counts: Vec<PodCount>,
    pub replicas_sets: Vec<ReplicasSet>,
    /// How long one reconcile may take to bring Pods down after a scale-down.
    pub reconcile_grace: Time,
    /// Every PodSet at the end.
    pub settled: Vec<Settled>,
    /// Answered calls below this mean the run did too little to show anything (0 in histories from before).
    #[serde(default)]
    pub min_answered: usize,
    #[serde(default)]
    pub compactions: Vec<Compaction>,
    #[serde(default)]
    pub defragmentations: Vec<Defragmentation>,
    /// Set when etcd's record of the run has a hole (etcd compacted what it had not read): nothing can be checked.
    #[serde(default)]
    pub record_gap: Option<String>,
    /// The revision the record was read up to; watches went on a little longer, and what they saw after it is not
    /// judged.
    #[serde(default)]
    pub record_until: Option<u64>,
    /// A rolling upgrade's and rollback's replacements, in order; empty in runs of one build.
    #[serde(default)]
    pub rollout: Vec<RolloutStep>,
    /// The objects answers carried, with the version their URL named.
    #[serde(default)]
    pub version_answers: Vec<VersionAnswer>,
    /// How each change etcd recorded (a deletion's excepted) was stored.
    #[serde(default)]
    pub stored: Vec<StoredForm>,
    /// What a rollback to the build that serves only v1alpha1 left.
    #[serde(default)]
    pub after_rollback: Option<AfterRollback>,
}

/// A build a replica runs in a rolling upgrade and rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Build {
    /// The build before demo.k8s.io/v1beta1: it serves only v1alpha1.
    Old,
    /// This build: v1beta1 and v1alpha1.
    New,
}

/// One replacement: the replica stopped (SIGTERM, out of the Endpoints first) at `at` and started on `build`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutStep {
    pub replica: usize,
    pub build: Build,
    pub at: Time,
    /// When it answered `/readyz` again, and was listed in the Endpoints; None if it never did.
    pub ready: Option<Time>,
    /// On the first step back to the old build: each replica's `podset_storage_version_objects{version="v1beta1"}`
    /// just before v1beta1's APIService was deleted (None: the replica did not report it).
    #[serde(default)]
    pub v1beta1_objects: Option<Vec<Option<u64>>>,
}

/// One answer whose objects were read as JSON, apiVersion and kind included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionAnswer {
    pub route: String,
    pub at: Time,
    /// The version the URL named (`v1alpha1`, `v1beta1`).
    pub asked: String,
    /// The call: `list`, `watch`, `get <key>`, `patch <key>`, ...
    pub call: String,
    pub objects: Vec<ServedObject>,
}

/// An object in an answer: the answer itself, a list's item, or a watch event's object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedObject {
    /// `the list`, `item <key>`, `ADDED <key>`, `<key>`.
    pub what: String,
    pub api_version: String,
    pub kind: String,
}

/// A change's stored form, as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredForm {
    pub resource_version: u64,
    pub key: Key,
    pub api_version: String,
    /// `spec.minReadySeconds`, or v1alpha1's annotation that carries it.
    pub min_ready_seconds: Option<i64>,
}

/// After the rollback: a namespace with PodSets deleted, and the aggregator's APIServices of demo.k8s.io.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfterRollback {
    pub namespace: String,
    pub deleted: Time,
    /// When it was gone; None if it was still there when the run stopped waiting.
    pub gone: Option<Time>,
    /// Its status conditions then (NamespaceDeletionDiscoveryFailure, ...).
    pub conditions: Vec<String>,
    /// The APIServices of demo.k8s.io, by name.
    pub apiservices: Vec<String>,
}

/// A PodSet once the faults were over and the system had time to settle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    pub key: Key,
    pub generation: i64,
    pub replicas: u32,
    /// Owned, not terminating.
    pub active: u32,
    pub status_replicas: Option<u32>,
    pub observed_generation: Option<i64>,
}
