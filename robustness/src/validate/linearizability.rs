//! Linearizability of each PodSet as a register whose version is its resourceVersion (Wing & Gong's search with
//! porcupine's memo of visited (linearized set, state) pairs). Operations on different keys commute, so each key is
//! checked alone (P-compositionality). Creates, conditional updates and deletes are compare-and-swaps; patches and
//! applies are writes; `resourceVersion=""` gets and lists are reads. A call whose answer was lost may be left out
//! or placed anywhere after its start; writes found in etcd that no client made (the controller's status) must be
//! placed, anywhere, where the version they replaced is current.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::model::history::{
    group_of, in_namespace, Change, History, Key, ReadFrom, Request, Response, Seen, Time, NEVER,
};

/// The marker of an answer that does not show one (a Scale): any marker the key has.
const ANY_MARKER: u32 = u32::MAX;

/// Where a checked operation came from: a client's call (its index) or a change in etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Call(usize),
    Change(usize),
}

/// A key's state: absent, or present with its resourceVersion (0 when a lost write made it and nothing read it
/// since) and its marker (interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum State {
    Absent,
    Present { rv: u64, marker: u32 },
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Seen {
        rv: u64,
        marker: u32,
    },
    Deleted {
        rv: u64,
    },
    /// Deleted, at a revision the answer does not say.
    Gone,
    NotFound,
    AlreadyExists,
    Conflict,
    Lost,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Create {
        marker: u32,
        out: Out,
    },
    Update {
        marker: u32,
        precondition: Option<u64>,
        out: Out,
    },
    Patch {
        marker: u32,
        out: Out,
    },
    Apply {
        marker: u32,
        out: Out,
    },
    Delete {
        precondition: Option<u64>,
        out: Out,
    },
    /// A write of `/scale` or `/status`: a new revision, the marker kept.
    Touch {
        precondition: Option<u64>,
        out: Out,
    },
    Read {
        out: Out,
    },
    /// A change no client made: from `prev` (None: absent) to `rv` with `marker` (None: deleted).
    External {
        rv: u64,
        prev: Option<u64>,
        marker: Option<u32>,
    },
}

#[derive(Debug, Clone, Copy)]
struct KeyOp {
    origin: Origin,
    call: Time,
    ret: Time,
    step: Step,
    /// A change of etcd's not yet known to have happened at the cut of a prefix: it may be left out.
    pending: bool,
}

impl KeyOp {
    /// Lost calls may be left out; everything else must be placed.
    fn required(&self) -> bool {
        !self.pending
            && !matches!(
                self.step,
                Step::Create { out: Out::Lost, .. }
                    | Step::Update { out: Out::Lost, .. }
                    | Step::Patch { out: Out::Lost, .. }
                    | Step::Apply { out: Out::Lost, .. }
                    | Step::Delete { out: Out::Lost, .. }
                    | Step::Touch { out: Out::Lost, .. }
            )
    }

    /// Removing it cannot turn a linearizable history into one that is not: it changes no state.
    fn changes_nothing(&self) -> bool {
        match self.step {
            Step::Read { .. } => true,
            Step::External { .. } => false,
            Step::Create { out, .. }
            | Step::Update { out, .. }
            | Step::Patch { out, .. }
            | Step::Apply { out, .. }
            | Step::Delete { out, .. }
            | Step::Touch { out, .. } => matches!(out, Out::NotFound | Out::AlreadyExists | Out::Conflict),
        }
    }
}

fn matches_pre(rv: u64, precondition: Option<u64>) -> bool {
    precondition.is_none_or(|p| rv == 0 || rv == p)
}

/// A key's resourceVersion only grows.
fn newer(current: u64, next: u64) -> bool {
    current == 0 || next > current
}

