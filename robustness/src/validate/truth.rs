//! Checks against etcd's own record of every change (read back after the run) and across keys: no acknowledged
//! write lost, no resourceVersion naming two states, every read of a state etcd had at a revision the read may
//! see (`resourceVersion=""`: not older than any write acknowledged before the read started; `=N`: not older than
//! N; never newer than a write that started after the read ended), every list the exact snapshot of its revision.

use std::collections::{BTreeMap, HashMap};

use crate::model::history::{
    group_of, in_namespace, Change, History, Key, Operation, ReadFrom, Request, Response, Seen, Time, WatchItem,
};

/// Each key's states in revision order: (revision, marker, or None once deleted).
pub struct Timeline<'h> {
    keys: HashMap<&'h str, Vec<(u64, Option<&'h str>)>>,
}

impl<'h> Timeline<'h> {
    pub fn new(changes: &'h [Change]) -> Self {
        let mut keys: HashMap<&str, Vec<(u64, Option<&str>)>> = HashMap::new();
        for c in changes {
            keys.entry(&c.key).or_default().push((c.resource_version, c.marker.as_deref()));
        }
        for v in keys.values_mut() {
            v.sort_by_key(|(rv, _)| *rv);
        }
        Self { keys }
    }

    /// The key's marker at revision `at` (None: absent).
    pub fn at(&self, key: &str, at: u64) -> Option<&'h str> {
        let states = self.keys.get(key)?;
        let i = states.partition_point(|(rv, _)| *rv <= at);
        i.checked_sub(1).and_then(|i| states[i].1)
    }

    /// The revisions `[from, until)` at which the key was in the state read (`None`: absent); empty if never.
    fn spans(&self, key: &str, read: Option<&Seen>) -> Vec<(u64, u64)> {
        let empty = Vec::new();
        let states = self.keys.get(key).unwrap_or(&empty);
        let until = |i: usize| states.get(i + 1).map_or(u64::MAX, |(rv, _)| *rv);
        match read {
            Some(s) => states
                .iter()
                .position(|(rv, m)| *rv == s.resource_version && *m == Some(s.marker.as_str()))
                .map(|i| vec![(s.resource_version, until(i))])
                .unwrap_or_default(),
            None => {
                let mut spans = vec![(0, states.first().map_or(u64::MAX, |(rv, _)| *rv))];
                for (i, (rv, m)) in states.iter().enumerate() {
                    if m.is_none() {
                        spans.push((*rv, until(i)));
                    }
                }
                spans
            }
        }
    }

    /// The snapshot of a namespace (`""`: all), or of one group of it, at `at`.
    fn snapshot(&self, namespace: &str, group: Option<&str>, at: u64) -> BTreeMap<&'h str, (u64, &'h str)> {
        let mut out = BTreeMap::new();
        for (key, states) in &self.keys {
            if !in_namespace(namespace, key) || group.is_some_and(|g| group_of(key) != g) {
                continue;
            }
            let i = states.partition_point(|(rv, _)| *rv <= at);
            if let Some(&(rv, Some(m))) = i.checked_sub(1).map(|i| &states[i]) {
                out.insert(*key, (rv, m));
            }
        }
        out
    }
}

/// Revision bounds from real time: the newest acknowledged write before a moment, the oldest write that started
/// after one.
pub struct Bounds {
    /// (answered at, revision), by answer time, with the running maximum revision.
    acked: Vec<(Time, u64)>,
    /// (started at, revision), by start time, with the minimum revision from there on.
    started: Vec<(Time, u64)>,
}

impl Bounds {
    pub fn new(ops: &[Operation]) -> Self {
        let mut acked: Vec<(Time, u64)> = ops.iter().filter_map(|o| Some((o.ret, o.written_revision()?))).collect();
        acked.sort_unstable();
        for i in 1..acked.len() {
            acked[i].1 = acked[i].1.max(acked[i - 1].1);
        }
        let mut started: Vec<(Time, u64)> = ops.iter().filter_map(|o| Some((o.call, o.written_revision()?))).collect();
        started.sort_unstable();
        for i in (0..started.len().saturating_sub(1)).rev() {
            started[i].1 = started[i].1.min(started[i + 1].1);
        }
        Self { acked, started }
    }

    /// Every write acknowledged before `t` has a revision at or below this.
    pub fn acknowledged_before(&self, t: Time) -> u64 {
        let i = self.acked.partition_point(|(ret, _)| *ret < t);
        i.checked_sub(1).map_or(0, |i| self.acked[i].1)
    }

