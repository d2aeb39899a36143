//! The in-memory image of a store: current objects plus the event log. Reads and watches are served from here;
//! only the cache's applier changes it, after the backend made the change durable.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use super::{
    Change, Event, EventType, HistoryLimits, ListOptions, ListResult, Object, Result, Revision, Snapshot, StorageError,
};

#[derive(Default)]
pub(crate) struct State {
    pub objects: BTreeMap<String, Arc<Object>>,
    /// The events after `compacted` up to `revision`, oldest first. Revisions increase but may skip: a backend
    /// shared with other data (etcd) counts its other keys' writes too.
    pub log: VecDeque<(Instant, Arc<Event>)>,
    /// Serialized bytes of the objects the log's events carry.
    pub log_bytes: usize,
    pub revision: Revision,
    pub compacted: Revision,
}

impl State {
    /// Appends durable changes, in revision order. Each event's `prev` is this image's own copy of the state
    /// before it, so history and current objects share memory. One revision may change several keys (an etcd
    /// transaction or range delete by another client): its events follow each other.
    pub fn apply(&mut self, changes: Vec<Change>, now: Instant) -> Result<()> {
        for c in changes {
            let same_revision = self.log.back().is_some_and(|(_, e)| e.revision == c.revision);
            if c.revision < self.revision || (c.revision == self.revision && !same_revision) {
                return Err(StorageError::Corrupt(format!(
                    "change stream went back from revision {} to {}",
                    self.revision, c.revision
                )));
            }
            let key = c.object.key.clone();
            let prev = match c.kind {
                EventType::Deleted => self.objects.remove(&key),
                _ => self.objects.insert(key, c.object.clone()),
            };
            self.push(now, Arc::new(Event { revision: c.revision, kind: c.kind, object: c.object, prev }));
        }
        Ok(())
    }

    /// The image of a backend's snapshot, at its start and after a reload: history before the snapshot's own is
    /// gone, and so is history older than the limits keep, so a watch from it gets `Expired`, never a gap.
    pub fn from_snapshot(snapshot: Snapshot, limits: &HistoryLimits, now: Instant) -> Self {
        let mut state = State {
            objects: snapshot.objects.into_iter().map(|o| (o.key.clone(), o)).collect(),
            revision: snapshot.compacted,
            compacted: snapshot.compacted,
            ..Default::default()
        };
        for ev in snapshot.events {
            state.push(now, ev);
        }
        state.revision = snapshot.revision;
        state.trim(limits, now);
        state
    }

    pub fn push(&mut self, at: Instant, ev: Arc<Event>) {
        self.revision = ev.revision;
        self.log_bytes += ev.object.bytes.len();
        self.log.push_back((at, ev));
    }

    /// Lets go of the oldest events the limits no longer keep. Returns whether any went.
    pub fn trim(&mut self, limits: &HistoryLimits, now: Instant) -> bool {
        let mut to = self.compacted;
        let (mut left, mut bytes) = (self.log.len(), self.log_bytes);
        for (at, ev) in &self.log {
            let old = now.duration_since(*at) > limits.min_age;
            let over = left > limits.max_events || bytes > limits.max_bytes || (left > limits.min_events && old);
            if !over || left <= 1 {
                break;
            }
            to = ev.revision;
            left -= 1;
            bytes -= ev.object.bytes.len();
        }
        let trimmed = to > self.compacted;
        self.compact_to(to);
        trimmed
    }

    /// Drops events up to and including `revision` from the log.
    pub fn compact_to(&mut self, revision: Revision) {
        while let Some((_, ev)) = self.log.front() {
            if ev.revision > revision {
                break;
            }
            self.log_bytes -= ev.object.bytes.len();
            self.log.pop_front();
        }
        self.compacted = self.compacted.max(revision.min(self.revision));
    }

    pub fn check_readable(&self, revision: Revision) -> Result<()> {
        if revision < self.compacted {
            return Err(StorageError::Expired { requested: revision, oldest: self.compacted });
        }
        if revision > self.revision {
            return Err(StorageError::TooLarge { requested: revision, current: self.revision });
        }
        Ok(())
    }
    pub fn list(&self, opts: &ListOptions) -> Result<ListResult> {
        let at = opts.revision.unwrap_or(self.revision);
        self.check_readable(at)?;
        let prefix = opts.prefix.as_str();
        let start = match &opts.start_key {
            Some(k) if k.as_str() > prefix => k.as_str(),
            _ => prefix,
        };
        let in_range = |k: &str| k >= start && k.starts_with(prefix);

        // Undo every change newer than `at`: walking newest to oldest, the last `prev` seen per key is its state at `at`.
        let mut overrides: BTreeMap<&str, Option<&Arc<Object>>> = BTreeMap::new();
        for (_, ev) in self.log.iter().rev().take_while(|(_, e)| e.revision > at) {
            if in_range(&ev.object.key) {
                overrides.insert(ev.object.key.as_str(), ev.prev.as_ref());
            }
        }

        let mut current = self
            .objects
            .range::<str, _>((Bound::Included(start), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), Some(v)))
            .peekable();
        let mut undone = overrides.into_iter().peekable();
        let merged = std::iter::from_fn(move || {
            let order = match (current.peek(), undone.peek()) {
                (None, None) => return None,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((c, _)), Some((u, _))) => c.cmp(u),
            };
            match order {
                Ordering::Less => current.next(),
                Ordering::Greater => undone.next(),
                Ordering::Equal => {
                    current.next();
                    undone.next()
                }
            }
        })
        .filter_map(|(_, v)| v);

        let mut items = Vec::new();
        let mut next_key = None;
        let mut remaining = 0u64;
        let limit = opts.limit.unwrap_or(usize::MAX);
        for obj in merged {
            // Never a silent skip for a client: a list that would hold a value no provider reads fails, naming it.
            if obj.unreadable.is_some() && opts.skip_unreadable {
                continue;
            }
            obj.check_readable()?;
            if let Some(pred) = &opts.predicate {
                if !pred(obj) {
                    continue;
                }
            }
            if items.len() < limit {
                items.push(obj.clone());
                continue;
            }
            if next_key.is_none() {
                next_key = Some(obj.key.clone());
                if opts.predicate.is_some() {
                    break;
                }
            }
            remaining += 1;
        }
        let remaining = (next_key.is_some() && opts.predicate.is_none()).then_some(remaining);
        Ok(ListResult { items, revision: at, next_key, remaining })
    }

    /// Up to `max` events under `prefix` after revision `after`, and the revision the scan reached.
    pub fn events_after(&self, prefix: &str, after: Revision, max: usize) -> Result<(Vec<Arc<Event>>, Revision)> {
        if after < self.compacted {
            return Err(StorageError::Expired { requested: after, oldest: self.compacted });
        }
        if after >= self.revision {
            return Ok((Vec::new(), after));
        }
        let start = self.log.partition_point(|(_, e)| e.revision <= after);
        let mut out = Vec::new();
        let mut reached = after;
        for (_, ev) in self.log.iter().skip(start) {
            // A revision's events go out together: a watch resumes after whole revisions.
            if out.len() >= max && ev.revision != reached {
                break;
            }
            reached = ev.revision;
            if ev.object.key.starts_with(prefix) {
                ev.object.check_readable()?;
                out.push(ev.clone());
            }
        }
        if out.len() < max {
            // Past the last event: revisions without one under our keys were reached too.
            reached = self.revision;
        }
        Ok((out, reached))
    }
}
