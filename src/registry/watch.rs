//! Watching a resource's objects, with kube-apiserver's watch-cache semantics: where a watch starts, its initial events, and
//! selector transitions as ADDED/DELETED. Framing, bookmarks and timeouts are the HTTP layer's.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use futures::stream::BoxStream;
use futures::StreamExt;
use parking_lot::Mutex;

use super::error::Error;
use super::error::Result;
use super::key::ObjectKey;
use super::options::ListRequest;
use super::stored::Stored;
use super::strategy::Strategy;
use super::{Registry, Revision};
use crate::api::resource::ResourceInfo;
use crate::api::selector::{FieldSelector, Selector};
use crate::storage;

/// What a watch follows, and from where.
#[derive(Default)]
pub struct WatchRequest {
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: FieldSelector,
    pub resource_version: Option<Revision>,
    /// `sendInitialEvents`: `Some(true)` opens with ADDED for every object (WatchList), `Some(false)` never does;
    /// unset, only a watch from resourceVersion 0 or none opens with them.
    pub send_initial_events: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// As a `WatchEvent`'s `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change as the watcher sees it (through its selectors).
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventType,
    /// The object after the change; for DELETED, its last state stamped with the deletion's revision.
    pub object: Stored,
    /// The object before the change, if the watcher saw it.
    pub prev: Option<Stored>,
    pub revision: Revision,
    /// What every watcher of this revision shares; none for a watch's initial events.
    shared: Option<Arc<Shared>>,
}

impl Event {
    /// A MODIFIED that changed nothing but status.
    pub fn only_status_changed(&self) -> bool {
        self.kind == EventType::Modified && self.prev.as_ref().is_some_and(|p| self.object.only_status_differs(p))
    }

    /// What `make` derives from this revision's change (encoded watch lines, say), made once for all watchers of
    /// the newest revisions; `None` for an initial event, an old revision, or if another type was kept first.
    pub fn memo<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.shared.as_ref()?.memo.get_or_init(|| Box::new(make())).downcast_ref()
    }
}

/// What all watchers of one revision share, made at most once however many watchers send it.
#[derive(Default)]
pub(crate) struct Shared {
    /// The DELETED a watcher whose selectors the object left sees: the previous state, restamped.
    left: OnceLock<Result<Stored, String>>,
    memo: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shared")
    }
}

/// How many of the newest revisions keep what their watchers share. Watchers that keep up read the newest few;
/// one further behind makes its own.
const RECENT: usize = 64;

/// The shared state of the newest revisions: bounded (their encoded lines are a few hundred KB at most), so none of
/// it lives as long as the objects do.
#[derive(Default)]
pub(crate) struct Recent(Mutex<BTreeMap<Revision, Arc<Shared>>>);

impl Recent {
    fn get(&self, revision: Revision) -> Arc<Shared> {
        let mut kept = self.0.lock();
        if let Some(s) = kept.get(&revision) {
            return s.clone();
        }
        let s = Arc::<Shared>::default();
        if kept.len() >= RECENT {
            if kept.first_key_value().is_some_and(|(oldest, _)| *oldest > revision) {
                return s;
            }
            kept.pop_first();
        }
        kept.insert(revision, s.clone());
        s
    }
}

/// What a watch stream carries.
#[derive(Debug, Clone)]
pub enum Notification {
    Event(Event),
    /// A change the watcher's selectors hide: the watch has reached this revision (what bookmarks report).
    Progress(Revision),
}

/// A started watch.
pub struct Watch {
    /// Events follow this revision; for a watch with initial events, the revision they were read at.
    pub revision: Revision,
    /// ADDED for every object at `revision`, when the watch opens with them.
    pub initial: Vec<Event>,
    /// Changes after `revision`, in order. An `Err` (410 Expired when the watcher fell behind the kept history)
    /// ends it.
    pub events: BoxStream<'static, Result<Notification>>,
}

impl<S: Strategy> Registry<S> {
    /// Starts a watch. A `resource_version` older than the kept history is a 410 Expired.
    pub async fn watch(&self, req: WatchRequest) -> Result<Watch> {
        let (start, initial) = match (req.send_initial_events, req.resource_version) {
            (Some(send), rv) => (self.read_revision(rv, false).await?, send),
            (None, None) => (self.read_revision(None, false).await?, true),
            (None, Some(0)) => (self.store.current_revision(), true),
            (None, Some(rv)) => {
                // A revision this server has not reached (another replica's, or from before a restore): wait
                // briefly, then "too large" as kube-apiserver's watch cache answers, never a silent wait.
                self.read_revision(Some(rv), false).await?;
                (rv, false)
            }
        };
        let stream = self.store.watch(&ObjectKey::prefix(S::INFO, req.namespace.as_deref()), start)?;
        let initial = if initial {
            let page = self
                .list(ListRequest {
                    namespace: req.namespace.clone(),
                    labels: req.labels.clone(),
                    fields: req.fields.clone(),
                    resource_version: Some(start),
                    exact: true,
                    ..Default::default()
                })
                .await?;
            page.items
                .into_iter()
                .map(|object| Event { kind: EventType::Added, object, prev: None, revision: start, shared: None })
                .collect()
        } else {
            Vec::new()
        };
        let (labels, fields, recent) = (req.labels, req.fields, self.recent.clone());
        let events = stream.map(move |ev| through_selectors(ev, S::INFO, &labels, &fields, &recent));
        #[cfg(feature = "planted-bugs")]
        let events = events.filter(|n| {
            let drop = matches!(n, Ok(Notification::Event(_)))
                && crate::planted::strikes(crate::planted::Bug::DropWatchEvent, 25);
            std::future::ready(!drop)
        });
        let events = events.boxed();
        Ok(Watch { revision: start, initial, events })
    }
}

