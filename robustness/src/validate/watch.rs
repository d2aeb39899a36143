//! Watch guarantees as etcd states them, per watch against etcd's record of changes: ordered (revisions never go
//! back), unique (no change twice), atomic (all changes of a revision before any later one), reliable (every change
//! after the start revision up to the last one delivered or bookmarked, none missing, none invented, each with its
//! content and type), bookmarkable (bookmarks never go back, never behind a delivered event) and resumable (a start
//! revision still kept is never told 410).

use std::collections::{HashMap, HashSet};

use super::truth::{Bounds, Finding};
use crate::model::history::{Change, History, Time, Watch, WatchItem, AGGREGATOR, ANSWER_WITHIN, NEVER};

fn describe(w: &Watch) -> String {
    format!(
        "watch of client {} via {} on {} from {} (started at {:.3}s)",
        w.client,
        w.route,
        w.namespace,
        w.from,
        w.call as f64 / 1e9
    )
}

fn item_line(i: usize, item: &WatchItem) -> String {
    format!("  #{i}: {item:?}")
}

/// Checks one watch; `changes` is etcd's record (every change, in revision order).
pub fn check_watch(w: &Watch, changes: &[Change], kept_from: Option<u64>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut fail = |what: &str, lines: Vec<String>| out.push((what.to_owned(), [vec![describe(w)], lines].concat()));
    let prefix = format!("{}/", w.namespace);
    if told_410(w) {
        if let Some(k) = kept_from.filter(|&k| w.from >= k) {
            fail("410 Gone for a revision still kept", vec![format!("kept from revision {k}")]);
        }
        return out;
    }
    // Ordering, uniqueness and bookmarks, on the items as delivered.
    let mut last_event = w.from;
    let mut last_bookmark = 0;
    let mut delivered: Vec<(usize, &str, u64)> = Vec::new();
    let mut once = HashSet::new();
    for (i, item) in w.items.iter().enumerate() {
        match item {
            WatchItem::Bookmark { resource_version: rv } => {
                if *rv < last_bookmark {
                    fail("bookmark went back", vec![format!("after bookmark {last_bookmark}"), item_line(i, item)]);
                } else if *rv < last_event {
                    fail(
                        "bookmark behind a delivered event",
                        vec![format!("after event {last_event}"), item_line(i, item)],
                    );
                }
                last_bookmark = last_bookmark.max(*rv);
            }
            WatchItem::Expired => break,
            _ => {
                let (key, rv) = item.event().expect("an event");
                if !key.starts_with(&prefix) {
                    fail("event from another namespace", vec![item_line(i, item)]);
                }
                if rv <= w.from {
                    fail("event not after the start revision", vec![item_line(i, item)]);
                } else if rv < last_event || rv <= last_bookmark {
                    fail(
                        "event out of order",
                        vec![format!("after revision {}", last_event.max(last_bookmark)), item_line(i, item)],
                    );
                }
                if !once.insert((key, rv)) {
                    fail("event delivered twice", vec![item_line(i, item)]);
                }
                last_event = last_event.max(rv);
                delivered.push((i, key, rv));
            }
        }
    }
    // Each change with whether its key existed just before (Added or Modified).
    let mut exists: HashMap<&str, bool> = HashMap::new();
    let mut by_rv: HashMap<(&str, u64), (&Change, bool)> = HashMap::new();
    for c in changes {
        let existed = exists.insert(&c.key, c.marker.is_some()).unwrap_or(false);
        by_rv.insert((c.key.as_str(), c.resource_version), (c, existed));
    }
    // Reliability: exactly etcd's changes of this namespace from the start up to what was promised delivered.
    let upto = last_event.max(last_bookmark);
    let expected: Vec<&Change> = changes
        .iter()
        .filter(|c| c.resource_version > w.from && c.resource_version <= upto && c.key.starts_with(&prefix))
        .collect();
    let got: HashSet<(&str, u64)> = delivered.iter().map(|&(_, k, rv)| (k, rv)).collect();
    for c in &expected {
        if !got.contains(&(c.key.as_str(), c.resource_version)) {
            let split = got.iter().any(|&(k, rv)| rv == c.resource_version && by_rv.contains_key(&(k, rv)));
            let what = if split { "revision delivered in part (not atomic)" } else { "gap: a change never delivered" };
            let before = delivered.iter().rev().find(|&&(_, _, rv)| rv < c.resource_version);
            let after = delivered.iter().find(|&&(_, _, rv)| rv > c.resource_version);
            let mut lines = vec![format!("missing: {c:?}")];
            lines.extend(before.map(|&(i, _, _)| item_line(i, &w.items[i])));
            lines.extend(after.map(|&(i, _, _)| item_line(i, &w.items[i])));
            fail(what, lines);
        }
    }
    for &(i, key, rv) in &delivered {
        let Some(&(c, existed)) = by_rv.get(&(key, rv)) else {
            fail("event of a change etcd never had", vec![item_line(i, &w.items[i])]);
            continue;
        };
        let right = match &w.items[i] {
            WatchItem::Added { seen, .. } => !existed && c.marker.as_deref() == Some(&seen.marker),
            WatchItem::Modified { seen, .. } => existed && c.marker.as_deref() == Some(&seen.marker),
            WatchItem::Deleted { .. } => c.marker.is_none(),
            _ => true,
        };
        if !right {
            fail("event does not match etcd's change", vec![item_line(i, &w.items[i]), format!("etcd: {c:?}")]);
        }
    }
    out
}

