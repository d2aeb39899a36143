//! The etcd backend where it differs from an embedded store: several caches (replicas) over one etcd, revisions
//! shared with other keys, compaction, and etcd going away and coming back. A real etcd from KUBEBUILDER_ASSETS.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use futures::StreamExt;
use podset_apiserver::storage::{
    Backend, Cacher, Draft, EtcdBackend, EtcdOptions, EventType, HistoryLimits, ListOptions, Object, StorageError,
    Store,
};
use podset_envtest::etcd::Etcd;
use serde_json::json;

/// A PodSet-shaped object as the store takes it.
fn obj(name: &str, n: i64) -> Draft {
    Draft::new(&json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"n": n}}), &[]).unwrap()
}

fn n_of(o: &podset_apiserver::storage::Object) -> i64 {
    o.parse().unwrap()["spec"]["n"].as_i64().unwrap()
}

fn options(etcd: &Etcd) -> EtcdOptions {
    EtcdOptions {
        servers: vec![etcd.url()],
        group: "demo.k8s.io".into(),
        compaction_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

async fn replica(etcd: &Etcd) -> Arc<dyn Store> {
    let backend = EtcdBackend::connect(options(etcd)).await.unwrap();
    Arc::new(Cacher::new(Arc::new(backend), HistoryLimits::default()).await.unwrap())
}

/// What replica A acknowledged, replica B serves to a consistent read; B's watch sees A's writes in order, without
/// gaps or duplicates; a resourceVersion from A resumes on B; a compare-and-swap between them loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_over_one_etcd_agree() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let (a, b) = (replica(&etcd).await, replica(&etcd).await);
    let mut watch_b = b.watch("/podsets/", b.current_revision()).unwrap();

    let mut written = Vec::new();
    for i in 0..50 {
        let o = a.create(&format!("/podsets/ns/o{i:02}"), obj(&format!("o{i:02}"), i)).await.unwrap();
        written.push(o.mod_revision);
        // Read-your-writes across replicas: a consistent read on B right after A's acknowledgement.
        b.sync().await.unwrap();
        let seen = b.get(&format!("/podsets/ns/o{i:02}")).await.unwrap().expect("B sees A's write");
        assert_eq!(seen.mod_revision, o.mod_revision);
    }
    let page = b.list(ListOptions { prefix: "/podsets/ns/".into(), ..Default::default() }).await.unwrap();
    assert_eq!(page.items.len(), 50);

    let mut seen = Vec::new();
    while seen.len() < 50 {
        let ev = tokio::time::timeout(Duration::from_secs(5), watch_b.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(ev.kind, EventType::Added);
        seen.push(ev.revision);
    }
    assert_eq!(seen, written, "B's watch: A's writes, each once, in order");

    // A resourceVersion from A resumes on B.
    let from = written[24];
    let mut resumed = b.watch("/podsets/", from).unwrap();
    let first = resumed.next().await.unwrap().unwrap();
    assert_eq!(first.revision, written[25]);

    // Concurrent read-modify-write through both replicas: every increment lands once.
    a.create("/podsets/ns/counter", obj("counter", 0)).await.unwrap();
    // B's cache reads its own pace: a consistent read first, as the registry makes one before a read-modify-write.
    b.sync().await.unwrap();
    let mut tasks = Vec::new();
    for s in [a.clone(), b.clone(), a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                loop {
                    let cur = s.get("/podsets/ns/counter").await.unwrap().unwrap();
                    let next = obj("counter", n_of(&cur) + 1);
                    match s.update("/podsets/ns/counter", next, Some(cur.mod_revision)).await {
                        Ok(_) => break,
                        Err(StorageError::Conflict { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    a.sync().await.unwrap();
    assert_eq!(n_of(&a.get("/podsets/ns/counter").await.unwrap().unwrap()), 40);
}

/// Writes to keys outside ours (kube-apiserver's, on a shared etcd) take revisions too: the cache's revisions skip
/// them, and a consistent read returns at once rather than waiting for an event that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_of_other_keys_are_skipped_and_reached() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let s = replica(&etcd).await;
    let mut other = Client::connect([etcd.url()], None).await.unwrap();
    let a = s.create("/podsets/ns/a", obj("a", 1)).await.unwrap();
    for i in 0..5 {
        other.put(format!("/registry/pods/ns/p{i}"), "x", None).await.unwrap();
    }
    let b = s.create("/podsets/ns/b", obj("b", 1)).await.unwrap();
    assert_eq!(b.mod_revision, a.mod_revision + 6, "etcd's revisions count every key");
    let mut w = s.watch("/podsets/", a.mod_revision - 1).unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().revision, a.mod_revision);
    assert_eq!(w.next().await.unwrap().unwrap().revision, b.mod_revision);

    // The newest revision is someone else's: a consistent read needs only ours, so it returns at once.
    other.put("/registry/pods/ns/last", "x", None).await.unwrap();
    let started = std::time::Instant::now();
    let reached = s.sync().await.unwrap();
    assert!(reached >= b.mod_revision, "sync reached {reached}, our last write is {}", b.mod_revision);
    assert!(started.elapsed() < Duration::from_secs(1), "a consistent read does not wait out its timeout");
    let page = s.list(ListOptions { prefix: "/podsets/".into(), revision: Some(reached), ..Default::default() });
    assert_eq!(page.await.unwrap().items.len(), 2);
    // Keys are where kube-apiserver would put a demo.k8s.io resource.
    let keys = other.get("/registry/demo.k8s.io/podsets/", Some(GetOptions::new().with_prefix().with_keys_only()));
    let keys: Vec<String> = keys.await.unwrap().kvs().iter().map(|kv| kv.key_str().unwrap().to_owned()).collect();
    assert_eq!(keys, ["/registry/demo.k8s.io/podsets/ns/a", "/registry/demo.k8s.io/podsets/ns/b"]);
}

/// Another client's transaction writing two PodSets, and a range delete of both, give several events one revision:
/// the cache applies them all, keeps following, and a watch gets every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_in_one_revision_are_applied() {
    use etcd_client::{DeleteOptions, Txn, TxnOp};
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let s = replica(&etcd).await;
    let mut w = s.watch("/podsets/", s.current_revision()).unwrap();
    let mut other = Client::connect([etcd.url()], None).await.unwrap();
    let value = |name: &str| json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"n": 1}}).to_string();
    let put = |name: &str| TxnOp::put(format!("/registry/demo.k8s.io/podsets/ns/{name}"), value(name), None);
    other.txn(Txn::new().and_then([put("a"), put("b")])).await.unwrap();
    other.delete("/registry/demo.k8s.io/podsets/ns/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let ev = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap().unwrap().unwrap();
        seen.push((ev.kind, ev.object.meta.name.to_string(), ev.revision));
    }
    assert_eq!(seen[0].2, seen[1].2, "one transaction, one revision");
    assert_eq!(seen[2].2, seen[3].2, "one range delete, one revision");
    let kinds: Vec<_> = seen.iter().map(|(k, n, _)| (*k, n.as_str())).collect();
    assert_eq!(
        kinds,
        [(EventType::Added, "a"), (EventType::Added, "b"), (EventType::Deleted, "a"), (EventType::Deleted, "b")]
    );
    s.check_alive().expect("the cache still follows etcd");
    let made = s.create("/podsets/ns/c", obj("c", 1)).await.unwrap();
    assert!(made.mod_revision > seen[3].2);
    let page = s.list(ListOptions { prefix: "/podsets/".into(), ..Default::default() }).await.unwrap();
    assert_eq!(page.items.iter().map(|o| &*o.meta.name).collect::<Vec<_>>(), ["c"]);

    // More events in one revision than a watch takes from the cache at a time: none is skipped.
    let made = futures::future::join_all((0..300).map(|i| {
        let s = s.clone();
        async move { s.create(&format!("/podsets/ns/m{i:03}"), obj("m", i)).await }
    }));
    assert!(made.await.into_iter().all(|r| r.is_ok()));
    let mut w = s.watch("/podsets/", s.current_revision()).unwrap();
    other.delete("/registry/demo.k8s.io/podsets/ns/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    let mut deleted = std::collections::BTreeSet::new();
    while deleted.len() < 301 {
        let ev = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
        let ev = ev.unwrap_or_else(|_| panic!("{} of 301 deletions arrived", deleted.len()));
        let ev = ev.unwrap().unwrap();
        assert_eq!(ev.kind, EventType::Deleted);
        deleted.insert(ev.object.key.clone());
    }
}

/// etcd keeps an object's JSON as serde_json writes it, without `resourceVersion`; the write, a get, a watch and
/// another replica's load all return those bytes with the revision spliced in, and the same ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_json_without_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let s = replica(&etcd).await;
    let values = [
        json!({"kind": "PodSet", "metadata": {"name": "a", "namespace": "ns", "labels": {"x": "y"}}, "spec": {"n": 1}}),
        json!({"metadata": {"name": "b", "resourceVersion": "7", "uid": "u"}, "spec": {"n": 2}}),
        json!({"spec": {"n": 3}, "apiVersion": "v1"}),
    ];
    let mut client = Client::connect([etcd.url()], None).await.unwrap();
    for (i, value) in values.iter().enumerate() {
        let key = format!("/podsets/ns/o{i}");
        let written = s.create(&key, Draft::new(value, &[]).unwrap()).await.unwrap();
        let mut want = value.clone();
        if let Some(m) = want.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            m.remove("resourceVersion");
        }
        let stored = client.get(format!("/registry/demo.k8s.io{key}"), None).await.unwrap();
        assert_eq!(stored.kvs()[0].value_str().unwrap(), serde_json::to_string(&want).unwrap());
        let again = Object::from_unstamped_json(&key, stored.kvs()[0].value(), written.mod_revision).unwrap();
        assert_eq!(written.bytes, again.bytes, "{value}");
        assert_eq!(written.meta, again.meta);
        assert_eq!(s.get(&key).await.unwrap().unwrap().bytes, written.bytes);
        let mut w = s.watch("/podsets/", written.mod_revision - 1).unwrap();
        assert_eq!(w.next().await.unwrap().unwrap().object.bytes, written.bytes);
        let other = replica(&etcd).await;
        assert_eq!(other.get(&key).await.unwrap().unwrap().bytes, written.bytes);
    }
}