/// The sequential specification: the state after `step` from `state`, or None if it cannot happen there.
fn apply(state: State, step: Step) -> Option<State> {
    use State::*;
    let seen = |rv, marker| Some(Present { rv, marker });
    match (step, state) {
        (Step::Create { out: Out::Seen { rv, marker }, .. }, Absent) => seen(rv, marker),
        (Step::Create { out: Out::AlreadyExists, .. }, Present { .. }) => Some(state),
        (Step::Create { marker, out: Out::Lost }, Absent) => seen(0, marker),

        (Step::Update { precondition, out: Out::Seen { rv, marker }, .. }, Present { rv: cur, .. })
            if matches_pre(cur, precondition) && newer(cur, rv) =>
        {
            seen(rv, marker)
        }
        (Step::Update { precondition: Some(p), out: Out::Conflict, .. }, Present { rv, .. }) if rv == 0 || rv != p => {
            Some(state)
        }
        (Step::Update { marker, precondition, out: Out::Lost }, Present { rv, .. })
            if matches_pre(rv, precondition) =>
        {
            seen(0, marker)
        }

        (Step::Patch { out: Out::Seen { rv, marker }, .. }, Present { rv: cur, .. }) if newer(cur, rv) => {
            seen(rv, marker)
        }
        (Step::Patch { marker, out: Out::Lost }, Present { .. }) => seen(0, marker),

        (Step::Apply { out: Out::Seen { rv, marker }, .. }, Absent) => seen(rv, marker),
        (Step::Apply { out: Out::Seen { rv, marker }, .. }, Present { rv: cur, .. }) if newer(cur, rv) => {
            seen(rv, marker)
        }
        (Step::Apply { marker, out: Out::Lost }, _) => seen(0, marker),

        (Step::Delete { precondition, out: Out::Deleted { rv } }, Present { rv: cur, .. })
            if matches_pre(cur, precondition) && newer(cur, rv) =>
        {
            Some(Absent)
        }
        (Step::Delete { precondition, out: Out::Gone | Out::Lost }, Present { rv, .. })
            if matches_pre(rv, precondition) =>
        {
            Some(Absent)
        }
        (Step::Delete { precondition: Some(p), out: Out::Conflict }, Present { rv, .. }) if rv == 0 || rv != p => {
            Some(state)
        }
        (Step::Touch { precondition, out: Out::Seen { rv, marker } }, Present { rv: cur, marker: m })
            if matches_pre(cur, precondition) && newer(cur, rv) && (marker == ANY_MARKER || marker == m) =>
        {
            seen(rv, m)
        }
        (Step::Touch { precondition, out: Out::Lost }, Present { rv, marker }) if matches_pre(rv, precondition) => {
            seen(0, marker)
        }
        (Step::Touch { precondition: Some(p), out: Out::Conflict }, Present { rv, .. }) if rv == 0 || rv != p => {
            Some(state)
        }
        (Step::Read { out: Out::Seen { rv, marker } }, Present { rv: cur, marker: m })
            if m == marker && (cur == 0 || cur == rv) =>
        {
            seen(rv, marker)
        }

        (Step::Update { out: Out::NotFound, .. }, Absent)
        | (Step::Patch { out: Out::NotFound, .. }, Absent)
        | (Step::Delete { out: Out::NotFound, .. }, Absent)
        | (Step::Touch { out: Out::NotFound, .. }, Absent)
        | (Step::Read { out: Out::NotFound }, Absent) => Some(Absent),

        (Step::External { rv, prev: None, marker: Some(m) }, Absent) => seen(rv, m),
        (Step::External { rv, prev: Some(p), marker }, Present { rv: cur, .. }) if cur == 0 || cur == p => {
            Some(marker.map_or(Absent, |m| Present { rv, marker: m }))
        }
        _ => None,
    }
}

/// The verdict on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// The search gave up (too many states); neither proven nor refuted.
    Unknown,
    /// Not linearizable: the call whose answer cannot be placed, and the smallest failing piece found (calls and
    /// changes) in answer order (calls without an answer where they started).
    Violation {
        culprit: Option<Origin>,
        piece: Vec<Origin>,
    },
}

/// A key's operations, ready to search.
struct KeyHistory {
    ops: Vec<KeyOp>,
    initial: State,
}

const MAX_STATES: usize = 2_000_000;
const MINIMISE_TRIES: usize = 60;

