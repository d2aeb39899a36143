//! Watch guarantees as etcd states them, per watch against etcd's record of changes: ordered (revisions never go
//! back), unique (no change twice), atomic (all changes of a revision before any later one), reliable (every change
//! after the start revision up to the last one delivered or bookmarked, none missing, none invented, each with its
//! content and type), bookmarkable (bookmarks never go back, never behind a delivered event) and resumable (a start
//! revision still kept is never told 410). A watch that opens with the state (`resourceVersion` unset or `0`, or
//! `sendInitialEvents`) must open with exactly the snapshot of one revision etcd had, no older than a consistent
//! read may be. Informers (list, watch, resume) must resume where they left off and reach etcd's last change.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::truth::{Bounds, Finding};
use crate::model::history::{
    Change, History, Time, Watch, WatchEnd, WatchItem, WatchStart, AGGREGATOR, ANSWER_WITHIN, NEVER,
};

fn describe(w: &Watch) -> String {
    let scope = if w.namespace.is_empty() { "every namespace" } else { w.namespace.as_str() };
    let start = match w.start {
        WatchStart::From => format!("from {}", w.from),
        WatchStart::Latest => "from resourceVersion unset".into(),
        WatchStart::Any => "from resourceVersion 0".into(),
        WatchStart::InitialEvents => "with sendInitialEvents".into(),
    };
    let informer = w.informer.map(|i| format!(" (informer {i})")).unwrap_or_default();
    format!(
        "watch of client {} via {}{informer} on {scope} {start} (started at {:.3}s)",
        w.client,
        w.route,
        w.call as f64 / 1e9
    )
}

fn item_line(i: usize, item: &WatchItem) -> String {
    format!("  #{i}: {item:?}")
}

/// Checks one watch; `changes` is etcd's record (every change, in revision order); `kept_from` where the cache
/// that answered certainly kept every change (for a 410); `consistent_from` the revision a consistent read made
/// when it started must show at least (for a watch from `resourceVersion` unset).
pub fn check_watch(w: &Watch, changes: &[Change], kept_from: Option<u64>, consistent_from: u64) -> Vec<Finding> {
    if matches!(w.end, WatchEnd::NotStarted(_)) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let (Some(at), Some(k)) = (expired_at(w), kept_from) {
        if at >= k {
            let why = vec![describe(w), format!("at revision {at}, kept from revision {k}")];
            out.push(("410 Gone for a revision still kept".to_owned(), why));
        }
    }
    out.extend(match w.start {
        WatchStart::From => check_from(w, changes),
        WatchStart::Latest | WatchStart::InitialEvents => check_initial(w, changes, consistent_from),
        WatchStart::Any => check_initial(w, changes, 0),
    });
    out
}

/// The revision a watch had reached when told 410, if it was and that is known. A watch from a revision stands
/// at least there; one opened with the state stands at least at the newest revision it was told (its snapshot's
/// own may be newer), and nowhere known before it was told one.
pub fn expired_at(w: &Watch) -> Option<u64> {
    let i = w.items.iter().position(|i| *i == WatchItem::Expired)?;
    let before = &w.items[..i];
    match w.start {
        WatchStart::From => Some(position(w.from, before)),
        _ => before.iter().filter_map(WatchItem::revision).max(),
    }
}

/// Where a watch stands after `items`: the newest revision delivered or bookmarked, or where it started.
fn position(from: u64, items: &[WatchItem]) -> u64 {
    items.iter().filter_map(WatchItem::revision).fold(from, u64::max)
}