/// Many writers on two replicas while both keep making consistent reads: every read sees what was acknowledged
/// before it, and neither cache ever sees revisions go backwards (etcd 3.4's progress notifications could run ahead
/// of events; the caches must not depend on them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_reads_under_concurrent_writes_on_two_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let (a, b) = (replica(&etcd).await, replica(&etcd).await);
    let mut tasks = Vec::new();
    for (w, (mine, theirs)) in
        [(a.clone(), b.clone()), (b.clone(), a.clone()), (a.clone(), b.clone())].into_iter().enumerate()
    {
        tasks.push(tokio::spawn(async move {
            for i in 0..150 {
                let key = format!("/podsets/ns/w{w}-{i:03}");
                let made = mine.create(&key, obj("o", i)).await.unwrap();
                theirs.sync().await.unwrap();
                let seen = theirs.get(&key).await.unwrap().expect("acknowledged, so read by the other replica");
                assert!(seen.mod_revision >= made.mod_revision);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for s in [&a, &b] {
        s.check_alive().expect("the cache still follows etcd");
        s.sync().await.unwrap();
        assert_eq!(
            s.list(ListOptions { prefix: "/podsets/".into(), ..Default::default() }).await.unwrap().items.len(),
            450
        );
    }
}

/// Reads etcd's count of range requests from its metrics.
async fn etcd_ranges(etcd: &Etcd) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = etcd.url().trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    let line = body.lines().find_map(|l| l.strip_prefix("etcd_mvcc_range_total ")).expect("etcd_mvcc_range_total");
    line.trim().parse::<f64>().unwrap() as u64
}

/// Consistent reads that arrive together share one read of etcd's revision, and each still sees every write
/// acknowledged before it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_consistent_reads_share_one_revision_read() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let (a, b) = (replica(&etcd).await, replica(&etcd).await);
    let made = a.create("/podsets/ns/x", obj("x", 1)).await.unwrap();

    let before = etcd_ranges(&etcd).await;
    let reads = futures::future::join_all((0..200).map(|_| {
        let b = b.clone();
        async move { b.sync().await.unwrap() }
    }))
    .await;
    let ranges = etcd_ranges(&etcd).await - before;
    assert!(reads.iter().all(|r| *r >= made.mod_revision), "every read sees the write acknowledged before it");
    assert!(ranges < 50, "200 concurrent consistent reads made {ranges} range requests to etcd");

    // Reads that keep arriving while one is in flight wait for the next one, which sees writes acknowledged
    // in between.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let key = format!("/podsets/ns/r{w}-{i:02}");
                let made = a.create(&key, obj("r", i)).await.unwrap();
                assert!(b.sync().await.unwrap() >= made.mod_revision);
                assert!(b.get(&key).await.unwrap().is_some(), "acknowledged on A, so read on B");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// etcd's compaction: a watch from a compacted revision is `Expired` (410 to clients), and the compactor of
/// several servers compacts once per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_revisions_expire() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let compacting = EtcdOptions { compaction_interval: Duration::from_millis(500), ..options(&etcd) };
    let (b1, b2) =
        (EtcdBackend::connect(compacting.clone()).await.unwrap(), EtcdBackend::connect(compacting).await.unwrap());
    let s = Arc::new(Cacher::new(Arc::new(b1), HistoryLimits::default()).await.unwrap());
    let first = s.create("/podsets/ns/a", obj("a", 0)).await.unwrap().mod_revision;
    for i in 1..20 {
        s.update("/podsets/ns/a", obj("a", i), None).await.unwrap();
    }
    // Two rounds: the first records the revision, the next compacts to it.
    let mut client = Client::connect([etcd.url()], None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let old = client.get("/registry/demo.k8s.io/podsets/ns/a", Some(GetOptions::new().with_revision(first as i64)));
        if old.await.is_err() {
            break; // "required revision has been compacted"
        }
        assert!(tokio::time::Instant::now() < deadline, "etcd was not compacted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut changes = b2.watch(first).unwrap();
    match changes.next().await {
        Some(Err(StorageError::Expired { .. })) => {}
        other => panic!("a watch from a compacted revision: {other:?}"),
    }
    // The cache that followed all along still serves, and keeps following.
    let last = s.update("/podsets/ns/a", obj("a", 100), None).await.unwrap();
    assert_eq!(n_of(&s.get("/podsets/ns/a").await.unwrap().unwrap()), 100);
    assert_eq!(last.mod_revision, s.current_revision());
}

/// A deletion at the revision etcd was compacted to is not lost to a watch resuming just before it: etcd before
/// 3.4.34 and 3.5.15 drops that tombstone from a watch that starts at the compacted revision (etcd#18089), so a
/// cache behind by one compaction interval must either get the deletion or be told to reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_at_the_compacted_revision_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let backend = EtcdBackend::connect(options(&etcd)).await.unwrap();
    let s = Arc::new(
        Cacher::new(Arc::new(EtcdBackend::connect(options(&etcd)).await.unwrap()), HistoryLimits::default())
            .await
            .unwrap(),
    );
    s.create("/podsets/ns/a", obj("a", 0)).await.unwrap();
    let before = s.update("/podsets/ns/a", obj("a", 1), None).await.unwrap().mod_revision;
    let deleted = s.delete("/podsets/ns/a", None).await.unwrap().mod_revision;
    let after = s.create("/podsets/ns/b", obj("b", 0)).await.unwrap().mod_revision;
    let mut client = Client::connect([etcd.url()], None).await.unwrap();
    client.compact(deleted as i64, None).await.unwrap();

    // A cache that applied `before` resumes from it.
    let mut changes = backend.watch(before).unwrap();
    match tokio::time::timeout(Duration::from_secs(5), changes.next()).await.unwrap() {
        Some(Ok(batch)) => {
            let first = &batch[0];
            assert_eq!(
                (first.revision, first.kind),
                (deleted, EventType::Deleted),
                "the change after {before}: the deletion, not {after}"
            );
        }
        Some(Err(StorageError::Expired { .. })) => {}
        other => panic!("a watch from {before}: {other:?}"),
    }
}

/// etcd stopped: writes fail within the request timeout with a clear error and the check fails; cached reads go
/// on; consistent reads fail clearly. etcd back: the cache follows again, a watcher continues without a gap, and
/// nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(&dir.path().join("etcd"));
    let (a, b) = (replica(&etcd).await, replica(&etcd).await);
    let mut acked = Vec::new();
    for i in 0..5 {
        acked.push(a.create(&format!("/podsets/ns/o{i}"), obj("o", i)).await.unwrap().mod_revision);
    }
    b.sync().await.unwrap();
    let mut watch_b = b.watch("/podsets/", b.current_revision()).unwrap();

    etcd.stop();
    let started = std::time::Instant::now();
    let refused = a.create("/podsets/ns/during", obj("during", 0)).await;
    assert!(
        matches!(refused, Err(StorageError::Unavailable(_) | StorageError::Timeout(_))),
        "a write while etcd is down: {refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "no hang past the request timeout");
    assert!(a.check_writable().await.is_err(), "the check says etcd is gone");
    assert!(a.check_alive().is_ok(), "but the server can recover without a restart");
    assert!(b.get("/podsets/ns/o1").await.unwrap().is_some(), "cached reads go on");
    assert!(b.sync().await.is_err(), "a consistent read fails clearly");

    etcd.resume();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let after = loop {
        match a.create("/podsets/ns/after", obj("after", 1)).await {
            Ok(o) => break o,
            Err(StorageError::AlreadyExists { .. }) => break a.get("/podsets/ns/after").await.unwrap().unwrap(),
            Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("writes did not come back: {e}"),
        }
    };
    a.check_writable().await.expect("writable again");
    // B's watcher, opened before the outage, continues with A's write: no gap, no 410 (nothing was compacted).
    let ev = tokio::time::timeout(Duration::from_secs(20), watch_b.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((ev.revision, &*ev.object.key), (after.mod_revision, "/podsets/ns/after"));
    b.sync().await.unwrap();
    for (i, rev) in acked.iter().enumerate() {
        let o = b.get(&format!("/podsets/ns/o{i}")).await.unwrap().expect("acknowledged before the outage");
        assert_eq!(o.mod_revision, *rev);
    }
}

/// Responses over gRPC's default 4 MiB: a load page of 500 large objects, and one watch response holding a range
/// delete of 600 of them with their previous values. The cache loads and follows (tonic's default limit would
/// fail the load, and make the follower watch again in a loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_over_four_mib_are_read() {
    use etcd_client::DeleteOptions;
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd"));
    let s = replica(&etcd).await;
    let big = |name: &str, n: i64| {
        let pad = "x".repeat(10_000);
        Draft::new(&json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"n": n, "pad": pad}}), &[]).unwrap()
    };
    let made = futures::stream::iter(0..600)
        .map(|i| {
            let (s, big) = (s.clone(), &big);
            async move { s.create(&format!("/podsets/ns/b{i:03}"), big("b", i)).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(made.iter().all(|r| r.is_ok()));

    let loaded = replica(&etcd).await;
    let page = loaded.list(ListOptions { prefix: "/podsets/".into(), ..Default::default() }).await.unwrap();
    assert_eq!(page.items.len(), 600, "a second replica loads every object");

    let mut w = loaded.watch("/podsets/", loaded.current_revision()).unwrap();
    let mut other = Client::connect([etcd.url()], None).await.unwrap();
    other.delete("/registry/demo.k8s.io/podsets/ns/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    for seen in 0..600 {
        let ev = tokio::time::timeout(Duration::from_secs(10), w.next()).await;
        let ev = ev.unwrap_or_else(|_| panic!("{seen} of 600 deletions arrived")).unwrap().unwrap();
        assert_eq!(ev.kind, EventType::Deleted);
    }
    loaded.check_alive().expect("the cache still follows etcd");
}
