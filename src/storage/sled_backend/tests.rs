use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use super::*;
use crate::storage::Draft;

fn draft(name: &str, n: i64) -> Draft {
    Draft::new(&json!({"metadata": {"name": name}, "spec": {"n": n}}), &[]).unwrap()
}

fn open(dir: &Path) -> SledBackend {
    SledBackend::open(dir, SledOptions::default()).unwrap()
}

/// A create, an update, a delete and a create again of one key, and a create of another.
async fn write_some(b: &SledBackend) -> Vec<Change> {
    let writes = [
        (EventType::Added, Write::Create { key: "/a".into(), object: draft("a", 1) }),
        (EventType::Added, Write::Create { key: "/b".into(), object: draft("b", 1) }),
        (EventType::Modified, Write::Update { key: "/a".into(), object: draft("a", 2), expected: Some(1) }),
        (EventType::Deleted, Write::Delete { key: "/a".into(), expected: None }),
        (EventType::Added, Write::Create { key: "/a".into(), object: draft("a", 3) }),
        (EventType::Modified, Write::Update { key: "/b".into(), object: draft("b", 2), expected: None }),
    ];
    let mut out = Vec::new();
    for (kind, w) in writes {
        let object = b.write(w).await.unwrap();
        out.push(Change { revision: object.mod_revision, kind, object });
    }
    out
}

fn same(a: &[Change], b: &[Change]) {
    let view = |c: &[Change]| {
        c.iter().map(|c| (c.revision, c.kind, c.object.key.clone(), c.object.bytes.clone())).collect::<Vec<_>>()
    };
    assert_eq!(view(a), view(b));
}

#[tokio::test]
async fn every_state_is_kept_once_and_shared_with_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    let first = b.write(Write::Create { key: "/a".into(), object: draft("a", 1) }).await.unwrap();
    let second = b.write(Write::Update { key: "/a".into(), object: draft("a", 2), expected: None }).await.unwrap();
    let db = b.db().unwrap();
    let stored = db.get(codec::object_key("/a")).unwrap().unwrap();
    assert_eq!(stored.as_ptr().wrapping_add(8), second.bytes.as_ptr(), "sled's value is the object's JSON");
    let (_, prev) = db.scan_prefix(EVENT_PREFIX).last().unwrap().unwrap();
    assert_eq!(prev.as_ptr().wrapping_add(8), first.bytes.as_ptr(), "the event holds the previous state");
    drop((db, b));

    // After a restart, the loaded objects and history are sled's values too, not copies.
    let b = open(dir.path());
    let snap = b.load(&HistoryLimits::default()).await.unwrap();
    let db = b.db().unwrap();
    let stored = db.get(codec::object_key("/a")).unwrap().unwrap();
    assert_eq!(stored.as_ptr().wrapping_add(8), snap.objects[0].bytes.as_ptr());
    assert!(Arc::ptr_eq(&snap.events[1].object, &snap.objects[0]));
    assert!(Arc::ptr_eq(snap.events[1].prev.as_ref().unwrap(), &snap.events[0].object));
    assert_eq!(snap.events[0].object.bytes, first.bytes);
}

#[tokio::test]
async fn the_log_replays_each_state_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    let written = write_some(&b).await;
    let replayed = b.watch(0).unwrap().next().await.unwrap().unwrap();
    same(&written, &replayed);
    // From the middle, and after a restart (read from disk).
    drop(b);
    let b = open(dir.path());
    let replayed = b.watch(2).unwrap().next().await.unwrap().unwrap();
    same(&written[2..], &replayed);
    let snap = b.load(&HistoryLimits::default()).await.unwrap();
    let history: Vec<_> =
        snap.events.iter().map(|e| Change { revision: e.revision, kind: e.kind, object: e.object.clone() }).collect();
    same(&written, &history);
    let prevs: Vec<_> = snap.events.iter().map(|e| e.prev.as_ref().map(|p| p.mod_revision)).collect();
    assert_eq!(prevs, [None, None, Some(1), Some(3), None, Some(2)]);
}

#[tokio::test]
async fn a_load_leaves_out_a_batch_that_was_not_published() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    let written = write_some(&b).await;
    // As a batch whose flush failed leaves sled's memory: an update of /b and a create of /c, not published.
    let db = b.db().unwrap();
    let prev = db.get(codec::object_key("/b")).unwrap().unwrap();
    db.insert(codec::object_key("/b"), codec::stamp("/b", draft("b", 9), 7, &Transformer::plain()).unwrap().1).unwrap();
    db.insert(codec::event_key(7, EventType::Modified, "/b"), prev).unwrap();
    db.insert(codec::object_key("/c"), codec::stamp("/c", draft("c", 1), 8, &Transformer::plain()).unwrap().1).unwrap();
    db.insert(codec::event_key(8, EventType::Added, "/c"), IVec::default()).unwrap();
    let snap = b.load(&HistoryLimits::default()).await.unwrap();
    let objects: Vec<_> = snap.objects.iter().map(|o| (o.key.as_str(), o.mod_revision)).collect();
    assert_eq!((snap.revision, objects), (6, vec![("/a", 5), ("/b", 6)]));
    let history: Vec<_> =
        snap.events.iter().map(|e| Change { revision: e.revision, kind: e.kind, object: e.object.clone() }).collect();
    same(&written, &history);
}