fn check_from(w: &Watch, changes: &[Change]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut fail = |what: &str, lines: Vec<String>| out.push((what.to_owned(), [vec![describe(w)], lines].concat()));
    if told_410(w) {
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
                if !w.covers(key) {
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
    // Each change with the key's marker just before (None: it did not exist): Added or Modified, and what a
    // DELETED event must show.
    let mut before: HashMap<&str, Option<&str>> = HashMap::new();
    let mut by_rv: HashMap<(&str, u64), (&Change, Option<&str>)> = HashMap::new();
    for c in changes {
        let prev = before.insert(&c.key, c.marker.as_deref()).flatten();
        by_rv.insert((c.key.as_str(), c.resource_version), (c, prev));
    }
    // Reliability: exactly etcd's changes in the watch's scope from the start up to what was promised delivered.
    let upto = last_event.max(last_bookmark);
    let expected: Vec<&Change> = changes
        .iter()
        .filter(|c| c.resource_version > w.from && c.resource_version <= upto && w.covers(&c.key))
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
        let Some(&(c, prev)) = by_rv.get(&(key, rv)) else {
            fail("event of a change etcd never had", vec![item_line(i, &w.items[i])]);
            continue;
        };
        let right = match &w.items[i] {
            WatchItem::Added { seen, .. } => prev.is_none() && c.marker.as_deref() == Some(&seen.marker),
            WatchItem::Modified { seen, .. } => prev.is_some() && c.marker.as_deref() == Some(&seen.marker),
            WatchItem::Deleted { marker, .. } => {
                c.marker.is_none() && marker.as_deref().is_none_or(|m| prev == Some(m))
            }
            _ => true,
        };
        if !right {
            fail("event does not match etcd's change", vec![item_line(i, &w.items[i]), format!("etcd: {c:?}")]);
        }
    }
    out
}

/// A watch that opens with the state: its first items must be ADDED for exactly the objects of one revision R
/// (the initial-events-end bookmark's, with `sendInitialEvents`), R no older than `not_before`, and the rest
/// a watch from R.
fn check_initial(w: &Watch, changes: &[Change], not_before: u64) -> Vec<Finding> {
    let fail = |what: &str, lines: Vec<String>| vec![(what.to_owned(), [vec![describe(w)], lines].concat())];
    let mut scoped: Vec<&Change> = changes.iter().filter(|c| w.covers(&c.key)).collect();
    scoped.sort_by_key(|c| c.resource_version);
    let items = &w.items;
    if items.first() == Some(&WatchItem::Expired) {
        return fail("410 Gone for a watch that asked for no revision", Vec::new());
    }
    // With sendInitialEvents the end of the initial events is marked; a watch cut before it proves little.
    let marked = match w.start {
        WatchStart::InitialEvents => match items.iter().position(|i| matches!(i, WatchItem::Bookmark { .. })) {
            Some(k) => Some(k),
            None => return Vec::new(),
        },
        _ => None,
    };
    // Each span of revisions [lo, hi) over which the scope's snapshot stays the same, with that snapshot.
    let mut snapshot = Snapshot::new();
    let mut spans: Vec<(u64, u64, Snapshot)> = Vec::new();
    let mut lo = 0;
    let mut i = 0;
    while i <= scoped.len() {
        let hi = scoped.get(i).map_or(u64::MAX, |c| c.resource_version);
        if hi > lo || i == scoped.len() {
            spans.push((lo, hi, snapshot.clone()));
        }
        let Some(c) = scoped.get(i) else { break };
        match c.marker.as_deref() {
            Some(m) => snapshot.insert(&c.key, (c.resource_version, m)),
            None => snapshot.remove(c.key.as_str()),
        };
        lo = c.resource_version;
        i += 1;
    }
    let mut stale = None;
    let mut last_findings = None;
    for (lo, hi, snap) in &spans {
        let n = snap.len();
        if marked.is_some_and(|k| k != n) {
            continue;
        }
        let take = n.min(items.len());
        let first: Option<BTreeMap<&str, (u64, &str)>> = items[..take].iter().map(added).collect();
        let Some(first) = first.filter(|f| f.len() == take) else { continue };
        let whole = take == n;
        if !(if whole { first == *snap } else { first.iter().all(|(k, v)| snap.get(k) == Some(v)) }) {
            continue;
        }
        let r = match marked.map(|k| &items[k]) {
            Some(WatchItem::Bookmark { resource_version }) if (*lo..*hi).contains(resource_version) => {
                *resource_version
            }
            Some(_) => continue,
            None => (*lo).max(not_before),
        };
        if r < not_before || r >= *hi {
            stale = Some(format!(
                "the initial events are etcd's snapshot at revisions {lo}..{hi}; a consistent start must be at \
                 {not_before} or later"
            ));
            continue;
        }
        if !whole {
            return Vec::new();
        }
        let rest = Watch { from: r, items: items[n..].to_vec(), start: WatchStart::From, ..w.clone() };
        let findings = check_from(&rest, changes);
        if findings.is_empty() {
            return findings;
        }
        // An empty snapshot fits any watch; what the others found says more.
        if n > 0 || items.first().and_then(added).is_none() {
            last_findings = Some(findings);
        }
    }
    if let Some(f) = last_findings {
        return f;
    }
    if let Some(s) = stale {
        return fail("stale initial state", vec![s]);
    }
    let shown = items.iter().take(8).enumerate().map(|(i, item)| item_line(i, item)).collect();
    fail("initial events are not a snapshot etcd had", shown)
}

/// Key to (revision, marker).
type Snapshot<'h> = BTreeMap<&'h str, (u64, &'h str)>;

fn added(i: &WatchItem) -> Option<(&str, (u64, &str))> {
    match i {
        WatchItem::Added { key, seen } => Some((key.as_str(), (seen.resource_version, seen.marker.as_str()))),
        _ => None,
    }
}

/// Every informer resumes where it left off (or after a list), and ends at etcd's last change in its scope.
pub fn check_informers(history: &History) -> Vec<Finding> {
    let mut informers: BTreeMap<usize, Vec<&Watch>> = BTreeMap::new();
    for w in &history.watches {
        if let Some(i) = w.informer {
            informers.entry(i).or_default().push(w);
        }
    }
    let mut out = Vec::new();
    for (id, mut segments) in informers {
        segments.sort_by_key(|w| w.call);
        let mut at: Option<u64> = None;
        let mut lines = Vec::new();
        for w in &segments {
            match (at, w.after_list) {
                (Some(p), false) if w.from != p => out.push((
                    "informer did not resume where it left off".into(),
                    vec![describe(w), format!("the watch before it had reached revision {p}")],
                )),
                _ => {}
            }
            if at.is_none() && !w.after_list {
                out.push(("informer watched without a list first".into(), vec![describe(w)]));
            }
            let marked = w.items.iter().any(|i| matches!(i, WatchItem::Bookmark { .. }));
            at = match &w.end {
                // A resume that did not start is tried again from the same revision; a WatchList starts over.
                WatchEnd::NotStarted(_) if w.start == WatchStart::From => Some(w.from),
                WatchEnd::NotStarted(_) => None,
                WatchEnd::Expired => None,
                _ if w.start == WatchStart::InitialEvents && !marked => None,
                _ => Some(position(w.from, &w.items)),
            };
            lines.push(format!("{} ended {:?}", describe(w), w.end));
        }
        let scope = &segments[0].namespace;
        let last = history.changes.iter().filter(|c| segments[0].covers(&c.key)).map(|c| c.resource_version).max();
        if let Some(last) = last.filter(|&l| at.is_none_or(|a| a < l)) {
            let tail = lines.len().saturating_sub(3);
            out.push((
                format!("informer {id} did not reach etcd's last change"),
                [vec![format!("on {scope:?}: reached {at:?}, etcd's last change at {last}")], lines.split_off(tail)]
                    .concat(),
            ));
        }
    }
    out
}

/// Every watch of the run on its own (`kept` is [`kept_from`] of each); informers are [`check_informers`].
pub fn check(history: &History, bounds: &Bounds, kept: &[Option<u64>]) -> Vec<Finding> {
    history
        .watches
        .iter()
        .zip(kept)
        .flat_map(|(w, &k)| check_watch(w, &history.changes, k, bounds.acknowledged_before(w.call)))
        .collect()
}

/// The watch was refused with 410 Gone at its start.
pub fn told_410(w: &Watch) -> bool {
    w.items.first() == Some(&WatchItem::Expired)
}

/// The watch was told 410 Gone, at its start or later.
pub fn any_410(w: &Watch) -> bool {
    w.items.contains(&WatchItem::Expired)
}

/// For a watch told 410: a revision from which the cache that answered certainly still kept every change, when the
/// history tells.
pub fn kept_from(history: &History, bounds: &Bounds, w: &Watch) -> Option<u64> {
    expired_at(w)?;
    // A 410 in the middle of a stream may come from a cache that began again after the watch started (every
    // watcher of a reloading cache is told 410): not judged once any answering cache may have.
    let mid_stream = !told_410(w);
    let began_since =
        history.replica_starts.iter().any(|s| (s.route == w.route || w.route == AGGREGATOR) && s.at >= w.call);
    if mid_stream && began_since {
        return None;
    }
    kept_at(history, bounds, &w.route, w.call)
}

/// A revision from which the cache answering a call of `route` made at `at` certainly kept every change. A
/// replica's cache begins at the revision its process read the store at, before its first answer, so any write
/// that started after that answer has a later revision. Through the aggregator any replica may answer: the newest
/// of their floors.
pub fn kept_at(history: &History, bounds: &Bounds, route: &str, at: Time) -> Option<u64> {
    let mut routes: Vec<&str> = history.replica_starts.iter().map(|s| s.route.as_str()).collect();
    routes.sort_unstable();
    routes.dedup();
    if routes.contains(&route) {
        routes = vec![route];
    } else if route != AGGREGATOR {
        return None;
    }
    let floors: Option<Vec<u64>> = routes.into_iter().map(|r| cache_floor(history, bounds, r, at)).collect();
    floors?.into_iter().max()
}

/// An upper bound on where the cache that answered a call of `route` made at `at` begins: the newest floor of the
/// caches that served while the answer could come.
fn cache_floor(history: &History, bounds: &Bounds, route: &str, at: Time) -> Option<u64> {
    let mut starts: Vec<(Time, Time)> = history
        .replica_starts
        .iter()
        .filter(|s| s.route == route)
        .map(|s| (s.at, s.answers_from.unwrap_or(s.at)))
        .collect();
    starts.sort_unstable();
    starts.push((NEVER, NEVER));
    let floors: Option<Vec<u64>> = starts
        .windows(2)
        .filter(|life| life[0].0 <= at.saturating_add(ANSWER_WITHIN) && life[1].0 > at)
        .map(|life| process_floor(history, bounds, route, life[0].1..life[1].0))
        .collect();
    floors?.into_iter().max()
}

/// Where the cache that served from `life.start` (until `life.end`) begins, at the latest: the oldest write
/// started after its first answer.
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
        WatchItem::Deleted { key: key.into(), resource_version: rv, marker: Some("a2".into()) }
    }
    fn bookmark(rv: u64) -> WatchItem {
        WatchItem::Bookmark { resource_version: rv }
    }
    fn watch(from: u64, items: Vec<WatchItem>) -> Watch {
        Watch { client: 0, route: "r".into(), namespace: "ns".into(), from, call: 0, items, ..Default::default() }
    }
    fn found(w: Watch) -> Vec<String> {
        check_watch(&w, &changes(), Some(2), 0).into_iter().map(|f| f.0).collect()
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
        // A DELETED event shows the last state: ns/a's was a2.
        let wrong_last = WatchItem::Deleted { key: "ns/a".into(), resource_version: 6, marker: Some("a1".into()) };
        assert_eq!(found(watch(5, vec![wrong_last])), ["event does not match etcd's change"]);
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
        let found: Vec<String> = check_watch(&w, &changes, None, 0).into_iter().map(|f| f.0).collect();
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
        ReplicaStart { route: route.into(), at, answers_from: None }
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
        let findings = |h: &History, w: Watch| check_watch(&w, &[], kept(h, &w), 0).len();
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
        // The cache of replica 1 reloaded between 92 s and 95 s (etcd compacted past it): it may begin anywhere until
        // its first answer to a call made from 95 s, after which revision 30 was written.
        h.replica_starts.push(ReplicaStart { route: "replica 1".into(), at: 92 * S, answers_from: Some(95 * S) });
        h.operations
            .extend([get("replica 1", 93 * S, Response::NotFound), get("replica 1", 96 * S, Response::NotFound)]);
        h.operations.push(write(r0, 98 * S, 30));
        assert_eq!(kept(&h, &watch_at("replica 1", 90 * S, 8)), Some(30), "a call at 90 s may be answered after 92 s");
        assert_eq!(kept(&h, &watch_at("replica 1", 80 * S, 8)), Some(20));
        assert_eq!(kept(&h, &watch_at("replica 1", 100 * S, 8)), Some(30));
        // A 410 in the middle of a stream opened before a cache began again is not judged: the reload tells every
        // watcher 410.
        let mid = |route: &str, call| Watch {
            route: route.into(),
            call,
            ..watch(8, vec![modified("ns/a", 9, "m9"), WatchItem::Expired])
        };
        assert_eq!(kept(&h, &mid("replica 1", 91 * S)), None);
        assert_eq!(kept(&h, &mid(AGGREGATOR, 91 * S)), None);
        assert_eq!(kept(&h, &mid("replica 1", 100 * S)), Some(30));
        // A route the run did not start replicas for is not judged.
        assert_eq!(kept(&h, &watch_at("elsewhere", 90 * S, 8)), None);
    }

    fn opening(start: WatchStart, items: Vec<WatchItem>) -> Watch {
        Watch { start, ..watch(0, items) }
    }
    fn found_from(w: Watch, consistent_from: u64) -> Vec<String> {
        check_watch(&w, &changes(), None, consistent_from).into_iter().map(|f| f.0).collect()
    }

    #[test]
    fn a_watch_that_opens_with_the_state_opens_with_one_snapshot_etcd_had() {
        let state = || vec![added("ns/a", 2, "a1"), added("ns/b", 3, "b1")];
        let none: Vec<String> = Vec::new();
        // Unset and 0: the snapshot at 3 (or 4, which changed only another namespace), then what followed.
        for start in [WatchStart::Latest, WatchStart::Any] {
            let w = opening(start, [state(), vec![modified("ns/a", 5, "a2"), deleted("ns/a", 6)]].concat());
            assert_eq!(found_from(w, 3), none);
        }
        // Cut off during the initial events: a part of one snapshot is fine.
        assert_eq!(found_from(opening(WatchStart::Latest, vec![added("ns/b", 3, "b1")]), 3), none);
        // WatchList: the bookmark says at which revision.
        let marked =
            |rv| opening(WatchStart::InitialEvents, [state(), vec![bookmark(rv), modified("ns/a", 5, "a2")]].concat());
        assert_eq!(found_from(marked(4), 3), none);
        assert_eq!(found_from(marked(5), 3), ["initial events are not a snapshot etcd had"]);
        // A state no revision had, one with another content, one missing a key.
        let mixed = vec![added("ns/a", 5, "a2"), added("ns/a", 2, "a1"), added("ns/b", 3, "b1")];
        assert_eq!(found_from(opening(WatchStart::Any, mixed), 0), ["initial events are not a snapshot etcd had"]);
        // The snapshot at 5, then an older change.
        let late = vec![added("ns/a", 5, "a2"), added("ns/b", 3, "b1"), added("ns/a", 2, "a1")];
        assert_eq!(found_from(opening(WatchStart::Any, late), 0), ["event not after the start revision"]);
        let wrong = vec![added("ns/a", 2, "zz"), added("ns/b", 3, "b1"), bookmark(5)];
        assert_eq!(found_from(opening(WatchStart::Any, wrong), 0), ["initial events are not a snapshot etcd had"]);
        let missing = vec![added("ns/a", 2, "a1"), modified("ns/a", 5, "a2")];
        assert_eq!(found_from(opening(WatchStart::Any, missing), 0), ["gap: a change never delivered"]);
        // Unset must be a consistent read: not older than a write acknowledged before the call.
        let w = opening(WatchStart::Latest, [state(), vec![modified("ns/a", 5, "a2")]].concat());
        assert_eq!(found_from(w.clone(), 5), ["stale initial state"]);
        assert_eq!(found_from(Watch { start: WatchStart::Any, ..w }, 5), none);
        // A watch that never started is not judged.
        let w = Watch { end: WatchEnd::NotStarted("refused".into()), ..opening(WatchStart::Latest, Vec::new()) };
        assert_eq!(found_from(w, 5), none);
    }

    #[test]
    fn a_410_in_the_middle_of_a_stream_is_judged_at_the_revision_reached() {
        let w = watch(1, vec![added("ns/a", 2, "a1"), WatchItem::Expired]);
        assert_eq!(expired_at(&w), Some(2));
        let found = |kept| check_watch(&w, &changes(), Some(kept), 0).into_iter().map(|f| f.0).collect::<Vec<_>>();
        assert_eq!(found(3), Vec::<String>::new());
        assert_eq!(found(2), ["410 Gone for a revision still kept"]);
        // Opened with the state: judged at the newest revision it was told, once it was told one.
        for start in [WatchStart::Any, WatchStart::Latest] {
            let w = opening(start, vec![added("ns/a", 2, "a1"), added("ns/b", 3, "b1"), WatchItem::Expired]);
            assert_eq!(expired_at(&w), Some(3));
            let found = |kept| check_watch(&w, &changes(), Some(kept), 0).into_iter().map(|f| f.0).collect::<Vec<_>>();
            assert_eq!(found(4), Vec::<String>::new());
            assert_eq!(found(3), ["410 Gone for a revision still kept"]);
        }
        assert_eq!(expired_at(&opening(WatchStart::Any, vec![WatchItem::Expired])), None);
    }

    #[test]
    fn informers_resume_where_they_left_off_and_reach_the_last_change() {
        let segment = |from, after_list, items, end| Watch {
            informer: Some(0),
            after_list,
            end,
            call: from,
            ..watch(from, items)
        };
        let history = |segments: Vec<Watch>| History { watches: segments, changes: changes(), ..Default::default() };
        let found = |segments| check_informers(&history(segments)).into_iter().map(|f| f.0).collect::<Vec<_>>();
        let first = || segment(1, true, vec![added("ns/a", 2, "a1"), bookmark(4)], WatchEnd::Closed);
        let rest = |from| segment(from, false, vec![modified("ns/a", 5, "a2"), deleted("ns/a", 6)], WatchEnd::Stopped);
        assert_eq!(found(vec![first(), rest(4)]), Vec::<String>::new());
        assert_eq!(found(vec![first(), rest(3)]), ["informer did not resume where it left off"]);
        let short = segment(4, false, vec![modified("ns/a", 5, "a2")], WatchEnd::Stopped);
        assert_eq!(found(vec![first(), short]), ["informer 0 did not reach etcd's last change"]);
        // After 410 it must list again.
        let expired = segment(1, true, vec![added("ns/a", 2, "a1"), WatchItem::Expired], WatchEnd::Expired);
        assert_eq!(found(vec![expired.clone(), rest(2)]), ["informer watched without a list first"]);
        assert_eq!(found(vec![expired, Watch { after_list: true, ..rest(4) }]), Vec::<String>::new());
        // A resume that did not start is tried again from where it stood.
        let failed = segment(4, false, Vec::new(), WatchEnd::NotStarted("no answer".into()));
        assert_eq!(found(vec![first(), failed, rest(4)]), Vec::<String>::new());
        // A WatchList stands at its initial-events-end bookmark; cut before it, it must start over.
        let watch_list =
            |items, end| Watch { start: WatchStart::InitialEvents, from: 0, ..segment(0, true, items, end) };
        let listed = watch_list(vec![added("ns/a", 2, "a1"), added("ns/b", 3, "b1"), bookmark(4)], WatchEnd::Closed);
        assert_eq!(found(vec![listed.clone(), rest(4)]), Vec::<String>::new());
        let cut = watch_list(vec![added("ns/a", 2, "a1")], WatchEnd::Silent);
        assert_eq!(found(vec![cut.clone(), rest(2)]), ["informer watched without a list first"]);
        assert_eq!(found(vec![cut, Watch { call: 5, ..listed }, Watch { call: 6, ..rest(4) }]), Vec::<String>::new());
    }
}