/// A storage event as a watcher with these selectors sees it: an object entering them is ADDED, one leaving them
/// DELETED (at the revision it left), one outside them not seen at all.
fn through_selectors(
    ev: storage::Result<Arc<storage::Event>>,
    resource: &'static ResourceInfo,
    labels: &Selector,
    fields: &FieldSelector,
    recent: &Recent,
) -> Result<Notification> {
    let ev = ev.map_err(|e| Error::storage(e, resource, ""))?;
    let object = Stored::new(ev.object.clone(), resource);
    let prev = ev.prev.clone().map(|p| Stored::new(p, resource));
    let now_in = object.matches(labels, fields);
    let was_in = prev.as_ref().is_some_and(|p| p.matches(labels, fields));
    let shared = || recent.get(ev.revision);
    let (kind, object, shared) = match (ev.kind, was_in, now_in) {
        (storage::EventType::Added, _, true) => (EventType::Added, object, shared()),
        (storage::EventType::Modified, true, true) => (EventType::Modified, object, shared()),
        (storage::EventType::Modified, false, true) => (EventType::Added, object, shared()),
        (storage::EventType::Modified, true, false) => match &prev {
            Some(p) => {
                let shared = shared();
                let left = shared.left.get_or_init(|| p.restamped(ev.revision).map_err(|e| e.to_string())).clone();
                let left = left.map_err(Error::Internal)?;
                (EventType::Deleted, left, shared)
            }
            None => return Ok(Notification::Progress(ev.revision)),
        },
        (storage::EventType::Deleted, true, _) => (EventType::Deleted, object, shared()),
        _ => return Ok(Notification::Progress(ev.revision)),
    };
    Ok(Notification::Event(Event { kind, object, prev, revision: ev.revision, shared: Some(shared) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Object;
    use serde_json::json;

    fn object(app: &str, revision: Revision) -> Arc<Object> {
        let v = json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"app": app}}, "spec": {"replicas": 1}});
        Arc::new(Object::new("/podsets/ns/a", v, revision).unwrap())
    }

    fn seen(n: Result<Notification>) -> Event {
        match n.unwrap() {
            Notification::Event(ev) => ev,
            Notification::Progress(r) => panic!("progress to {r}, not an event"),
        }
    }

    #[test]
    fn a_selector_leaving_deleted_is_made_once_per_revision() {
        let (before, after) = (object("web", 4), object("db", 5));
        let ev = Arc::new(storage::Event {
            revision: 5,
            kind: storage::EventType::Modified,
            object: after.clone(),
            prev: Some(before.clone()),
        });
        let recent = Recent::default();
        let web = Selector::parse("app=web").unwrap();
        let fields = FieldSelector::default();
        let events: Vec<Event> = (0..10)
            .map(|_| seen(through_selectors(Ok(ev.clone()), &crate::resources::podset::INFO, &web, &fields, &recent)))
            .collect();
        let was = Stored::new(before, &crate::resources::podset::INFO).restamped(5).unwrap();
        for e in &events {
            assert_eq!(e.kind, EventType::Deleted);
            assert_eq!(e.object.bytes(), was.bytes(), "the previous state at the new revision, byte for byte");
            assert_eq!(e.object.bytes().as_ptr(), events[0].object.bytes().as_ptr(), "made once");
        }
        assert_eq!(events[0].object.resource_version(), 5);

        let entering = seen(through_selectors(
            Ok(ev.clone()),
            &crate::resources::podset::INFO,
            &Selector::parse("app=db").unwrap(),
            &fields,
            &recent,
        ));
        assert_eq!((entering.kind, entering.object.bytes()), (EventType::Added, &after.bytes));
        let hidden = through_selectors(
            Ok(ev),
            &crate::resources::podset::INFO,
            &Selector::parse("app=x").unwrap(),
            &fields,
            &recent,
        )
        .unwrap();
        assert!(matches!(hidden, Notification::Progress(5)));
    }

    #[test]
    fn what_watchers_share_is_kept_for_the_newest_revisions_only() {
        let recent = Recent::default();
        let first = recent.get(1);
        assert!(Arc::ptr_eq(&first, &recent.get(1)));
        for r in 2..=RECENT as Revision + 1 {
            recent.get(r);
        }
        assert_eq!(recent.0.lock().len(), RECENT);
        assert!(!Arc::ptr_eq(&first, &recent.get(1)), "revision 1 was let go");
        assert!(!recent.0.lock().contains_key(&1), "an older revision than all kept is not kept");
        let newest = recent.get(RECENT as Revision + 1);
        assert!(Arc::ptr_eq(&newest, &recent.get(RECENT as Revision + 1)));
    }
}