impl KeyHistory {
    /// Wing & Gong: place, one at a time, any call that no unplaced call returned before; backtrack when none
    /// fits. `None` when the search gave up.
    fn linearizable(&self) -> Option<bool> {
        let ops = &self.ops;
        let n = ops.len();
        let required = ops.iter().filter(|o| o.required()).count();
        let mut placed = vec![0u64; n.div_ceil(64)];
        let is_placed = |placed: &[u64], i: usize| placed[i / 64] & (1 << (i % 64)) != 0;
        // The answers of unplaced calls: the earliest is the horizon nothing that started after it may cross.
        let mut pending: BTreeSet<(Time, usize)> = ops.iter().enumerate().map(|(i, o)| (o.ret, i)).collect();
        let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
        let mut stack: Vec<(usize, State)> = Vec::new();
        let mut state = self.initial;
        let mut placed_required = 0;
        let mut from = 0;
        loop {
            if placed_required == required {
                return Some(true);
            }
            let horizon = pending.first().map_or(NEVER, |&(t, _)| t);
            let mut next = None;
            for i in from..n {
                if ops[i].call > horizon {
                    break;
                }
                if is_placed(&placed, i) {
                    continue;
                }
                if let Some(after) = apply(state, ops[i].step) {
                    placed[i / 64] |= 1 << (i % 64);
                    if seen.insert((placed.clone(), after)) {
                        next = Some((i, after));
                        break;
                    }
                    placed[i / 64] &= !(1 << (i % 64));
                }
            }
            match next {
                Some((i, after)) => {
                    stack.push((i, state));
                    pending.remove(&(ops[i].ret, i));
                    state = after;
                    placed_required += usize::from(ops[i].required());
                    from = 0;
                    if seen.len() > MAX_STATES {
                        return None;
                    }
                }
                None => {
                    let Some((i, before)) = stack.pop() else { return Some(false) };
                    placed[i / 64] &= !(1 << (i % 64));
                    pending.insert((ops[i].ret, i));
                    placed_required -= usize::from(ops[i].required());
                    state = before;
                    from = i + 1;
                }
            }
        }
    }

    fn with(&self, ops: Vec<KeyOp>) -> Self {
        Self { ops, initial: self.initial }
    }

    /// The history as it stood at `t`: later calls gone, answers after `t` lost.
    fn at(&self, t: Time) -> Self {
        let ops = self
            .ops
            .iter()
            .filter(|o| o.call <= t)
            .filter_map(|o| {
                if o.ret <= t {
                    return Some(*o);
                }
                let lost = |step| Some(KeyOp { ret: NEVER, step, ..*o });
                match o.step {
                    Step::Read { .. } => None,
                    Step::Create { marker, .. } => lost(Step::Create { marker, out: Out::Lost }),
                    Step::Update { marker, precondition, .. } => {
                        lost(Step::Update { marker, precondition, out: Out::Lost })
                    }
                    Step::Patch { marker, .. } => lost(Step::Patch { marker, out: Out::Lost }),
                    Step::Apply { marker, .. } => lost(Step::Apply { marker, out: Out::Lost }),
                    Step::Delete { precondition, .. } => lost(Step::Delete { precondition, out: Out::Lost }),
                    Step::Touch { precondition, .. } => lost(Step::Touch { precondition, out: Out::Lost }),
                    Step::External { .. } => Some(KeyOp { ret: NEVER, pending: true, ..*o }),
                }
            })
            .collect();
        self.with(ops)
    }