/// Every watch of the run; `kept` is [`kept_from`] of each.
pub fn check(history: &History, kept: &[Option<u64>]) -> Vec<Finding> {
    history.watches.iter().zip(kept).flat_map(|(w, &k)| check_watch(w, &history.changes, k)).collect()
}

/// The watch was refused with 410 Gone at its start.
pub fn told_410(w: &Watch) -> bool {
    w.items.first() == Some(&WatchItem::Expired)
}

/// For a watch told 410: a revision from which the cache that answered certainly still kept every change, when the
/// history tells. A replica's cache begins at the revision its process read the store at, before its first answer,
/// so any write that started after that answer has a later revision. Through the aggregator any replica may
/// answer: the newest of their floors.
pub fn kept_from(history: &History, bounds: &Bounds, w: &Watch) -> Option<u64> {
    if !told_410(w) {
        return None;
    }
    let mut routes: Vec<&str> = history.replica_starts.iter().map(|s| s.route.as_str()).collect();
    routes.sort_unstable();
    routes.dedup();
    if routes.contains(&w.route.as_str()) {
        routes = vec![w.route.as_str()];
    } else if w.route != AGGREGATOR {
        return None;
    }
    let floors: Option<Vec<u64>> = routes.into_iter().map(|r| cache_floor(history, bounds, r, w.call)).collect();
    floors?.into_iter().max()
}

/// An upper bound on where the cache that answered a call of `route` made at `at` begins: the newest floor of the
/// processes that ran while the answer could come.
fn cache_floor(history: &History, bounds: &Bounds, route: &str, at: Time) -> Option<u64> {
    let mut starts: Vec<Time> = history.replica_starts.iter().filter(|s| s.route == route).map(|s| s.at).collect();
    starts.sort_unstable();
    starts.push(NEVER);
    let floors: Option<Vec<u64>> = starts
        .windows(2)
        .filter(|life| life[0] <= at.saturating_add(ANSWER_WITHIN) && life[1] > at)
        .map(|life| process_floor(history, bounds, route, life[0]..life[1]))
        .collect();
    floors?.into_iter().max()
}

