//! The storage conformance suite: written against the `Store` trait, run against the cache over every backend.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use common::Tmpfs;
use futures::StreamExt;
use podset_apiserver::storage::{
    self, Cacher, Change, ChangeStream, Draft, EtcdBackend, EtcdOptions, Event, EventType, HistoryLimits, ListOptions,
    Object, Revision, SledBackend, Snapshot, StorageError, Store, Write,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A backend under test: opens the cache over it on a directory (again, after a restart).
#[async_trait::async_trait]
trait Backend: Sync {
    async fn open(&self, dir: &Path, limits: HistoryLimits) -> Arc<dyn Store>;
}

struct Sled;

#[async_trait::async_trait]
impl Backend for Sled {
    async fn open(&self, dir: &Path, limits: HistoryLimits) -> Arc<dyn Store> {
        let backend = SledBackend::open(dir, Default::default()).expect("open sled store");
        Arc::new(Cacher::new(Arc::new(backend), limits).await.expect("load the cache"))
    }
}

/// etcd, one member per test directory (so each test's revisions are its own), started from KUBEBUILDER_ASSETS.
/// A restart opens a new cache over the same etcd: the cache's history then starts at its load, as
/// kube-apiserver's watch cache does, so the cases about history across a restart are sled's and memory's only.
struct Etcd;

static ETCDS: LazyLock<Mutex<HashMap<PathBuf, Arc<Mutex<podset_envtest::etcd::Etcd>>>>> =
    LazyLock::new(Default::default);

fn etcd_for(dir: &Path) -> Arc<Mutex<podset_envtest::etcd::Etcd>> {
    let mut all = ETCDS.lock().unwrap();
    all.entry(dir.to_owned())
        .or_insert_with(|| Arc::new(Mutex::new(podset_envtest::etcd::Etcd::start(&dir.join("etcd")))))
        .clone()
}

fn etcd_options(url: String) -> EtcdOptions {
    EtcdOptions {
        servers: vec![url],
        group: "demo.k8s.io".into(),
        compaction_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Backend for Etcd {
    async fn open(&self, dir: &Path, limits: HistoryLimits) -> Arc<dyn Store> {
        let url = etcd_for(dir).lock().unwrap().url();
        let backend = EtcdBackend::connect(etcd_options(url)).await.expect("connect to etcd");
        Arc::new(Cacher::new(Arc::new(backend), limits).await.expect("load the cache"))
    }
}

/// A second backend, in memory (its "disk" outlives a store opened on the same directory): proves the cache
/// needs nothing from a backend beyond the `Backend` trait, as the etcd backend will.
struct Memory;

#[derive(Default)]
struct Disk {
    revision: Revision,
    compacted: Revision,
    objects: BTreeMap<String, Arc<Object>>,
    events: VecDeque<Arc<Event>>,
    subscribers: Vec<mpsc::UnboundedSender<storage::Result<Vec<Change>>>>,
    /// Cut off from the cache: change streams end and cannot be opened (a backend that went away).
    unreachable: bool,
}

struct MemoryBackend(Arc<Mutex<Disk>>);

/// The memory backend's "disk" for a directory.
fn static_disk(dir: &Path) -> Arc<Mutex<Disk>> {
    static DISKS: LazyLock<Mutex<HashMap<PathBuf, Arc<Mutex<Disk>>>>> = LazyLock::new(Default::default);
    DISKS.lock().unwrap().entry(dir.to_owned()).or_default().clone()
}

#[async_trait::async_trait]
impl Backend for Memory {
    async fn open(&self, dir: &Path, limits: HistoryLimits) -> Arc<dyn Store> {
        let disk = static_disk(dir);
        Arc::new(Cacher::new(Arc::new(MemoryBackend(disk)), limits).await.expect("load the cache"))
    }
}

#[async_trait::async_trait]
impl storage::Backend for MemoryBackend {
    async fn load(&self, _keep: &HistoryLimits) -> storage::Result<Snapshot> {
        let d = self.0.lock().unwrap();
        Ok(Snapshot {
            revision: d.revision,
            objects: d.objects.values().cloned().collect(),
            compacted: d.compacted,
            events: d.events.iter().cloned().collect(),
        })
    }

    async fn write(&self, write: Write) -> storage::Result<Arc<Object>> {
        let mut d = self.0.lock().unwrap();
        let next = d.revision + 1;
        let check = |d: &Disk, key: &str, expected: Option<Revision>| match d.objects.get(key) {
            None => Err(StorageError::NotFound { key: key.to_owned() }),
            Some(o) if expected.is_some_and(|e| e != o.mod_revision) => {
                Err(StorageError::Conflict { key: key.to_owned(), expected: expected.unwrap(), actual: o.mod_revision })
            }
            Some(o) => Ok(o.clone()),
        };
        let (kind, object, prev) = match write {
            Write::Create { key, object } => {
                if d.objects.contains_key(&key) {
                    return Err(StorageError::AlreadyExists { key });
                }
                (EventType::Added, Object::from_draft(&key, object, next), None)
            }
            Write::Update { key, object, expected } => {
                let prev = check(&d, &key, expected)?;
                (EventType::Modified, Object::from_draft(&key, object, next), Some(prev))
            }
            Write::Delete { key, expected } => {
                let prev = check(&d, &key, expected)?;
                let value = serde_json::from_slice(&prev.bytes).unwrap();
                (EventType::Deleted, Object::new(&key, value, next)?, Some(prev))
            }
        };
        let object = Arc::new(object);
        match kind {
            EventType::Deleted => d.objects.remove(&object.key),
            _ => d.objects.insert(object.key.clone(), object.clone()),
        };
        d.revision = next;
        d.events.push_back(Arc::new(Event { revision: next, kind, object: object.clone(), prev }));
        let change = Change { revision: next, kind, object: object.clone() };
        d.subscribers.retain(|s| s.send(Ok(vec![change.clone()])).is_ok());
        Ok(object)
    }

    fn watch(&self, after: Revision) -> storage::Result<ChangeStream> {
        let mut d = self.0.lock().unwrap();
        if d.unreachable {
            return Err(StorageError::Unavailable("cut off".into()));
        }
        if after < d.compacted {
            return Err(StorageError::Expired { requested: after, oldest: d.compacted });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let replay: Vec<Change> = d
            .events
            .iter()
            .filter(|e| e.revision > after)
            .map(|e| Change { revision: e.revision, kind: e.kind, object: e.object.clone() })
            .collect();
        if !replay.is_empty() {
            tx.send(Ok(replay)).unwrap();
        }
        d.subscribers.push(tx);
        Ok(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)))
    }

    async fn check(&self) -> storage::Result<()> {
        Ok(())
    }

    fn compact(&self, revision: Revision) {
        let mut d = self.0.lock().unwrap();
        while d.events.front().is_some_and(|e| e.revision <= revision) {
            d.events.pop_front();
        }
        d.compacted = d.compacted.max(revision);
    }
}

/// A JSON object as the store takes it.
fn draft(v: Value) -> Draft {
    Draft::new(&v, &[]).unwrap()
}

fn obj(name: &str, n: i64) -> Value {
    json!({"metadata": {"name": name}, "spec": {"n": n}})
}

fn n_of(v: &Value) -> i64 {
    v["spec"]["n"].as_i64().unwrap()
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The test's etcd, if it had one, goes with it.
        let etcd = ETCDS.lock().map(|mut all| all.remove(&self.dir)).ok().flatten();
        drop(etcd);
    }
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    Fixture { _tmp: tmp, dir }
}

const SMALL: HistoryLimits =
    HistoryLimits { min_events: 5, min_age: Duration::ZERO, max_events: 5, max_bytes: usize::MAX };

async fn writes_get_strictly_increasing_revisions(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    // A new store is at 0 (sled) or wherever its backend starts (etcd: 1); each write takes the next revision.
    let base = s.current_revision();
    assert!(base <= 1);
    let a = s.create("/p/ns/a", draft(obj("a", 1))).await.unwrap();
    assert_eq!(a.mod_revision, base + 1);
    let rv = a.parse().unwrap()["metadata"]["resourceVersion"].clone();
    assert_eq!(rv, (base + 1).to_string(), "the stored JSON carries its revision");
    let b2 = s.create("/p/ns/b", draft(obj("b", 1))).await.unwrap();
    let a2 = s.update("/p/ns/a", draft(obj("a", 2)), Some(base + 1)).await.unwrap();
    assert_eq!((b2.mod_revision, a2.mod_revision), (base + 2, base + 3));
    let gone = s.delete("/p/ns/b", None).await.unwrap();
    assert_eq!(gone.mod_revision, base + 4);
    let rv = gone.parse().unwrap()["metadata"]["resourceVersion"].clone();
    assert_eq!(rv, (base + 4).to_string(), "a deletion reports its own revision");
    assert_eq!(n_of(&gone.parse().unwrap()), 1, "a deletion reports the last state");
    assert_eq!(s.current_revision(), base + 4);
    assert!(s.get("/p/ns/b").await.unwrap().is_none());
    assert_eq!(n_of(&s.get("/p/ns/a").await.unwrap().unwrap().parse().unwrap()), 2);
}

/// `wait_for` returns as soon as a write reaches the revision, and times out on one nobody writes.
async fn wait_for_a_revision_returns_when_it_is_reached(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let now = s.current_revision();
    assert_eq!(s.wait_for(now, Duration::ZERO).await.unwrap(), now, "reached already");
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            s.create("/p/ns/a", draft(obj("a", 1))).await.unwrap().mod_revision
        })
    };
    let reached = s.wait_for(now + 1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(reached, writer.await.unwrap(), "woken by the write");
    let started = std::time::Instant::now();
    match s.wait_for(reached + 1000, Duration::from_millis(300)).await {
        Err(StorageError::Timeout(_)) => {}
        other => panic!("a revision nobody writes: {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
}

async fn compare_and_swap_conflicts(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let base = s.current_revision();
    s.create("/p/ns/a", draft(obj("a", 1))).await.unwrap();
    assert!(matches!(s.create("/p/ns/a", draft(obj("a", 1))).await, Err(StorageError::AlreadyExists { .. })));
    let r = s.update("/p/ns/a", draft(obj("a", 2)), Some(base + 7)).await;
    assert!(
        matches!(r, Err(StorageError::Conflict { actual, expected, .. }) if actual == base + 1 && expected == base + 7)
    );
    assert!(matches!(s.delete("/p/ns/a", Some(7)).await, Err(StorageError::Conflict { .. })));
    assert!(matches!(s.update("/p/ns/x", draft(obj("x", 1)), None).await, Err(StorageError::NotFound { .. })));
    assert!(matches!(s.delete("/p/ns/x", None).await, Err(StorageError::NotFound { .. })));
    assert_eq!(s.current_revision(), base + 1, "failed writes take no revision");
}

async fn concurrent_read_modify_write_loses_nothing(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let base = s.current_revision();
    s.create("/p/ns/counter", draft(obj("counter", 0))).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                loop {
                    let cur = s.get("/p/ns/counter").await.unwrap().unwrap();
                    let next = obj("counter", n_of(&cur.parse().unwrap()) + 1);
                    match s.update("/p/ns/counter", draft(next), Some(cur.mod_revision)).await {
                        Ok(_) => break,
                        // The write this lost to reaches the cache through a task on this runtime: let it run,
                        // or (the memory backend never yields) spinning tasks can starve it forever.
                        Err(StorageError::Conflict { .. }) => tokio::task::yield_now().await,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(n_of(&s.get("/p/ns/counter").await.unwrap().unwrap().parse().unwrap()), 320);
    assert_eq!(s.current_revision(), base + 321);
}

async fn watch_replays_in_order_without_gaps_then_goes_live(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let base = s.current_revision();
    for i in 0..10 {
        s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
        s.create(&format!("/p/other/o{i}"), draft(obj("o", i))).await.unwrap();
    }
    s.delete("/p/ns/o3", None).await.unwrap();
    let mut w = s.watch("/p/ns/", base + 4).unwrap();
    let mut revisions = Vec::new();
    let mut kinds = Vec::new();
    for _ in 0..9 {
        let ev = w.next().await.unwrap().unwrap();
        assert!(ev.object.key.starts_with("/p/ns/"));
        revisions.push(ev.revision);
        kinds.push(ev.kind);
    }
    let expected: Vec<Revision> = [5, 7, 9, 11, 13, 15, 17, 19, 21].iter().map(|r| base + r).collect();
    assert_eq!(revisions, expected, "only the prefix, every event once, in order");
    assert_eq!(kinds[8], EventType::Deleted);
    let live = s.update("/p/ns/o0", draft(obj("o", 100)), None).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((ev.revision, ev.kind), (live.mod_revision, EventType::Modified));
    assert_eq!(n_of(&ev.prev.as_ref().unwrap().parse().unwrap()), 0, "events carry the previous state");
}

async fn watch_before_kept_history_is_expired(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, SMALL).await;
    let base = s.current_revision();
    for i in 0..20 {
        s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
    }
    assert!(s.compacted_revision() >= base + 15, "history is bounded");
    assert!(matches!(s.watch("/p/", base + 1), Err(StorageError::Expired { .. })));
    let oldest = s.compacted_revision();
    let mut w = s.watch("/p/", oldest).unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().revision, oldest + 1);

    // A watcher that falls behind the history gets one Expired and ends.
    let mut slow = s.watch("/p/", s.current_revision()).unwrap();
    for i in 0..20 {
        s.update(&format!("/p/ns/o{i}"), draft(obj("o", -1)), None).await.unwrap();
    }
    assert!(matches!(slow.next().await, Some(Err(StorageError::Expired { .. }))));
    assert!(slow.next().await.is_none());

    s.compact(s.current_revision()).await.unwrap();
    assert_eq!(s.compacted_revision(), s.current_revision());
}

async fn list_reads_a_consistent_snapshot(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let base = s.current_revision();
    for i in 0..10 {
        s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
    }
    let at = s.current_revision();
    let page = s.list(ListOptions { prefix: "/p/ns/".into(), limit: Some(4), ..Default::default() }).await.unwrap();
    assert_eq!(page.items.len(), 4);
    assert_eq!(page.revision, at);
    assert_eq!(page.next_key.as_deref(), Some("/p/ns/o4"));
    assert_eq!(page.remaining, Some(6));

    // Change everything, then read the rest at the first page's revision.
    s.delete("/p/ns/o5", None).await.unwrap();
    s.update("/p/ns/o6", draft(obj("o", 66)), None).await.unwrap();
    s.create("/p/ns/o45", draft(obj("new", 0))).await.unwrap();
    let rest = s
        .list(ListOptions {
            prefix: "/p/ns/".into(),
            revision: Some(at),
            start_key: page.next_key.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<&str> = rest.items.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, vec!["/p/ns/o4", "/p/ns/o5", "/p/ns/o6", "/p/ns/o7", "/p/ns/o8", "/p/ns/o9"]);
    assert_eq!(n_of(&rest.items[2].parse().unwrap()), 6, "the old state of a changed object");
    assert_eq!(rest.items[2].mod_revision, base + 7);
    assert!(rest.next_key.is_none());

    let now = s.list(ListOptions { prefix: "/p/ns/".into(), ..Default::default() }).await.unwrap();
    assert_eq!(now.items.len(), 10);
    let filtered = s
        .list(ListOptions {
            prefix: "/p/".into(),
            limit: Some(2),
            predicate: Some(Box::new(|o| n_of(&o.parse().unwrap()) % 2 == 1)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(filtered.items.iter().all(|o| n_of(&o.parse().unwrap()) % 2 == 1));
    assert_eq!(filtered.items.len(), 2);
    assert!(filtered.next_key.is_some() && filtered.remaining.is_none());
    assert!(matches!(
        s.list(ListOptions { revision: Some(s.current_revision() + 5), ..Default::default() }).await,
        Err(StorageError::TooLarge { .. })
    ));
}

async fn old_revisions_expire_with_history(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, SMALL).await;
    let base = s.current_revision();
    for i in 0..20 {
        s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
    }
    let r = s.list(ListOptions { prefix: "/p/".into(), revision: Some(base + 2), ..Default::default() }).await;
    assert!(matches!(r, Err(StorageError::Expired { .. })));
}

async fn restart_keeps_objects_and_revision(b: &dyn Backend) {
    let f = fixture();
    let base;
    {
        let s = b.open(&f.dir, HistoryLimits::default()).await;
        base = s.current_revision();
        for i in 0..5 {
            s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
        }
        s.update("/p/ns/o1", draft(obj("o", 11)), None).await.unwrap();
        s.delete("/p/ns/o2", None).await.unwrap();
        let labelled = json!({"metadata": {"name": "o3", "namespace": "ns", "uid": "u3", "labels": {"app": "web"}}});
        let o3 = s.update("/p/ns/o3", draft(labelled), None).await.unwrap();
        assert_eq!((o3.meta.label("app"), &*o3.meta.uid, &*o3.meta.namespace), (Some("web"), "u3", "ns"));
    }
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let o3 = s.get("/p/ns/o3").await.unwrap().unwrap();
    assert_eq!(
        (o3.meta.label("app"), &*o3.meta.uid, &*o3.meta.name),
        (Some("web"), "u3", "o3"),
        "the index is rebuilt from the stored JSON"
    );
    assert_eq!(o3.mod_revision, base + 8);
    assert_eq!(o3.parse().unwrap()["metadata"]["resourceVersion"], (base + 8).to_string());
    assert_eq!(s.current_revision(), base + 8);
    assert_eq!(n_of(&s.get("/p/ns/o1").await.unwrap().unwrap().parse().unwrap()), 11);
    assert!(s.get("/p/ns/o2").await.unwrap().is_none());
    let next = s.create("/p/ns/o9", draft(obj("o", 9))).await.unwrap();
    assert_eq!(next.mod_revision, base + 9, "the revision continues");
}

async fn restart_keeps_history(b: &dyn Backend) {
    let f = fixture();
    {
        let s = b.open(&f.dir, HistoryLimits::default()).await;
        for i in 0..5 {
            s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
        }
        s.update("/p/ns/o1", draft(obj("o", 11)), None).await.unwrap();
        s.delete("/p/ns/o2", None).await.unwrap();
        s.update("/p/ns/o3", draft(obj("o", 33)), None).await.unwrap();
    }
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let mut w = s.watch("/p/", 0).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..8 {
        kinds.push(w.next().await.unwrap().unwrap().kind);
    }
    assert_eq!(kinds[5..], [EventType::Modified, EventType::Deleted, EventType::Modified]);
    let old = s.list(ListOptions { prefix: "/p/".into(), revision: Some(5), ..Default::default() }).await.unwrap();
    assert_eq!(old.items.len(), 5, "reads at a revision from before the restart");
}

async fn history_is_bounded_in_bytes(b: &dyn Backend) {
    let f = fixture();
    let max_bytes = 4096;
    let limits = HistoryLimits { min_events: 1000, min_age: Duration::from_secs(3600), max_events: 1000, max_bytes };
    let s = b.open(&f.dir, limits).await;
    let base = s.current_revision();
    let pad = "x".repeat(200);
    for i in 0..50 {
        s.create(&format!("/p/ns/o{i:02}"), draft(json!({"metadata": {"name": "o"}, "spec": {"pad": pad}})))
            .await
            .unwrap();
    }
    let size = s.get("/p/ns/o10").await.unwrap().unwrap().bytes.len() as u64;
    let kept = s.current_revision() - s.compacted_revision();
    assert!(kept * (size - 1) <= max_bytes as u64 && (kept + 1) * (size + 1) > max_bytes as u64, "kept {kept}");
    assert!(matches!(s.watch("/p/", base + 1), Err(StorageError::Expired { .. })));
    let mut w = s.watch("/p/", s.compacted_revision()).unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().revision, s.compacted_revision() + 1);
}

async fn restart_with_less_history_is_honest(b: &dyn Backend) {
    let f = fixture();
    {
        let s = b.open(&f.dir, HistoryLimits::default()).await;
        for i in 0..20 {
            s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
        }
    }
    let s = b.open(&f.dir, SMALL).await;
    assert_eq!((s.current_revision(), s.compacted_revision()), (20, 15));
    assert!(matches!(s.watch("/p/", 3), Err(StorageError::Expired { .. })), "a gap would be silent data loss");
    let r = s.list(ListOptions { prefix: "/p/".into(), revision: Some(10), ..Default::default() }).await;
    assert!(matches!(r, Err(StorageError::Expired { .. })));
    let mut w = s.watch("/p/", 15).unwrap();
    for rev in 16..=20 {
        assert_eq!(w.next().await.unwrap().unwrap().revision, rev);
    }
    drop((w, s));
    // The shorter history is what the store keeps from now on.
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    assert_eq!(s.compacted_revision(), 15);
    drop(s);
    // A cap in bytes counts too: each of these objects is 60-odd bytes of JSON, so 130 bytes keep two events.
    let bytes = HistoryLimits { max_bytes: 130, ..HistoryLimits::default() };
    let s = b.open(&f.dir, bytes).await;
    assert_eq!((s.current_revision(), s.compacted_revision()), (20, 18));
    assert!(matches!(s.watch("/p/", 17), Err(StorageError::Expired { .. })));
    assert_eq!(s.watch("/p/", 18).unwrap().next().await.unwrap().unwrap().revision, 19);
}

async fn restart_shares_history_with_current_objects(b: &dyn Backend) {
    let f = fixture();
    {
        let s = b.open(&f.dir, HistoryLimits::default()).await;
        s.create("/p/ns/a", draft(obj("a", 1))).await.unwrap();
        s.update("/p/ns/a", draft(obj("a", 2)), None).await.unwrap();
        s.create("/p/ns/b", draft(obj("b", 1))).await.unwrap();
        s.update("/p/ns/a", draft(obj("a", 3)), None).await.unwrap();
    }
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let mut w = s.watch("/p/", 0).unwrap();
    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(w.next().await.unwrap().unwrap());
    }
    let a = s.get("/p/ns/a").await.unwrap().unwrap();
    let b2 = s.get("/p/ns/b").await.unwrap().unwrap();
    assert!(Arc::ptr_eq(&events[3].object, &a) && Arc::ptr_eq(&events[2].object, &b2), "one copy per state");
    assert!(Arc::ptr_eq(events[1].prev.as_ref().unwrap(), &events[0].object), "prev is shared, not copied");
    assert!(Arc::ptr_eq(events[3].prev.as_ref().unwrap(), &events[1].object));
}

async fn concurrent_writers_share_flushes(b: &dyn Backend) {
    let f = fixture();
    let s = b.open(&f.dir, HistoryLimits::default()).await;
    let base = s.current_revision();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(
                async move { s.create(&format!("/p/ns/o{i:03}"), draft(obj("o", i))).await.unwrap().mod_revision },
            )
        })
        .collect();
    let mut revs = Vec::new();
    for t in tasks {
        revs.push(t.await.unwrap());
    }
    revs.sort();
    assert_eq!(revs, (base + 1..=base + 200).collect::<Vec<u64>>());
}

/// A cache cut off from its backend while the backend moved on and dropped the history in between: once back, the
/// cache reads everything again, and a watcher from before gets `Expired` (a 410 makes clients relist) rather
/// than a silent gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_behind_compacted_history_reloads() {
    let f = fixture();
    let s = Memory.open(&f.dir, HistoryLimits::default()).await;
    for i in 0..3 {
        s.create(&format!("/p/ns/o{i}"), draft(obj("o", i))).await.unwrap();
    }
    let mut before = s.watch("/p/", s.current_revision()).unwrap();
    let disk = static_disk(&f.dir);
    {
        let mut d = disk.lock().unwrap();
        d.unreachable = true;
        d.subscribers.clear();
    }
    // Another writer goes on meanwhile, and the backend compacts its history.
    let other = MemoryBackend(disk.clone());
    storage::Backend::write(&other, Write::Delete { key: "/p/ns/o0".into(), expected: None }).await.unwrap();
    storage::Backend::write(&other, Write::Create { key: "/p/ns/new".into(), object: draft(obj("new", 9)) })
        .await
        .unwrap();
    storage::Backend::compact(&other, 5);
    assert!(s.get("/p/ns/new").await.unwrap().is_none(), "the cache is behind");
    disk.lock().unwrap().unreachable = false;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while s.current_revision() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "the cache did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(s.get("/p/ns/new").await.unwrap().is_some());
    assert!(s.get("/p/ns/o0").await.unwrap().is_none());
    assert!(matches!(before.next().await, Some(Err(StorageError::Expired { .. }))), "no silent gap");
    assert!(matches!(s.watch("/p/", 3), Err(StorageError::Expired { .. })));
    let mut after = s.watch("/p/", 5).unwrap();
    s.update("/p/ns/new", draft(obj("new", 10)), None).await.unwrap();
    assert_eq!(after.next().await.unwrap().unwrap().revision, 6, "and follows again");
}