    /// A small failing piece: the shortest failing prefix in time (its last answer is the one that cannot be
    /// explained), then without the calls that change nothing and are not needed for the failure.
    fn minimise(&self) -> (Option<Origin>, Vec<Origin>) {
        let mut cuts: Vec<Time> = self.ops.iter().map(|o| o.ret).filter(|&t| t != NEVER).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let fails = |h: &KeyHistory| h.linearizable() == Some(false);
        // Failing is monotone in the cut: more answers only add constraints.
        let (mut lo, mut hi) = (0, cuts.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fails(&self.at(cuts[mid])) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let culprit = cuts.get(lo).and_then(|&t| self.ops.iter().find(|o| o.ret == t)).map(|o| o.origin);
        let mut piece = if lo < cuts.len() { self.at(cuts[lo]) } else { self.with(self.ops.clone()) };
        // Each try is a search: only the last calls before the failure are worth it.
        let mut i = piece.ops.len().saturating_sub(MINIMISE_TRIES);
        while i < piece.ops.len() && piece.ops.len() > 1 {
            if piece.ops[i].changes_nothing() {
                let mut fewer = piece.ops.clone();
                fewer.remove(i);
                let fewer = piece.with(fewer);
                if fails(&fewer) {
                    piece = fewer;
                    continue;
                }
            }
            i += 1;
        }
        // In answer order; calls without one where they started.
        piece.ops.sort_by_key(|o| if o.ret == NEVER { o.call } else { o.ret });
        (culprit, piece.ops.iter().map(|o| o.origin).collect())
    }
}

/// With etcd's record, a lost answer is known: a write whose marker etcd has happened at that revision, one whose
/// marker it lacks did not (deletes without a revision stay for the search to place). Returns each call's answer
/// as checked (None: left out) and the changes no call stands for.
fn resolve(history: &History) -> (Vec<Option<Response>>, Vec<usize>) {
    let mut answers: Vec<Option<Response>> = history
        .operations
        .iter()
        .map(|o| match &o.response {
            Response::Refused(_) => None,
            r => Some(r.clone()),
        })
        .collect();
    if history.changes.is_empty() {
        return (answers, Vec::new());
    }
    let answered: HashSet<(&str, u64)> =
        history.operations.iter().filter_map(|o| Some((o.request.key()?, o.written_revision()?))).collect();
    let lost_writes: HashMap<&str, usize> = history
        .operations
        .iter()
        .enumerate()
        .filter(|(_, o)| o.lost())
        .filter_map(|(i, o)| Some((o.request.marker()?, i)))
        .collect();
    let mut claimed = HashSet::new();
    let mut last: HashMap<&str, Option<&str>> = HashMap::new();
    let mut external = Vec::new();
    for (i, c) in history.changes.iter().enumerate() {
        let prev = last.insert(&c.key, c.marker.as_deref()).flatten();
        if answered.contains(&(c.key.as_str(), c.resource_version)) {
            continue;
        }
        // Only clients delete PodSets: a deletion no answer names is left to the deletes without one.
        let Some(m) = c.marker.as_deref() else { continue };
        match lost_writes.get(m).filter(|_| prev != Some(m)) {
            Some(&call) => {
                claimed.insert(call);
                answers[call] = Some(Response::Object(Seen { resource_version: c.resource_version, marker: m.into() }));
            }
            None => external.push(i),
        }
    }
    for (i, o) in history.operations.iter().enumerate() {
        // A lost write of a subresource that happened is in the record as a change that keeps the marker, placed
        // as the controller's are.
        if o.lost() && (o.request.marker().is_some() && !claimed.contains(&i) || o.request.keeps_marker()) {
            answers[i] = None;
        }
    }
    (answers, external)
}

/// Real-time bounds of a revision from the answered writes of every key: etcd's revisions are one order.
struct RevisionWindow {
    /// (revision, started at, answered at), by revision, with the latest start below and the earliest answer
    /// above each.
    writes: Vec<(u64, Time, Time)>,
}

impl RevisionWindow {
    fn new(history: &History, answers: &[Option<Response>]) -> Self {
        let mut writes: Vec<(u64, Time, Time)> = history
            .operations
            .iter()
            .zip(answers)
            .filter(|(o, _)| o.request.is_write() && !o.lost())
            .filter_map(|(o, a)| match a {
                Some(Response::Object(s)) => Some((s.resource_version, o.call, o.ret)),
                Some(Response::Deleted { resource_version }) => Some((*resource_version, o.call, o.ret)),
                _ => None,
            })
            .collect();
        writes.sort_unstable();
        for i in 1..writes.len() {
            writes[i].1 = writes[i].1.max(writes[i - 1].1);
        }
        for i in (0..writes.len().saturating_sub(1)).rev() {
            writes[i].2 = writes[i].2.min(writes[i + 1].2);
        }
        Self { writes }
    }