    /// Every write started after `t` has a revision at or above this.
    pub fn started_after(&self, t: Time) -> u64 {
        let i = self.started.partition_point(|(call, _)| *call <= t);
        self.started.get(i).map_or(u64::MAX, |(_, rv)| *rv)
    }
}

/// One finding: which call, and why.
pub type Finding = (String, Vec<String>);

/// Every observation of a resourceVersion names one state: (key, marker) or (key, deleted).
pub fn check_resource_versions(history: &History) -> Vec<Finding> {
    let mut named: HashMap<u64, (String, Option<String>, String)> = HashMap::new();
    let mut out = Vec::new();
    let mut see = |rv: u64, key: &str, marker: Option<&str>, by: String| {
        let this = (key.to_owned(), marker.map(String::from), by.clone());
        match named.get(&rv) {
            None => drop(named.insert(rv, this)),
            Some((k, m, first)) if k != key || m.as_deref() != marker => out.push((
                format!("resourceVersion {rv} names two states"),
                vec![format!("{k} {m:?} in {first}"), format!("{key} {marker:?} in {by}")],
            )),
            Some(_) => {}
        }
    };
    for op in &history.operations {
        let key = op.request.key().unwrap_or_default();
        match &op.response {
            // A Scale shows no marker.
            Response::Object(_) if matches!(op.request, Request::Scale { .. }) => {}
            Response::Object(s) => see(s.resource_version, key, Some(&s.marker), op.to_string()),
            Response::Deleted { resource_version } => see(*resource_version, key, None, op.to_string()),
            Response::List { items, .. } => {
                for (k, s) in items {
                    see(s.resource_version, k, Some(&s.marker), op.to_string());
                }
            }
            _ => {}
        }
    }
    for w in &history.watches {
        let by = format!("watch of client {} via {} from {}", w.client, w.route, w.from);
        for item in &w.items {
            match item {
                WatchItem::Added { key, seen } | WatchItem::Modified { key, seen } => {
                    see(seen.resource_version, key, Some(&seen.marker), by.clone())
                }
                WatchItem::Deleted { key, resource_version, .. } => see(*resource_version, key, None, by.clone()),
                _ => {}
            }
        }
    }
    out
}

/// Acknowledged writes against etcd's record: each is there, at its revision, with its content.
pub fn check_acknowledged_writes(history: &History, timeline: &Timeline<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for op in &history.operations {
        let Some(key) = op.request.key() else { continue };
        // The marker etcd must have at the revision; a Scale's answer does not say, only that the object is there.
        let (rv, want) = match (&op.request, &op.response) {
            (Request::Scale { .. }, Response::Object(s)) => (s.resource_version, None),
            (r, Response::Object(s)) if r.is_write() => (s.resource_version, Some(Some(s.marker.as_str()))),
            (Request::Delete { .. }, Response::Deleted { resource_version }) => (*resource_version, Some(None)),
            _ => continue,
        };
        let there = timeline.keys.get(key).and_then(|s| s.iter().find(|(r, _)| *r == rv));
        let right = match (there, want) {
            (Some((_, m)), Some(want)) => *m == want,
            (Some((_, m)), None) => m.is_some(),
            (None, _) => false,
        };
        if !right {
            let found = match there {
                Some((_, m)) => format!("etcd has {m:?} at revision {rv}"),
                None => format!("etcd has no change of {key} at revision {rv}"),
            };
            out.push(("acknowledged write lost".into(), vec![op.to_string(), found]));
        }
    }
    out
}

