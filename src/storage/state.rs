//! The in-memory image of a store: current objects plus the event log. Reads and watches are served from here;
//! only the backend's writer changes it, after the change is durable.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use super::{Event, HistoryLimits, ListOptions, ListResult, Object, Result, Revision, StorageError};

#[derive(Default)]
pub(crate) struct State {
    pub objects: BTreeMap<String, Arc<Object>>,
    /// Events `compacted + 1 ..= revision`, one per revision, oldest first.
    pub log: VecDeque<(Instant, Arc<Event>)>,
    pub revision: Revision,
    pub compacted: Revision,
}

impl State {
    /// How many of the oldest events the limits let go, given `incoming` more are about to be appended.
    pub fn events_to_drop(&self, limits: &HistoryLimits, incoming: usize, now: Instant) -> usize {
        let total = self.log.len() + incoming;
        let mut drop = 0;
        for (at, _) in &self.log {
            let left = total - drop;
            let old = now.duration_since(*at) > limits.min_age;
            if left > limits.max_events || (left > limits.min_events && old) {
                drop += 1;
            } else {
                break;
            }
        }
        drop
    }

    /// Drops events up to and including `revision` from the log.
    pub fn compact_to(&mut self, revision: Revision) {
        while let Some((_, ev)) = self.log.front() {
            if ev.revision > revision {
                break;
            }
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
        let first = self.revision + 1 - self.log.len() as u64;
        let mut out = Vec::new();
        let mut reached = after;
        for (_, ev) in self.log.iter().skip((after + 1 - first) as usize) {
            if out.len() >= max {
                break;
            }
            reached = ev.revision;
            if ev.object.key.starts_with(prefix) {
                out.push(ev.clone());
            }
        }
        Ok((out, reached))
    }
}
