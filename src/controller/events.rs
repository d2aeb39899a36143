//! Events on PodSets (events.k8s.io/v1), repeats folded into a series as kube-rs's `Recorder` folds them, but told
//! apart by their note too: the ReplicaSet controller's recorder keys its events on their message, so a
//! `FailedCreate` whose message changed (another quota, another refusal) is a new event, not a repeat of the first.
//! kube-rs's key leaves the note out.

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// How long an event may be continued as a series after it was last seen (kube-rs's and client-go's 6 minutes).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// A second object the event concerns (the Pod created or deleted).
    pub related: Option<ObjectReference>,
}

/// What makes two events the same one, seen again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: &'static str,
    note: String,
    regarding: [Option<String>; 3],
    related: Option<[Option<String>; 3]>,
}

fn identity(r: &ObjectReference) -> [Option<String>; 3] {
    [r.namespace.clone(), r.name.clone(), r.uid.clone()]
}

pub(crate) struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    published: Mutex<HashMap<Key, Event>>,
}

impl Recorder {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let instance = instance.unwrap_or_else(|| controller.to_owned());
        Self { client, controller: controller.to_owned(), instance, published: Mutex::default() }
    }

    /// Creates the event, or continues its series when the same one was published within the TTL.
    pub async fn publish(&self, record: Record, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            warning: record.warning,
            reason: record.reason,
            note: record.note.clone(),
            regarding: identity(regarding),
            related: record.related.as_ref().map(identity),
        };
        let event = self.next(&key, || self.event(record, regarding, now), now);
        let api: Api<Event> = Api::namespaced(self.client.clone(), regarding.namespace.as_deref().unwrap_or("default"));
        let name = event.metadata.name.clone().unwrap_or_default();
        match event.series.is_some() {
            true => api.patch(&name, &PatchParams::default(), &Patch::Merge(&event)).await?,
            false => api.create(&PostParams::default(), &event).await?,
        };
        self.published.lock().unwrap_or_else(|e| e.into_inner()).insert(key, event);
        Ok(())
    }

    /// The event to write: the cached one with its series counted on, or a new one. Expired entries go first.
    fn next(&self, key: &Key, new: impl FnOnce() -> Event, now: Timestamp) -> Event {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        published.retain(|_, e| last_seen(e).is_some_and(|t| t + SERIES_TTL > now));
        match published.get(key) {
            Some(previous) => {
                let count = previous.series.as_ref().map_or(2, |s| s.count + 1);
                let mut event = previous.clone();
                event.series = Some(EventSeries { count, last_observed_time: MicroTime(now) });
                event
            }
            None => new(),
        }
    }

    fn event(&self, record: Record, regarding: &ObjectReference, now: Timestamp) -> Event {
        let name = regarding.name.as_deref().unwrap_or(&self.controller);
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if record.warning { "Warning" } else { "Normal" }.into()),
            reason: Some(record.reason.into()),
            action: Some(record.reason.into()),
            note: Some(record.note),
            regarding: Some(regarding.clone()),
            related: record.related,
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }
}

fn last_seen(e: &Event) -> Option<Timestamp> {
    e.series.as_ref().map(|s| s.last_observed_time.0).or(e.event_time.as_ref().map(|t| t.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> Recorder {
        // Never sends: only `next` is exercised.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Recorder::new(Client::try_from(config).unwrap(), "podset-controller", None)
    }

    fn key(reason: &'static str, note: &str) -> Key {
        let web = ObjectReference { name: Some("web".into()), namespace: Some("ns".into()), ..Default::default() };
        Key { warning: true, reason, note: note.into(), regarding: identity(&web), related: None }
    }

    fn publish(r: &Recorder, key: &Key, at: Timestamp) -> Event {
        let regarding =
            ObjectReference { name: Some("web".into()), namespace: Some("ns".into()), ..Default::default() };
        let record = Record { warning: true, reason: key.reason, note: key.note.clone(), related: None };
        let event = r.next(key, || r.event(record, &regarding, at), at);
        r.published.lock().unwrap().insert(key.clone(), event.clone());
        event
    }

    // Mirrors the EventCorrelator's key, which holds the message: a changed refusal is a new event.
    #[tokio::test]
    async fn a_repeat_continues_a_series_and_a_changed_note_is_a_new_event() {
        let r = recorder();
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let quota = key("FailedCreate", "Error creating: exceeded quota: q, limited: pods=2");
        let first = publish(&r, &quota, t0);
        assert_eq!(first.series, None);
        assert_eq!(first.note.as_deref(), Some("Error creating: exceeded quota: q, limited: pods=2"));
        let again = publish(&r, &quota, t0 + SignedDuration::from_secs(10));
        assert_eq!(again.metadata.name, first.metadata.name, "the same event, continued");
        assert_eq!(again.series.as_ref().map(|s| s.count), Some(2));
        assert_eq!(publish(&r, &quota, t0 + SignedDuration::from_secs(20)).series.map(|s| s.count), Some(3));

        let raised = key("FailedCreate", "Error creating: exceeded quota: q, limited: pods=3");
        let changed = publish(&r, &raised, t0 + SignedDuration::from_secs(30));
        assert_ne!(changed.metadata.name, first.metadata.name, "a new message is a new event");
        assert_eq!(changed.series, None);
        assert_eq!(changed.note.as_deref(), Some("Error creating: exceeded quota: q, limited: pods=3"));

        let later = publish(&r, &quota, t0 + SignedDuration::from_secs(20) + SERIES_TTL);
        assert_eq!(later.series, None, "a series not seen for the TTL starts over");
    }
}
