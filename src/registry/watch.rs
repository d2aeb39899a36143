//! Watching PodSets, with kube-apiserver's watch-cache semantics: where a watch starts, its initial events, and
//! selector transitions as ADDED/DELETED. Framing, bookmarks and timeouts are the HTTP layer's.

use futures::stream::BoxStream;
use futures::StreamExt;

use super::error::storage_error;
use super::key::PodSetKey;
use super::options::ListRequest;
use super::stored::Stored;
use super::{Registry, Revision};
use crate::api::selector::{FieldSelector, Selector};
use crate::api::status::ApiResult;
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
}

impl Event {
    /// A MODIFIED that changed nothing but status.
    pub fn only_status_changed(&self) -> bool {
        self.kind == EventType::Modified && self.prev.as_ref().is_some_and(|p| self.object.only_status_differs(p))
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
    pub events: BoxStream<'static, ApiResult<Notification>>,
}

impl Registry {
    /// Starts a watch. A `resource_version` older than the kept history is a 410 Expired.
    pub async fn watch(&self, req: WatchRequest) -> ApiResult<Watch> {
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
        let stream = self.store.watch(&PodSetKey::prefix(req.namespace.as_deref()), start)?;
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
                .map(|object| Event { kind: EventType::Added, object, prev: None, revision: start })
                .collect()
        } else {
            Vec::new()
        };
        let (labels, fields) = (req.labels, req.fields);
        let events = stream.map(move |ev| through_selectors(ev, &labels, &fields)).boxed();
        Ok(Watch { revision: start, initial, events })
    }
}

/// A storage event as a watcher with these selectors sees it: an object entering them is ADDED, one leaving them
/// DELETED (at the revision it left), one outside them not seen at all.
fn through_selectors(
    ev: storage::Result<std::sync::Arc<storage::Event>>,
    labels: &Selector,
    fields: &FieldSelector,
) -> ApiResult<Notification> {
    let ev = ev.map_err(|e| storage_error(e, ""))?;
    let object = Stored::new(ev.object.clone());
    let prev = ev.prev.clone().map(Stored::new);
    let now_in = object.matches(labels, fields);
    let was_in = prev.as_ref().is_some_and(|p| p.matches(labels, fields));
    let (kind, object) = match (ev.kind, was_in, now_in) {
        (storage::EventType::Added, _, true) => (EventType::Added, object),
        (storage::EventType::Modified, true, true) => (EventType::Modified, object),
        (storage::EventType::Modified, false, true) => (EventType::Added, object),
        (storage::EventType::Modified, true, false) => match &prev {
            Some(p) => (EventType::Deleted, p.restamped(ev.revision)?),
            None => return Ok(Notification::Progress(ev.revision)),
        },
        (storage::EventType::Deleted, true, _) => (EventType::Deleted, object),
        _ => return Ok(Notification::Progress(ev.revision)),
    };
    Ok(Notification::Event(Event { kind, object, prev, revision: ev.revision }))
}