/// Every change in etcd's record made by exactly one call: a write acknowledged at that revision or never
/// answered (its marker names it), a status write of the controller (which keeps the marker the key had), or a
/// delete acknowledged at that revision, acknowledged without one, or never answered. So a write refused with a
/// 4xx that nevertheless changed the store, a write applied twice, and a change nobody asked for are all found.
pub fn check_changes_explained(history: &History) -> Vec<Finding> {
    let mut writes: HashMap<&str, &Operation> = HashMap::new();
    // Deletes of each key that may have made a deletion whose revision they do not say: unanswered, or
    // acknowledged with a Status.
    let mut open_deletes: HashMap<&str, Vec<&Operation>> = HashMap::new();
    let mut exact_deletes: HashMap<(&str, u64), &Operation> = HashMap::new();
    for op in &history.operations {
        match (&op.request, &op.response) {
            (Request::Delete { key, .. }, Response::Deleted { resource_version }) => {
                exact_deletes.insert((key, *resource_version), op);
            }
            (Request::Delete { key, .. }, Response::Lost | Response::Gone) => {
                open_deletes.entry(key).or_default().push(op)
            }
            (r, _) => {
                if let Some(m) = r.marker() {
                    writes.insert(m, op);
                }
            }
        }
    }
    let mut changes: Vec<&Change> = history.changes.iter().collect();
    changes.sort_by_key(|c| c.resource_version);
    let mut state: HashMap<&str, Option<&str>> = HashMap::new();
    let mut made: HashMap<&str, u64> = HashMap::new();
    let mut out = Vec::new();
    for c in changes {
        let before = state.insert(&c.key, c.marker.as_deref()).flatten();
        let at = format!("etcd: {} at revision {} -> {:?}", c.key, c.resource_version, c.marker);
        let Some(marker) = c.marker.as_deref() else {
            if exact_deletes.contains_key(&(c.key.as_str(), c.resource_version)) {
                continue;
            }
            match open_deletes.get_mut(c.key.as_str()).and_then(|d| d.pop()) {
                Some(_) => {}
                None => {
                    let refused: Vec<String> = history
                        .operations
                        .iter()
                        .filter(|o| matches!(&o.request, Request::Delete { key, .. } if *key == c.key))
                        .map(|o| o.to_string())
                        .collect();
                    out.push(("a deletion no call explains".into(), [vec![at], refused].concat()));
                }
            }
            continue;
        };
        if before == Some(marker) {
            // A status write: the controller keeps the content, and so the marker, it found.
            continue;
        }
        if let Some(first) = made.insert(marker, c.resource_version) {
            let mut lines = vec![at, format!("the same write already made revision {first}")];
            lines.extend(writes.get(marker).map(|o| o.to_string()));
            out.push(("a write applied twice".into(), lines));
            continue;
        }
        match writes.get(marker).map(|o| (o, &o.response)) {
            None => out.push(("a change no call made".into(), vec![at])),
            Some((_, Response::Lost)) => {}
            Some((_, Response::Object(s))) if s.resource_version == c.resource_version => {}
            Some((o, Response::Object(s))) => out.push((
                "a write acknowledged at another revision than it made".into(),
                vec![o.to_string(), at, format!("acknowledged at revision {}", s.resource_version)],
            )),
            Some((o, _)) => out.push(("a refused write changed the store".into(), vec![o.to_string(), at])),
        }
    }
    out
}

/// Every read against the revisions it may have been served at.
pub fn check_reads(history: &History, timeline: &Timeline<'_>, bounds: &Bounds) -> Vec<Finding> {
    let mut out = Vec::new();
    for op in &history.operations {
        let from = match &op.request {
            Request::Get { from, .. } | Request::List { from, .. } => *from,
            _ => continue,
        };
        // The oldest revision the read may show, and the first it may not.
        let (lo, why) = match from {
            ReadFrom::Latest => (bounds.acknowledged_before(op.call), "acknowledged before the read started"),
            ReadFrom::AtLeast(n) | ReadFrom::Exact(n) => (n, "asked for as resourceVersion"),
            ReadFrom::Any => (0, ""),
        };
        let hi = bounds.started_after(op.ret);
        match (&op.request, &op.response) {
            (Request::Get { key, .. }, r @ (Response::Object(_) | Response::NotFound)) => {
                let read = if let Response::Object(s) = r { Some(s) } else { None };
                let spans = timeline.spans(key, read);
                if spans.is_empty() {
                    out.push(("read of a state etcd never had".into(), vec![op.to_string()]));
                } else if !spans.iter().any(|&(a, b)| b > lo && a < hi) {
                    let what = if spans.iter().any(|&(_, b)| b > lo) { "read from the future" } else { "stale read" };
                    let detail = format!(
                        "the state read held at revisions {spans:?}; the read must show revision {lo} ({why}) or \
                         later, and nothing from revision {hi} on (writes started after it ended)"
                    );
                    out.push((what.into(), vec![op.to_string(), detail]));
                }
            }
            (Request::List { namespace, group, .. }, Response::List { resource_version: at, items }) => {
                let want = timeline.snapshot(namespace, group.as_deref(), *at);
                let got: BTreeMap<&str, (u64, &str)> =
                    items.iter().map(|(k, s)| (k.as_str(), (s.resource_version, s.marker.as_str()))).collect();
                if matches!(from, ReadFrom::Exact(n) if n != *at) {
                    out.push(("list not at the exact revision asked for".into(), vec![op.to_string()]));
                } else if want != got {
                    let differ: Vec<String> = want
                        .keys()
                        .chain(got.keys())
                        .filter(|k| want.get(*k) != got.get(*k))
                        .map(|k| format!("{k}: etcd at {at} has {:?}, the list {:?}", want.get(k), got.get(k)))
                        .collect();
                    out.push((
                        "list is not the snapshot of its revision".into(),
                        [vec![op.to_string()], differ].concat(),
                    ));
                } else if *at < lo || *at >= hi {
                    let detail = format!("listed at revision {at}; must be {lo} ({why}) or later and before {hi}");
                    out.push(("stale list".into(), vec![op.to_string(), detail]));
                }
            }
            _ => {}
        }
    }
    out
}