    /// Revision `rv` was made after this: a write of a lower revision had started.
    fn started_by(&self, rv: u64) -> Time {
        let i = self.writes.partition_point(|w| w.0 < rv);
        i.checked_sub(1).map_or(0, |i| self.writes[i].1)
    }

    /// Revision `rv` was made before this: a write of a higher revision was answered.
    fn answered_by(&self, rv: u64) -> Time {
        let i = self.writes.partition_point(|w| w.0 <= rv);
        self.writes.get(i).map_or(NEVER, |w| w.2)
    }
}

/// Turns the recorded calls and etcd's changes into one history per key.
fn split_by_key(history: &History) -> BTreeMap<Key, KeyHistory> {
    let mut markers: HashMap<String, u32> = HashMap::new();
    let mut intern = |m: &str| {
        let n = markers.len() as u32;
        *markers.entry(m.to_owned()).or_insert(n)
    };
    let mut by_key: BTreeMap<Key, Vec<KeyOp>> = BTreeMap::new();
    let mut keys: Vec<Key> = history.operations.iter().filter_map(|o| o.request.key().map(String::from)).collect();
    keys.extend(history.changes.iter().map(|c| c.key.clone()));
    keys.sort();
    keys.dedup();
    let (answers, external) = resolve(history);
    for (i, (op, answer)) in history.operations.iter().zip(&answers).enumerate() {
        let Some(response) = answer else { continue };
        let mut out_of = |r: &Response| -> Option<Out> {
            Some(match r {
                Response::Object(s) => Out::Seen { rv: s.resource_version, marker: intern(&s.marker) },
                Response::Deleted { resource_version } => Out::Deleted { rv: *resource_version },
                Response::Gone => Out::Gone,
                Response::NotFound => Out::NotFound,
                Response::AlreadyExists => Out::AlreadyExists,
                Response::Conflict => Out::Conflict,
                Response::Lost => Out::Lost,
                Response::Refused(_) | Response::List { .. } | Response::Expired { .. } => return None,
            })
        };
        let key_op = |step| KeyOp { origin: Origin::Call(i), call: op.call, ret: op.ret, step, pending: false };
        let step = match &op.request {
            Request::Create { marker, .. } => out_of(response).map(|out| Step::Create { marker: intern(marker), out }),
            Request::Update { marker, precondition, .. } => {
                out_of(response).map(|out| Step::Update { marker: intern(marker), precondition: *precondition, out })
            }
            Request::Patch { marker, .. } => out_of(response).map(|out| Step::Patch { marker: intern(marker), out }),
            Request::Apply { marker, .. } => out_of(response).map(|out| Step::Apply { marker: intern(marker), out }),
            Request::Delete { precondition, .. } => {
                out_of(response).map(|out| Step::Delete { precondition: *precondition, out })
            }
            Request::Status { precondition, .. } => {
                out_of(response).map(|out| Step::Touch { precondition: *precondition, out })
            }
            Request::Scale { precondition, .. } => out_of(response).map(|out| match out {
                Out::Seen { rv, .. } => {
                    Step::Touch { precondition: *precondition, out: Out::Seen { rv, marker: ANY_MARKER } }
                }
                out => Step::Touch { precondition: *precondition, out },
            }),
            Request::Get { from: ReadFrom::Latest, .. } => match out_of(response) {
                Some(Out::Lost) | None => None,
                Some(out) => Some(Step::Read { out }),
            },
            Request::Get { .. } => None,
            Request::List { namespace, from: ReadFrom::Latest, group } => {
                // A list reads every key it selects at once: absent keys are reads of absence.
                if let Response::List { items, .. } = response {
                    let selects =
                        |k: &str| in_namespace(namespace, k) && group.as_deref().is_none_or(|g| group_of(k) == g);
                    for key in keys.iter().filter(|k| selects(k)) {
                        let out = match items.iter().find(|(k, _)| k == key) {
                            Some((_, s)) => Out::Seen { rv: s.resource_version, marker: intern(&s.marker) },
                            None => Out::NotFound,
                        };
                        by_key.entry(key.clone()).or_default().push(key_op(Step::Read { out }));
                    }
                }
                None
            }
            Request::List { .. } => None,
        };
        if let (Some(step), Some(key)) = (step, op.request.key()) {
            by_key.entry(key.to_owned()).or_default().push(key_op(step));
        }
    }
    // Changes no call stands for (the controller's status writes) go where their previous version is current, and
    // where etcd's revision order allows: after every call of a lower revision started, before every answer of a
    // higher one. The same bounds the answer of a lost write that etcd has.
    let window = RevisionWindow::new(history, &answers);
    for ops in by_key.values_mut() {
        for o in ops.iter_mut() {
            if let (Origin::Call(i), true) = (o.origin, o.ret == NEVER) {
                if let Some(Response::Object(Seen { resource_version, .. }) | Response::Deleted { resource_version }) =
                    &answers[i]
                {
                    o.ret = window.answered_by(*resource_version).max(o.call);
                }
            }
        }
    }
    let mut last: HashMap<&str, Option<u64>> = HashMap::new();
    let external: HashSet<usize> = external.into_iter().collect();
    for (i, c) in history.changes.iter().enumerate() {
        let prev = last.insert(&c.key, c.marker.is_some().then_some(c.resource_version)).flatten();
        if !external.contains(&i) {
            continue;
        }
        let step = Step::External { rv: c.resource_version, prev, marker: c.marker.as_deref().map(&mut intern) };
        let (call, ret) = (window.started_by(c.resource_version), window.answered_by(c.resource_version));
        by_key.entry(c.key.clone()).or_default().push(KeyOp {
            origin: Origin::Change(i),
            call,
            ret: ret.max(call),
            step,
            pending: false,
        });
    }
    by_key
        .into_iter()
        .map(|(k, mut ops)| {
            ops.sort_by_key(|o| (o.call, o.ret));
            (k, KeyHistory { ops, initial: State::Absent })
        })
        .collect()
}

/// Checks every key; returns the keys that are not linearizable (or could not be decided) with their verdicts.
pub fn check(history: &History) -> Vec<(Key, Verdict)> {
    let mut out = Vec::new();
    for (key, h) in split_by_key(history) {
        match h.linearizable() {
            Some(true) => {}
            None => out.push((key, Verdict::Unknown)),
            Some(false) => {
                let (culprit, piece) = h.minimise();
                out.push((key, Verdict::Violation { culprit, piece }))
            }
        }
    }
    out
}

/// How many calls the linearizability check placed or refuted (reads of a list count once per key).
pub fn checked_calls(history: &History) -> usize {
    split_by_key(history).values().map(|h| h.ops.iter().filter(|o| matches!(o.origin, Origin::Call(_))).count()).sum()
}

/// The lines of a failing piece, in call order.
pub fn describe(history: &History, piece: &[Origin], culprit: Option<Origin>) -> Vec<String> {
    piece
        .iter()
        .map(|o| {
            let mark = if Some(*o) == culprit { ">> " } else { "   " };
            match *o {
                Origin::Call(i) => format!("{mark}{}", history.operations[i]),
                Origin::Change(i) => {
                    let c: &Change = &history.changes[i];
                    format!("{mark}etcd change no call answered for (the controller's?): {c:?}")
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::Operation;

    fn op(client: usize, call: Time, ret: Time, request: Request, response: Response) -> Operation {
        Operation { client, route: "r".into(), call, ret, request, response }
    }
    fn seen(rv: u64, marker: &str) -> Response {
        Response::Object(Seen { resource_version: rv, marker: marker.into() })
    }
    fn create(m: &str) -> Request {
        Request::Create { key: "ns/a".into(), marker: m.into() }
    }
    fn update(m: &str, pre: u64) -> Request {
        Request::Update { key: "ns/a".into(), marker: m.into(), precondition: Some(pre) }
    }
    fn get() -> Request {
        Request::Get { key: "ns/a".into(), from: ReadFrom::Latest }
    }
    fn verdicts(ops: Vec<Operation>) -> Vec<(Key, Verdict)> {
        check(&History { operations: ops, ..Default::default() })
    }

    #[test]
    fn concurrent_writes_and_reads_in_some_order_are_linearizable() {
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 40, update("u1", 5), seen(7, "u1")),
            op(2, 21, 41, update("u2", 5), Response::Conflict),
            // Overlaps the update: may see either state.
            op(3, 25, 30, get(), seen(5, "c")),
            op(3, 31, 35, get(), seen(7, "u1")),
            op(4, 50, 60, get(), seen(7, "u1")),
            op(
                4,
                61,
                70,
                Request::Delete { key: "ns/a".into(), precondition: Some(7) },
                Response::Deleted { resource_version: 9 },
            ),
            op(0, 71, 72, get(), Response::NotFound),
        ];
        assert_eq!(verdicts(ops), vec![]);
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_update_is_found() {
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 30, update("u", 5), seen(7, "u")),
            op(2, 40, 50, get(), seen(5, "c")),
            op(3, 41, 42, get(), seen(7, "u")),
        ];
        let v = verdicts(ops);
        assert_eq!(v.len(), 1, "{v:?}");
        // The create, the update and the stale read; the other read is not needed to show it.
        assert_eq!(
            v[0].1,
            Verdict::Violation {
                culprit: Some(Origin::Call(2)),
                piece: vec![Origin::Call(0), Origin::Call(1), Origin::Call(2)]
            }
        );
    }

    #[test]
    fn two_compare_and_swaps_from_one_version_cannot_both_succeed() {
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 30, update("u1", 5), seen(7, "u1")),
            op(2, 21, 31, update("u2", 5), seen(8, "u2")),
        ];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn a_lost_write_may_or_may_not_have_happened() {
        let happened = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, NEVER, update("u", 5), Response::Lost),
            op(2, 40, 50, get(), seen(6, "u")),
        ];
        assert_eq!(verdicts(happened), vec![]);
        let did_not = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, NEVER, update("u", 5), Response::Lost),
            op(2, 40, 50, get(), seen(5, "c")),
            op(2, 60, 70, update("v", 5), seen(9, "v")),
        ];
        assert_eq!(verdicts(did_not), vec![]);
        // But not both: once it is seen, it cannot be undone.
        let both = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, NEVER, update("u", 5), Response::Lost),
            op(2, 40, 50, get(), seen(6, "u")),
            op(2, 60, 70, get(), seen(5, "c")),
        ];
        assert!(matches!(verdicts(both)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn etcd_tells_whether_a_lost_write_happened() {
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, NEVER, update("u", 5), Response::Lost),
            op(2, 40, 50, get(), seen(5, "c")),
            op(2, 60, 70, get(), seen(6, "u")),
        ];
        let change = |rv, m: &str| Change { resource_version: rv, key: "ns/a".into(), marker: Some(m.into()) };
        let happened =
            History { operations: ops.clone(), changes: vec![change(5, "c"), change(6, "u")], ..Default::default() };
        assert_eq!(check(&happened), vec![]);
        // etcd never had it: the second read is of nothing anyone wrote.
        let did_not = History { operations: ops, changes: vec![change(5, "c")], ..Default::default() };
        assert_eq!(
            check(&did_not)[0].1,
            Verdict::Violation { culprit: Some(Origin::Call(3)), piece: vec![Origin::Call(0), Origin::Call(3)] }
        );
    }

    #[test]
    fn a_delete_answered_without_its_revision_happened_within_its_call() {
        let delete = Request::Delete { key: "ns/a".into(), precondition: Some(5) };
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 30, delete.clone(), Response::Gone),
            op(2, 25, 26, get(), seen(5, "c")),
            op(2, 31, 32, get(), Response::NotFound),
        ];
        assert_eq!(verdicts(ops), vec![]);
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 30, delete, Response::Gone),
            op(2, 31, 32, get(), seen(5, "c")),
        ];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn a_read_of_a_write_not_yet_made_is_found() {
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(2, 20, 30, get(), seen(7, "u")),
            op(1, 40, 50, update("u", 5), seen(7, "u")),
        ];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn etcd_changes_no_client_made_explain_new_versions() {
        // The controller wrote status (rv 6, same marker) between the create and the read.
        let history = History {
            operations: vec![
                op(0, 0, 10, create("c"), seen(5, "c")),
                op(1, 20, 30, get(), seen(6, "c")),
                op(2, 40, 50, update("u", 5), Response::Conflict),
            ],
            changes: vec![
                Change { resource_version: 5, key: "ns/a".into(), marker: Some("c".into()) },
                Change { resource_version: 6, key: "ns/a".into(), marker: Some("c".into()) },
            ],
            ..Default::default()
        };
        assert_eq!(check(&history), vec![]);
        // Without the change, the read is of nothing anyone wrote.
        let history = History { changes: Vec::new(), ..history };
        assert!(matches!(check(&history)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn a_list_is_a_read_of_every_key_in_its_namespace() {
        let list = |items: Vec<(Key, Seen)>| Response::List { resource_version: 9, items };
        let ns_list = Request::List { namespace: "ns".into(), from: ReadFrom::Latest, group: None };
        let b = Request::Create { key: "ns/b".into(), marker: "b".into() };
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(0, 11, 12, b, seen(6, "b")),
            // Misses b, created before the list started.
            op(1, 20, 30, ns_list, list(vec![("ns/a".into(), Seen { resource_version: 5, marker: "c".into() })])),
        ];
        let v = verdicts(ops);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, "ns/b");
    }

    #[test]
    fn a_write_of_a_subresource_keeps_the_marker_and_takes_a_new_revision() {
        let scale = |pre| Request::Scale { key: "ns/a".into(), replicas: 2, precondition: Some(pre) };
        let status = |pre| Request::Status { key: "ns/a".into(), precondition: Some(pre) };
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            // A Scale's answer shows no marker.
            op(1, 20, 30, scale(5), seen(7, "")),
            op(2, 40, 50, get(), seen(7, "c")),
            op(3, 60, 70, status(7), seen(8, "c")),
            op(1, 71, 72, scale(7), Response::Conflict),
            op(2, 80, 90, get(), seen(8, "c")),
        ];
        assert_eq!(verdicts(ops), vec![]);
        // A status write that answers with another marker than the object had, or a read of the old revision
        // after the scale was acknowledged.
        let ops = vec![op(0, 0, 10, create("c"), seen(5, "c")), op(3, 20, 30, status(5), seen(8, "x"))];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
        let ops = vec![
            op(0, 0, 10, create("c"), seen(5, "c")),
            op(1, 20, 30, scale(5), seen(7, "")),
            op(2, 40, 50, get(), seen(5, "c")),
        ];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
        // A conflict although the precondition held.
        let ops = vec![op(0, 0, 10, create("c"), seen(5, "c")), op(1, 20, 30, scale(5), Response::Conflict)];
        assert!(matches!(verdicts(ops)[0].1, Verdict::Violation { .. }));
    }

    #[test]
    fn a_list_by_label_or_of_every_namespace_reads_the_keys_it_selects() {
        let list = |namespace: &str, group: Option<&str>, items: Vec<(Key, Seen)>| {
            let req =
                Request::List { namespace: namespace.into(), from: ReadFrom::Latest, group: group.map(Into::into) };
            (req, Response::List { resource_version: 9, items })
        };
        let create = |key: &str| Request::Create { key: key.into(), marker: key.into() };
        let s = |key: &str, rv| (key.to_owned(), Seen { resource_version: rv, marker: key.into() });
        let base = vec![
            op(0, 0, 10, create("ns/ps-1"), seen(5, "ns/ps-1")),
            op(0, 11, 12, create("x/ps-2"), seen(6, "x/ps-2")),
        ];
        let with = |(req, resp): (Request, Response)| [base.clone(), vec![op(1, 20, 30, req, resp)]].concat();
        // Every namespace: both; the odd group: ps-1 only.
        assert_eq!(verdicts(with(list("", None, vec![s("ns/ps-1", 5), s("x/ps-2", 6)]))), vec![]);
        assert_eq!(verdicts(with(list("", Some("odd"), vec![s("ns/ps-1", 5)]))), vec![]);
        let v = verdicts(with(list("", None, vec![s("ns/ps-1", 5)])));
        assert_eq!(v.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), ["x/ps-2"]);
        let v = verdicts(with(list("", Some("even"), Vec::new())));
        assert_eq!(v.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), ["x/ps-2"]);
    }
}