/// Where the cache of the process that ran during `life` begins, at the latest: the oldest write started after its
/// first answer.
fn process_floor(history: &History, bounds: &Bounds, route: &str, life: std::ops::Range<Time>) -> Option<u64> {
    let first_answer = history
        .operations
        .iter()
        .filter(|o| o.route == route && life.contains(&o.call) && !o.lost())
        .map(|o| o.ret)
        .min()?;
    Some(bounds.started_after(first_answer)).filter(|&rv| rv != u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::{Operation, ReadFrom, ReplicaStart, Request, Response, Seen};

    fn change(rv: u64, key: &str, marker: Option<&str>) -> Change {
        Change { resource_version: rv, key: key.into(), marker: marker.map(String::from) }
    }
    fn changes() -> Vec<Change> {
        vec![
            change(2, "ns/a", Some("a1")),
            change(3, "ns/b", Some("b1")),
            change(4, "other/x", Some("x1")),
            change(5, "ns/a", Some("a2")),
            change(6, "ns/a", None),
        ]
    }
    fn added(key: &str, rv: u64, m: &str) -> WatchItem {
        WatchItem::Added { key: key.into(), seen: Seen { resource_version: rv, marker: m.into() } }
    }
    fn modified(key: &str, rv: u64, m: &str) -> WatchItem {
        WatchItem::Modified { key: key.into(), seen: Seen { resource_version: rv, marker: m.into() } }
    }
    fn deleted(key: &str, rv: u64) -> WatchItem {
        WatchItem::Deleted { key: key.into(), resource_version: rv }
    }
    fn bookmark(rv: u64) -> WatchItem {
        WatchItem::Bookmark { resource_version: rv }
    }
    fn watch(from: u64, items: Vec<WatchItem>) -> Watch {
        Watch { client: 0, route: "r".into(), namespace: "ns".into(), from, call: 0, items }
    }
    fn found(w: Watch) -> Vec<String> {
        check_watch(&w, &changes(), Some(2)).into_iter().map(|f| f.0).collect()
    }

    #[test]
    fn a_complete_watch_passes() {
        let all = vec![
            added("ns/a", 2, "a1"),
            added("ns/b", 3, "b1"),
            bookmark(4),
            modified("ns/a", 5, "a2"),
            deleted("ns/a", 6),
        ];
        assert_eq!(found(watch(1, all)), Vec::<String>::new());
        // Resumed from 3: only what came after.
        assert_eq!(found(watch(3, vec![modified("ns/a", 5, "a2"), bookmark(5)])), Vec::<String>::new());
        // Cut off early: fine, nothing after the last delivered revision was promised.
        assert_eq!(found(watch(1, vec![added("ns/a", 2, "a1")])), Vec::<String>::new());
        // 410 for a revision no longer kept.
        assert_eq!(found(watch(1, vec![WatchItem::Expired])), Vec::<String>::new());
    }

    #[test]
    fn a_gap_is_found() {
        assert_eq!(
            found(watch(1, vec![added("ns/a", 2, "a1"), modified("ns/a", 5, "a2")])),
            ["gap: a change never delivered"]
        );
        // A bookmark promises everything before it.
        assert_eq!(
            found(watch(1, vec![added("ns/a", 2, "a1"), bookmark(5)])),
            ["gap: a change never delivered", "gap: a change never delivered"]
        );
    }

    #[test]
    fn a_reordered_or_repeated_watch_is_found() {
        assert_eq!(found(watch(1, vec![added("ns/b", 3, "b1"), added("ns/a", 2, "a1")])), ["event out of order"]);
        assert_eq!(
            found(watch(1, vec![added("ns/a", 2, "a1"), added("ns/a", 2, "a1"), added("ns/b", 3, "b1")])),
            ["event delivered twice"]
        );
        assert_eq!(found(watch(3, vec![added("ns/a", 2, "a1")])), ["event not after the start revision"]);
    }

    #[test]
    fn bad_bookmarks_and_wrong_events_are_found() {
        assert_eq!(found(watch(3, vec![bookmark(4), bookmark(3)])), ["bookmark went back"]);
        assert_eq!(
            found(watch(4, vec![modified("ns/a", 5, "a2"), bookmark(4)])),
            ["bookmark behind a delivered event"]
        );
        assert_eq!(found(watch(4, vec![added("ns/a", 5, "a2")])), ["event does not match etcd's change"]);
        assert_eq!(found(watch(4, vec![modified("ns/a", 5, "zz")])), ["event does not match etcd's change"]);
        assert_eq!(
            found(watch(4, vec![modified("ns/c", 5, "a2")])),
            ["gap: a change never delivered", "event of a change etcd never had"]
        );
        assert_eq!(found(watch(2, vec![WatchItem::Expired])), ["410 Gone for a revision still kept"]);
    }

    #[test]
    fn a_revision_delivered_in_part_is_found() {
        let changes = vec![change(2, "ns/a", Some("a1")), change(2, "ns/b", Some("b1")), change(3, "ns/a", Some("a2"))];
        let w = watch(1, vec![added("ns/a", 2, "a1"), modified("ns/a", 3, "a2")]);
        let found: Vec<String> = check_watch(&w, &changes, None).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["revision delivered in part (not atomic)"]);
    }

    fn op(route: &str, call: u64, ret: u64, request: Request, response: Response) -> Operation {
        Operation { client: 0, route: route.into(), call, ret, request, response }
    }
    fn write(route: &str, call: u64, rv: u64) -> Operation {
        let request = Request::Patch { key: "ns/a".into(), marker: format!("m{rv}") };
        op(route, call, call + 1, request, Response::Object(Seen { resource_version: rv, marker: format!("m{rv}") }))
    }
    fn get(route: &str, call: u64, response: Response) -> Operation {
        op(route, call, call + 1, Request::Get { key: "ns/a".into(), from: ReadFrom::Latest }, response)
    }
    fn start(route: &str, at: u64) -> ReplicaStart {
        ReplicaStart { route: route.into(), at }
    }
    fn watch_at(route: &str, call: u64, from: u64) -> Watch {
        Watch { route: route.into(), call, ..watch(from, vec![WatchItem::Expired]) }
    }

    #[test]
    fn a_410_from_a_cache_that_still_kept_the_revision_is_found() {
        const S: u64 = 1_000_000_000;
        let r0 = "replica 0";
        let mut h = History {
            replica_starts: vec![start(r0, 0), start("replica 1", 0)],
            operations: vec![get(r0, 5 * S, Response::NotFound), write("replica 1", 20 * S, 7)],
            ..Default::default()
        };
        let kept = |h: &History, w: &Watch| kept_from(h, &Bounds::new(&h.operations), w);
        // Replica 0 answered just after 5 s, so its cache began before revision 7.
        assert_eq!(kept(&h, &watch_at(r0, 30 * S, 8)), Some(7));
        let findings = |h: &History, w: Watch| check_watch(&w, &[], kept(h, &w)).len();
        assert_eq!(findings(&h, watch_at(r0, 30 * S, 8)), 1);
        assert_eq!(findings(&h, watch_at(r0, 30 * S, 5)), 0);
        // Nothing says where replica 1's cache began, so neither that replica's nor the aggregator's 410 is judged.
        assert_eq!(kept(&h, &watch_at("replica 1", 30 * S, 8)), None);
        assert_eq!(kept(&h, &watch_at(AGGREGATOR, 30 * S, 8)), None);
        // Restarted at 40 s: the new cache may begin anywhere until the new process has answered (at 75 s).
        h.replica_starts.push(start(r0, 40 * S));
        h.operations.extend([
            get(r0, 38 * S, Response::Lost),
            write("replica 1", 70 * S, 20),
            get(r0, 75 * S, Response::Object(Seen { resource_version: 20, marker: "m20".into() })),
            write(r0, 80 * S, 25),
        ]);
        assert_eq!(kept(&h, &watch_at(r0, 50 * S, 8)), Some(25));
        assert_eq!(findings(&h, watch_at(r0, 90 * S, 20)), 0);
        assert_eq!(findings(&h, watch_at(r0, 90 * S, 25)), 1);
        // A call at 35 s may have been answered by either process: the newer floor.
        assert_eq!(kept(&h, &watch_at(r0, 35 * S, 8)), Some(25));
        assert_eq!(kept(&h, &watch_at(r0, 25 * S, 8)), Some(7));
        // Replica 1 answered at 20 s, before revision 20 was written. The aggregator may pick either: the newer floor.
        assert_eq!(kept(&h, &watch_at("replica 1", 90 * S, 8)), Some(20));
        assert_eq!(kept(&h, &watch_at(AGGREGATOR, 90 * S, 8)), Some(25));
        // A watch that was not told 410 has nothing to judge.
        assert_eq!(kept(&h, &Watch { items: Vec::new(), ..watch_at(r0, 90 * S, 8) }), None);
        // A route the run did not start replicas for is not judged.
        assert_eq!(kept(&h, &watch_at("elsewhere", 90 * S, 8)), None);
    }
}