/// Every 410 a read was told: only for a revision asked for exactly (or a continue token's), older than the
/// answering cache's floor; `kept` is [`super::watch::kept_at`].
pub fn check_expired_reads(history: &History, kept: impl Fn(&Operation) -> Option<u64>) -> Vec<Finding> {
    let mut out = Vec::new();
    for op in &history.operations {
        let Response::Expired { revision, continued } = op.response else { continue };
        let exact = matches!(&op.request, Request::List { from: ReadFrom::Exact(_), .. });
        if !continued && !exact {
            out.push(("410 Gone for a read that may take any newer revision".into(), vec![op.to_string()]));
        } else if let Some(k) = kept(op).filter(|&k| revision >= k) {
            out.push((
                "410 Gone for a revision still kept".into(),
                vec![op.to_string(), format!("revision {revision}, kept from revision {k}")],
            ));
        }
    }
    out
}

/// The set of keys in the record, for the report.
pub fn keys(history: &History) -> Vec<Key> {
    let mut keys: Vec<Key> = history.changes.iter().map(|c| c.key.clone()).collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::NEVER;

    fn change(rv: u64, key: &str, marker: Option<&str>) -> Change {
        Change { resource_version: rv, key: key.into(), marker: marker.map(String::from) }
    }
    fn op(call: Time, ret: Time, request: Request, response: Response) -> Operation {
        Operation { client: 0, route: "r".into(), call, ret, request, response }
    }
    fn seen(rv: u64, m: &str) -> Seen {
        Seen { resource_version: rv, marker: m.into() }
    }
    fn write(key: &str, m: &str, call: Time, ret: Time, rv: u64) -> Operation {
        op(call, ret, Request::Apply { key: key.into(), marker: m.into() }, Response::Object(seen(rv, m)))
    }
    fn get(key: &str, from: ReadFrom, call: Time, ret: Time, r: Response) -> Operation {
        op(call, ret, Request::Get { key: key.into(), from }, r)
    }

    fn changes() -> Vec<Change> {
        vec![
            change(2, "ns/a", Some("a1")),
            change(3, "ns/b", Some("b1")),
            change(5, "ns/a", Some("a2")),
            change(6, "ns/a", None),
        ]
    }

    #[test]
    fn reads_at_a_revision_they_may_see_pass() {
        let changes = changes();
        let t = Timeline::new(&changes);
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                write("ns/b", "b1", 11, 20, 3),
                write("ns/a", "a2", 21, 30, 5),
                get("ns/a", ReadFrom::Latest, 31, 40, Response::Object(seen(5, "a2"))),
                // Any revision will do for "0", one not older than 2 for "2".
                get("ns/a", ReadFrom::Any, 31, 40, Response::Object(seen(2, "a1"))),
                get("ns/a", ReadFrom::AtLeast(2), 31, 40, Response::Object(seen(2, "a1"))),
                op(
                    41,
                    50,
                    Request::Delete { key: "ns/a".into(), precondition: None },
                    Response::Deleted { resource_version: 6 },
                ),
                get("ns/a", ReadFrom::Latest, 51, 60, Response::NotFound),
                op(
                    51,
                    60,
                    Request::List { namespace: "ns".into(), from: ReadFrom::Latest, group: None },
                    Response::List { resource_version: 7, items: vec![("ns/b".into(), seen(3, "b1"))] },
                ),
            ],
            changes: changes.clone(),
            ..Default::default()
        };
        assert_eq!(check_reads(&history, &t, &Bounds::new(&history.operations)), Vec::<Finding>::new());
        assert_eq!(check_acknowledged_writes(&history, &t), Vec::<Finding>::new());
        assert_eq!(check_resource_versions(&history), Vec::<Finding>::new());
    }

    #[test]
    fn a_stale_read_is_found_even_across_keys() {
        let changes = changes();
        let t = Timeline::new(&changes);
        // a2 (revision 5) was acknowledged before the reads started.
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                write("ns/a", "a2", 21, 30, 5),
                get("ns/a", ReadFrom::Latest, 31, 40, Response::Object(seen(2, "a1"))),
                get("ns/a", ReadFrom::AtLeast(5), 31, 40, Response::Object(seen(2, "a1"))),
                // Lists at a revision before an acknowledged write are stale too.
                op(
                    31,
                    40,
                    Request::List { namespace: "ns".into(), from: ReadFrom::Latest, group: None },
                    Response::List {
                        resource_version: 3,
                        items: vec![("ns/a".into(), seen(2, "a1")), ("ns/b".into(), seen(3, "b1"))],
                    },
                ),
            ],
            changes: changes.clone(),
            ..Default::default()
        };
        let found: Vec<String> =
            check_reads(&history, &t, &Bounds::new(&history.operations)).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["stale read", "stale read", "stale list"]);
    }

    #[test]
    fn a_read_from_the_future_and_a_wrong_snapshot_are_found() {
        let changes = changes();
        let t = Timeline::new(&changes);
        let history = History {
            operations: vec![
                get("ns/a", ReadFrom::Any, 0, 1, Response::Object(seen(5, "a2"))),
                write("ns/a", "a2", 2, 3, 5),
                op(
                    10,
                    20,
                    Request::List { namespace: "ns".into(), from: ReadFrom::Any, group: None },
                    Response::List { resource_version: 5, items: vec![("ns/a".into(), seen(5, "a2"))] },
                ),
                get("ns/b", ReadFrom::Any, 0, NEVER, Response::Object(seen(4, "b1"))),
            ],
            changes: changes.clone(),
            ..Default::default()
        };
        let found: Vec<String> =
            check_reads(&history, &t, &Bounds::new(&history.operations)).into_iter().map(|f| f.0).collect();
        assert_eq!(
            found,
            ["read from the future", "list is not the snapshot of its revision", "read of a state etcd never had"]
        );
    }

    fn delete(key: &str, call: Time, ret: Time, response: Response) -> Operation {
        op(call, ret, Request::Delete { key: key.into(), precondition: None }, response)
    }

    #[test]
    fn every_change_is_explained_by_one_call_or_the_controller() {
        let changes = vec![
            change(2, "ns/a", Some("a1")),
            change(3, "ns/a", Some("a1")), // the controller's status write
            change(4, "ns/b", Some("b1")), // a write that got no answer
            change(5, "ns/a", None),       // a delete answered with a Status
            change(6, "ns/b", None),       // a delete answered with the object
        ];
        let lost = |k: &str, m: &str| op(0, NEVER, Request::Create { key: k.into(), marker: m.into() }, Response::Lost);
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                lost("ns/b", "b1"),
                delete("ns/a", 11, 20, Response::Gone),
                delete("ns/b", 11, 20, Response::Deleted { resource_version: 6 }),
                // Refused, and nothing in the record: fine.
                op(0, 5, Request::Create { key: "ns/c".into(), marker: "c1".into() }, Response::AlreadyExists),
                delete("ns/c", 0, 5, Response::NotFound),
            ],
            changes,
            ..Default::default()
        };
        assert_eq!(check_changes_explained(&history), Vec::<Finding>::new());
    }

    #[test]
    fn a_refused_write_that_changed_the_store_and_a_write_applied_twice_are_found() {
        let changes = vec![
            change(2, "ns/a", Some("a1")),
            change(3, "ns/a", Some("a2")),
            change(4, "ns/a", Some("a1")), // a1 again, after a2
            change(5, "ns/b", Some("b1")), // answered 409
            change(6, "ns/c", Some("zz")), // no call wrote zz
            change(7, "ns/b", None),       // no delete of ns/b was made
            change(8, "ns/a", Some("a3")), // acknowledged at 9
        ];
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                write("ns/a", "a2", 0, 10, 3),
                op(
                    0,
                    5,
                    Request::Update { key: "ns/b".into(), marker: "b1".into(), precondition: Some(1) },
                    Response::Conflict,
                ),
                write("ns/a", "a3", 0, 10, 9),
            ],
            changes,
            ..Default::default()
        };
        let found: Vec<String> = check_changes_explained(&history).into_iter().map(|f| f.0).collect();
        assert_eq!(
            found,
            [
                "a write applied twice",
                "a refused write changed the store",
                "a change no call made",
                "a deletion no call explains",
                "a write acknowledged at another revision than it made"
            ]
        );
    }

    #[test]
    fn a_lost_acknowledged_write_and_a_reused_resource_version_are_found() {
        let changes = changes();
        let t = Timeline::new(&changes);
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                write("ns/c", "c1", 0, 10, 4),
                write("ns/b", "b9", 0, 10, 3),
            ],
            changes: changes.clone(),
            ..Default::default()
        };
        let found: Vec<String> = check_acknowledged_writes(&history, &t).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["acknowledged write lost", "acknowledged write lost"]);
        let history = History {
            operations: vec![
                write("ns/a", "a1", 0, 10, 2),
                get("ns/b", ReadFrom::Latest, 11, 12, Response::Object(seen(2, "b1"))),
            ],
            ..Default::default()
        };
        let found: Vec<String> = check_resource_versions(&history).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["resourceVersion 2 names two states"]);
    }

    #[test]
    fn a_write_of_scale_must_be_in_the_record_whatever_its_marker() {
        let changes = changes();
        let t = Timeline::new(&changes);
        let scale = |rv| {
            let request = Request::Scale { key: "ns/a".into(), replicas: 1, precondition: None };
            op(0, 10, request, Response::Object(seen(rv, "")))
        };
        // ns/a has a state at revision 2 (whatever its marker); nothing at 3 (ns/b's) or 9.
        let history = History { operations: vec![scale(2), scale(3), scale(9)], ..Default::default() };
        let found: Vec<String> = check_acknowledged_writes(&history, &t).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["acknowledged write lost", "acknowledged write lost"]);
        // Its empty marker names no state.
        assert_eq!(check_resource_versions(&history), Vec::new());
    }

    #[test]
    fn a_410_is_only_for_a_revision_asked_for_exactly_that_the_cache_no_longer_keeps() {
        let list = |from, response| op(0, 10, Request::List { namespace: "ns".into(), from, group: None }, response);
        let expired = |revision, continued| Response::Expired { revision, continued };
        let history = History {
            operations: vec![
                list(ReadFrom::Exact(3), expired(3, false)),
                list(ReadFrom::Exact(5), expired(5, false)),
                list(ReadFrom::Latest, expired(4, true)),
                list(ReadFrom::AtLeast(2), expired(2, false)),
                list(ReadFrom::Latest, expired(0, false)),
            ],
            ..Default::default()
        };
        // The cache kept everything from revision 4 on.
        let found: Vec<String> = check_expired_reads(&history, |_| Some(4)).into_iter().map(|f| f.0).collect();
        assert_eq!(
            found,
            [
                "410 Gone for a revision still kept",
                "410 Gone for a revision still kept",
                "410 Gone for a read that may take any newer revision",
                "410 Gone for a read that may take any newer revision"
            ]
        );
        // Where the cache began is not known: only the reads that may never be told 410.
        assert_eq!(check_expired_reads(&history, |_| None).len(), 2);
    }

    #[test]
    fn an_exact_list_is_the_snapshot_of_that_revision() {
        let changes = changes();
        let t = Timeline::new(&changes);
        let b = Bounds::new(&[]);
        let exact = |n, at, items| {
            let request = Request::List { namespace: "ns".into(), from: ReadFrom::Exact(n), group: None };
            op(0, 10, request, Response::List { resource_version: at, items })
        };
        let at_3 = || vec![("ns/a".to_owned(), seen(2, "a1")), ("ns/b".to_owned(), seen(3, "b1"))];
        let history = History { operations: vec![exact(3, 3, at_3())], ..Default::default() };
        assert_eq!(check_reads(&history, &t, &b), Vec::new());
        let history = History { operations: vec![exact(2, 3, at_3())], ..Default::default() };
        let found: Vec<String> = check_reads(&history, &t, &b).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["list not at the exact revision asked for"]);
    }
}