/// sled on a disk that fills up: writes fail cleanly and the check says so; once space is freed the same store
/// writes again, without a restart, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_recovers_in_place_after_a_full_disk() {
    let disk = Tmpfs::mount("8m");
    let dir = disk.path.join("db");
    let s = Sled.open(&dir, HistoryLimits::default()).await;
    let pad = "x".repeat(16 * 1024);
    let big = |i: usize| json!({"metadata": {"name": format!("o{i}")}, "spec": {"pad": pad}});
    for i in 0..10 {
        s.create(&format!("/p/ns/o{i}"), draft(big(i))).await.unwrap();
    }
    s.check_writable().await.expect("writable before the disk fills");
    let filler = disk.fill();

    let mut acked = (0..10).collect::<Vec<_>>();
    let mut refused = None;
    for i in 10..2000 {
        match s.create(&format!("/p/ns/o{i}"), draft(big(i))).await {
            Ok(o) => {
                assert_eq!(o.mod_revision, i as u64 + 1);
                acked.push(i)
            }
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert!(matches!(refused, Some(StorageError::Backend(_))), "a full disk refuses writes: {refused:?}");
    assert!(s.check_writable().await.is_err(), "the check says the store cannot write");
    assert!(s.check_alive().is_ok(), "but it can recover in place");
    assert!(s.create("/p/ns/still-full", draft(obj("x", 0))).await.is_err());

    std::fs::remove_file(filler).unwrap();
    s.check_writable().await.expect("writable again once space is freed");
    let after = s.create("/p/ns/after", draft(obj("after", 1))).await.expect("a write after recovery");
    for i in &acked {
        assert!(s.get(&format!("/p/ns/o{i}")).await.unwrap().is_some(), "acknowledged o{i} is served");
    }
    let mut w = s.watch("/p/", after.mod_revision - 1).unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().revision, after.mod_revision, "revisions continue without a gap");
    drop((w, s));

    let s = Sled.open(&dir, HistoryLimits::default()).await;
    for i in &acked {
        assert!(s.get(&format!("/p/ns/o{i}")).await.unwrap().is_some(), "acknowledged o{i} survives a restart");
    }
    assert!(s.get("/p/ns/after").await.unwrap().is_some());
}

macro_rules! suite {
    ($backend:ident: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case(&super::$backend).await;
            }
        )*
    };
}

/// Every backend.
macro_rules! conformance {
    ($backend:ident) => {
        suite!(
            $backend:
            writes_get_strictly_increasing_revisions,
            compare_and_swap_conflicts,
            wait_for_a_revision_returns_when_it_is_reached,
            concurrent_read_modify_write_loses_nothing,
            watch_replays_in_order_without_gaps_then_goes_live,
            watch_before_kept_history_is_expired,
            list_reads_a_consistent_snapshot,
            old_revisions_expire_with_history,
            restart_keeps_objects_and_revision,
            concurrent_writers_share_flushes,
            history_is_bounded_in_bytes,
        );
    };
}

/// Backends whose cache reloads its history after a restart (the embedded ones).
macro_rules! history_across_restarts {
    ($backend:ident) => {
        suite!($backend: restart_keeps_history, restart_with_less_history_is_honest, restart_shares_history_with_current_objects);
    };
}

mod sled {
    conformance!(Sled);
    history_across_restarts!(Sled);
}

mod memory {
    conformance!(Memory);
    history_across_restarts!(Memory);
}

mod etcd {
    conformance!(Etcd);
}