#[tokio::test]
async fn a_log_that_disagrees_with_the_objects_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    write_some(&b).await;
    // An object changed behind the log's back.
    b.db()
        .unwrap()
        .insert(codec::object_key("/b"), codec::stamp("/b", draft("b", 9), 9, &Transformer::plain()).unwrap().1)
        .unwrap();
    let err = b.load(&HistoryLimits::default()).await.unwrap_err();
    assert!(matches!(&err, StorageError::Corrupt(m) if m.contains("disagree at revision 6")), "{err:?}");
    assert!(matches!(b.watch(0).unwrap().next().await.unwrap(), Err(StorageError::Corrupt(_))));
}

#[tokio::test]
async fn a_store_of_the_first_format_keeps_its_objects_and_starts_history_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        // As the first format wrote two creates: events `e/<revision>` holding kind, key, object and prev.
        let db = open_db(dir.path(), &SledOptions::default()).unwrap();
        for (rev, name) in [(1u64, "a"), (2, "b")] {
            let (_, record) = codec::stamp(&format!("/{name}"), draft(name, 1), rev, &Transformer::plain()).unwrap();
            db.insert(codec::object_key(&format!("/{name}")), record.clone()).unwrap();
            let mut event = vec![0u8];
            for part in [format!("/{name}").as_bytes(), &record[..], &[]] {
                event.extend_from_slice(&(part.len() as u32).to_be_bytes());
                event.extend_from_slice(part);
            }
            db.insert([EVENT_PREFIX, &rev.to_be_bytes()].concat(), event).unwrap();
        }
        db.insert(META_REVISION, &codec::encode_u64(2)).unwrap();
        db.insert(META_COMPACTED, &codec::encode_u64(0)).unwrap();
        db.flush().unwrap();
    }
    let b = open(dir.path());
    let snap = b.load(&HistoryLimits::default()).await.unwrap();
    assert_eq!((snap.revision, snap.compacted, snap.objects.len(), snap.events.len()), (2, 2, 2, 0));
    assert!(matches!(b.watch(1), Err(StorageError::Expired { requested: 1, oldest: 2 })));
    let c = b.write(Write::Update { key: "/a".into(), object: draft("a", 2), expected: Some(1) }).await.unwrap();
    assert_eq!(c.mod_revision, 3);
    drop(b);
    let snap = open(dir.path()).load(&HistoryLimits::default()).await.unwrap();
    assert_eq!((snap.revision, snap.compacted, snap.events.len()), (3, 2, 1));
    assert_eq!(snap.events[0].prev.as_ref().unwrap().mod_revision, 1);
}

#[tokio::test]
async fn a_store_of_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open_db(dir.path(), &SledOptions::default()).unwrap();
        db.insert(codec::META_FORMAT, &codec::encode_u64(codec::FORMAT + 1)).unwrap();
        db.flush().unwrap();
    }
    let err = SledBackend::open(dir.path(), SledOptions::default()).err().unwrap();
    assert!(matches!(&err, StorageError::Corrupt(m) if m.contains("newer")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stuck_in_one_write_makes_the_store_not_alive() {
    let dir = tempfile::tempdir().unwrap();
    let options = SledOptions { stuck_after: Duration::from_millis(300), ..Default::default() };
    let b = Arc::new(SledBackend::open(dir.path(), options).unwrap());
    // The writer publishes under this lock: holding it keeps the writer inside one group.
    let held = b.shared.published.lock();
    let writing = tokio::spawn({
        let b = b.clone();
        async move { b.write(Write::Create { key: "/a".into(), object: draft("a", 1) }).await }
    });
    while b.shared.busy_since.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.check_alive().is_ok(), "busy, not yet stuck");
    std::thread::sleep(Duration::from_millis(400));
    let err = b.check_alive().unwrap_err();
    assert!(err.to_string().contains("busy with one write"), "{err}");
    drop(held);
    writing.await.unwrap().unwrap();
    // The writer marks itself idle just after replying.
    for _ in 0..100 {
        if b.check_alive().is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still not alive after the write went through");
}

#[tokio::test]
async fn compaction_drops_the_log_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    write_some(&b).await;
    b.compact(4);
    b.write(Write::Create { key: "/c".into(), object: draft("c", 1) }).await.unwrap();
    let db = b.db().unwrap();
    let revisions: Vec<_> =
        db.scan_prefix(EVENT_PREFIX).keys().map(|k| codec::split_event_key(&k.unwrap()).unwrap().revision).collect();
    assert_eq!(revisions, [5, 6, 7]);
    assert!(matches!(b.watch(3), Err(StorageError::Expired { .. })));
    assert_eq!(b.watch(4).unwrap().next().await.unwrap().unwrap().len(), 3);
}
