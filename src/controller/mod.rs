//! The embedded controller: keeps `spec.replicas` Pods in the main API server for every PodSet in our `Store`.
//!
//! Inputs: the registry's watch of PodSets (in process), one cluster-wide Pod reflector through kube-rs, and a periodic
//! resync. Keys go through a work queue to parallel workers (never two on one key). Expectations keep a stale Pod
//! cache from causing extra creates or deletes.

mod events;
mod expectations;
pub mod informers;
pub mod leader;
pub(crate) mod metrics;
mod pods;
mod queue;
mod reconcile;

pub use informers::{InformerHandle, InformerSync};
pub use reconcile::{CONTROLLER_USER, FIELD_MANAGER};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::reflector::{self, Store as PodCache};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

pub use expectations::Expectations;
pub use queue::Queue;

use crate::api::{Version, KIND};
use crate::registry::{ListRequest, Notification, WatchRequest};
use crate::resources::podset::PodSetStrategy;
use crate::resources::podset::{PodSetKey, PodSets as Registry};

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Reconciles running at once (on different PodSets).
    pub workers: usize,
    /// Every PodSet is reconciled at least this often.
    pub resync: Duration,
    /// How long to wait for the Pod watch to show a create or delete before acting again anyway.
    pub expectations_timeout: Duration,
    /// Most Pods created or deleted for one PodSet in one reconcile.
    pub burst_replicas: usize,
    /// Sustained writes per second to the main API server (0: no client-side limit).
    pub qps: u32,
    /// Writes allowed at once above `qps`.
    pub burst: u32,
    /// Only Pods matching this label selector are watched (empty: all Pods, so any orphan can be adopted).
    pub pod_selector: Option<String>,
    /// Where the controller's caches report their first sync (`/readyz/informer-sync`).
    pub informers: InformerSync,
    /// With leader election: whether the Lease is still surely ours, asked before every write to the main API
    /// server.
    pub leadership: Option<leader::Leadership>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            resync: Duration::from_secs(300),
            expectations_timeout: Duration::from_secs(300),
            burst_replicas: 500,
            qps: 500,
            burst: 1000,
            pod_selector: None,
            informers: InformerSync::default(),
            leadership: None,
        }
    }
}

/// Shared by the workers and the event loops.
pub(crate) struct Context {
    /// PodSets are read, watched and their status written through the registry, like any other client's.
    pub registry: Registry,
    pub client: Client,
    pub pods: PodCache<Pod>,
    pub expectations: Expectations<PodSetKey>,
    pub queue: Arc<Queue<PodSetKey>>,
    pub recorder: events::Recorder,
    pub limiter: Option<governor::DefaultDirectRateLimiter>,
    pub cfg: ControllerConfig,
}

impl Context {
    /// Before a write to the main API server: waits for the client-side rate limit, then makes sure this replica
    /// still surely leads (it may have been stopped meanwhile).
    pub async fn before_write(&self) -> Result<(), reconcile::Error> {
        if let Some(l) = &self.limiter {
            l.until_ready().await;
        }
        match &self.cfg.leadership {
            Some(l) if !l.is_held() => Err(reconcile::Error::NotLeading),
            _ => Ok(()),
        }
    }
}

/// The owner reference that says who controls an object (`metav1.GetControllerOf`).
fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// Who controls a Pod, as its controller reference says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Controller {
    None,
    /// A PodSet of this name and UID: the UID tells it from a PodSet of the same name made since.
    PodSet {
        key: PodSetKey,
        uid: String,
    },
    /// Some other kind's: none of ours.
    Other,
}

fn controller(pod: &Pod) -> Controller {
    match controller_of(&pod.metadata) {
        None => Controller::None,
        // Any version of the group: the owner reference names the version it was written in, as kube's
        // controllers match their owners by group and kind.
        Some(r) if Version::of_api_version(&r.api_version).is_some() && r.kind == KIND => {
            Controller::PodSet { key: PodSetKey::new(pod.namespace().unwrap_or_default(), &r.name), uid: r.uid.clone() }
        }
        Some(_) => Controller::Other,
    }
}

/// What the Pod watch remembers of a Pod, to tell what changed: its controller and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    controller: Controller,
    labels: u64,
}

impl Seen {
    fn of(pod: &Pod) -> Self {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        Self { controller: controller(pod), labels: hasher.hash_one(pod.metadata.labels.as_ref()) }
    }
}

/// Runs until `shutdown` fires.
pub async fn run(registry: Registry, client: Client, cfg: ControllerConfig, shutdown: CancellationToken) {
    let (pods, writer) = reflector::store();
    let ctx = Arc::new(Context {
        registry,
        client: client.clone(),
        pods,
        expectations: Expectations::new(cfg.expectations_timeout),
        queue: Arc::new(Queue::named("podset")),
        recorder: events::Recorder::new(client.clone(), "podset-controller", std::env::var("HOSTNAME").ok()),
        limiter: std::num::NonZeroU32::new(cfg.qps).map(|qps| {
            let burst = std::num::NonZeroU32::new(cfg.burst.max(cfg.qps)).unwrap_or(qps);
            governor::RateLimiter::direct(governor::Quota::per_second(qps).allow_burst(burst))
        }),
        cfg,
    });

    // Registered here and dropped with their tasks: a controller that stops no longer holds readiness back.
    let (pods_synced, podsets_synced) = (ctx.cfg.informers.register("pods"), ctx.cfg.informers.register("podsets"));
    let pod_events = tokio::spawn(watch_pods(ctx.clone(), Api::<Pod>::all(client), writer, pods_synced));
    let podset_events = tokio::spawn(watch_podsets(ctx.clone(), podsets_synced));
    let resync = tokio::spawn(resync(ctx.clone()));
    let workers: Vec<_> = (0..ctx.cfg.workers.max(1)).map(|_| tokio::spawn(worker(ctx.clone()))).collect();
    tracing::info!(workers = ctx.cfg.workers, "controller started");
    shutdown.cancelled().await;
    for t in [pod_events, podset_events, resync].into_iter().chain(workers) {
        t.abort();
    }
    tracing::info!("controller stopped");
}

async fn worker(ctx: Arc<Context>) {
    // Reconcile only once the Pod cache has its first full list.
    ctx.pods.wait_until_ready().await.ok();
    loop {
        let key = ctx.queue.get().await;
        match reconcile::reconcile(&ctx, &key).await {
            Ok(()) => ctx.queue.forget(&key),
            Err(e) => {
                tracing::warn!(podset = %key, error = %e, "reconcile failed; will retry");
                ctx.queue.add_rate_limited(&key);
            }
        }
        ctx.queue.done(&key);
    }
}

async fn resync(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(ctx.cfg.resync);
    loop {
        tick.tick().await;
        if let Ok(list) = ctx.registry.list(ListRequest::readable()).await {
            for o in list.items {
                ctx.queue.add(&o.key());
            }
        }
    }
}

/// PodSet changes through the registry: list, then watch from the list's revision; relist if the watch expires.
async fn watch_podsets(ctx: Arc<Context>, synced: InformerHandle) {
    // client-go's reflector pacing (800 ms doubling to 30 s, with jitter), as the Pod watcher's `default_backoff`.
    let mut pace = watcher::DefaultBackoff::default();
    let wait = |pace: &mut watcher::DefaultBackoff| pace.next().unwrap_or(Duration::from_secs(30));
    loop {
        let list = match ctx.registry.list(ListRequest::readable()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing PodSets failed");
                tokio::time::sleep(wait(&mut pace)).await;
                continue;
            }
        };
        for o in &list.items {
            ctx.queue.add(&o.key());
        }
        synced.synced();
        let watch = WatchRequest { resource_version: Some(list.revision), ..Default::default() };
        let started = tokio::time::Instant::now();
        let mut events = match ctx.registry.watch(watch).await {
            Ok(w) => w.events,
            Err(e) => {
                tracing::warn!(error = %e, "watching PodSets failed");
                tokio::time::sleep(wait(&mut pace)).await;
                continue;
            }
        };
        while let Some(ev) = events.next().await {
            match ev {
                // Our own status writes come back here: they must not bypass the failure backoff.
                Ok(Notification::Event(ev)) if ev.only_status_changed() => {}
                Ok(Notification::Event(ev)) => ctx.queue.add(&ev.object.key()),
                Ok(Notification::Progress(_)) => {}
                Err(crate::registry::Error::Expired { .. }) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "PodSet watch failed");
                    break;
                }
            }
        }
        // A watch that ran a while was healthy: list again at once, and start the pacing over.
        if started.elapsed() >= HEALTHY_WATCH {
            pace.reset();
        } else {
            tokio::time::sleep(wait(&mut pace)).await;
        }
    }
}

/// A PodSet watch that lasted this long was healthy.
const HEALTHY_WATCH: Duration = Duration::from_secs(60);

/// The Pod reflector: keeps the cache, observes expectations, and enqueues the PodSets a Pod change concerns.
async fn watch_pods(ctx: Arc<Context>, api: Api<Pod>, writer: reflector::store::Writer<Pod>, synced: InformerHandle) {
    let mut config = watcher::Config::default();
    if let Some(sel) = &ctx.cfg.pod_selector {
        config = config.labels(sel);
    }
    let stream = watcher::watcher(api, config).default_backoff().reflect(writer);
    tokio::pin!(stream);
    // Every Pod seen, by UID; and during a relist, the ones the new list holds.
    let mut known: HashMap<String, Seen> = HashMap::new();
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "Pod watch failed; retrying with backoff");
                continue;
            }
        };
        match ev {
            Event::Init => relisted.clear(),
            Event::InitApply(pod) => {
                relisted.insert(pod.uid().unwrap_or_default());
                observe(&ctx, &mut known, &pod).await;
            }
            Event::Apply(pod) => observe(&ctx, &mut known, &pod).await,
            Event::Delete(pod) => {
                let uid = pod.uid().unwrap_or_default();
                known.remove(&uid);
                gone(&ctx, &Seen::of(&pod), &uid).await;
            }
            Event::InitDone => {
                // Deleted while the watch was down: the informer's `DeletedFinalStateUnknown`, so that expectations
                // waiting for these deletes do not hold their PodSet until they time out.
                for uid in missed(&known, &relisted) {
                    if let Some(seen) = known.remove(&uid) {
                        gone(&ctx, &seen, &uid).await;
                    }
                }
                relisted = HashSet::new();
                synced.synced();
            }
        }
    }
}

/// Upstream's `resolveControllerRef`: whether the PodSet a controller reference names is still that one.
async fn resolves(ctx: &Context, key: &PodSetKey, uid: &str) -> bool {
    ctx.registry.get(key, Some(0)).await.is_ok_and(|o| o.uid() == Some(uid))
}

/// A Pod added or changed (upstream's `addPod` and `updatePod`).
async fn observe(ctx: &Context, known: &mut HashMap<String, Seen>, pod: &Pod) {
    let uid = pod.uid().unwrap_or_default();
    let seen = Seen::of(pod);
    let before = known.insert(uid.clone(), seen.clone());
    for reaction in reactions(before.as_ref(), &seen, pod.metadata.deletion_timestamp.is_some()) {
        match reaction {
            Reaction::Left { key, uid: owner } => {
                if resolves(ctx, key, owner).await {
                    ctx.queue.add(key);
                }
            }
            Reaction::Owned { key, uid: owner, created, deleting } => {
                if !resolves(ctx, key, owner).await {
                    continue;
                }
                if created {
                    ctx.expectations.creation_observed(key);
                }
                if deleting {
                    ctx.expectations.deletion_observed(key, &uid);
                }
                ctx.queue.add(key);
            }
            Reaction::Orphan => enqueue_matching(ctx, pod).await,
        }
    }
}

/// What a Pod's change asks of the controller, before its controller reference is resolved.
#[derive(Debug, PartialEq, Eq)]
enum Reaction<'a> {
    /// It left this PodSet (released, or its reference edited): the PodSet may need a replacement.
    Left { key: &'a PodSetKey, uid: &'a str },
    /// It is this PodSet's: first seen (a create observed), or terminating (a delete observed).
    Owned { key: &'a PodSetKey, uid: &'a str, created: bool, deleting: bool },
    /// An orphan, first seen or with new labels or owners: the PodSets that select it may adopt it.
    Orphan,
}

fn reactions<'a>(before: Option<&'a Seen>, now: &'a Seen, deleting: bool) -> Vec<Reaction<'a>> {
    let mut out = Vec::new();
    let moved = before.is_some_and(|b| b.controller != now.controller);
    if let Some(Seen { controller: Controller::PodSet { key, uid }, .. }) = before.filter(|_| moved) {
        out.push(Reaction::Left { key, uid });
    }
    match &now.controller {
        Controller::PodSet { key, uid } => out.push(Reaction::Owned { key, uid, created: before.is_none(), deleting }),
        Controller::None if before.is_none_or(|b| moved || b.labels != now.labels) => out.push(Reaction::Orphan),
        Controller::None | Controller::Other => {}
    }
    out
}

/// The Pods known before a relist that its list no longer holds.
fn missed(known: &HashMap<String, Seen>, relisted: &HashSet<String>) -> Vec<String> {
    known.keys().filter(|uid| !relisted.contains(*uid)).cloned().collect()
}

/// A Pod deleted (upstream's `deletePod`).
async fn gone(ctx: &Context, seen: &Seen, uid: &str) {
    if let Controller::PodSet { key, uid: owner } = &seen.controller {
        if resolves(ctx, key, owner).await {
            ctx.expectations.deletion_observed(key, uid);
            ctx.queue.add(key);
        }
    }
}

/// An orphan Pod: every PodSet in its namespace whose selector matches may adopt it.
async fn enqueue_matching(ctx: &Context, pod: &Pod) {
    let Some(ns) = pod.namespace() else { return };
    let labels = pod.labels().clone();
    let Ok(list) = ctx.registry.list(ListRequest { namespace: Some(ns), ..ListRequest::readable() }).await else {
        return;
    };
    for o in list.items {
        let Ok(ps) = o.decode::<PodSetStrategy>() else { continue };
        if ps.selector().is_some_and(|s| !s.is_empty() && s.matches(&labels)) {
            ctx.queue.add(&o.key());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner: Option<(&str, &str, &str)>, labels: serde_json::Value) -> Pod {
        let owners: Vec<_> = owner
            .map(|(kind, name, uid)| json!({"apiVersion": crate::api::API_VERSION, "kind": kind, "name": name, "uid": uid, "controller": true}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "pod-1",
            "labels": labels, "ownerReferences": owners}}))
        .unwrap()
    }

    // Mirrors the ReplicaSet controller's addPod and updatePod: the owner by name and UID, the PodSet a Pod left
    // queued too, orphans offered for adoption only when first seen or when their labels or owners change.
    #[test]
    fn a_pod_change_concerns_its_owner_the_owner_it_left_or_the_podsets_that_may_adopt_it() {
        let web = PodSetKey::new("ns", "web");
        let owned = Seen::of(&pod(Some((KIND, "web", "u1")), json!({"app": "web"})));
        let orphan = Seen::of(&pod(None, json!({"app": "web"})));
        let relabelled = Seen::of(&pod(None, json!({"app": "db"})));
        let others = Seen::of(&pod(Some(("ReplicaSet", "rs", "u9")), json!({"app": "web"})));
        assert_eq!(owned.controller, Controller::PodSet { key: web.clone(), uid: "u1".into() });
        assert_eq!(others.controller, Controller::Other);

        let owned_by = |created, deleting| Reaction::Owned { key: &web, uid: "u1", created, deleting };
        assert_eq!(reactions(None, &owned, false), [owned_by(true, false)], "first seen: a create observed");
        assert_eq!(reactions(Some(&owned), &owned, false), [owned_by(false, false)]);
        assert_eq!(reactions(Some(&owned), &owned, true), [owned_by(false, true)], "terminating: a delete observed");
        assert_eq!(
            reactions(Some(&owned), &orphan, false),
            [Reaction::Left { key: &web, uid: "u1" }, Reaction::Orphan]
        );

        assert_eq!(reactions(None, &orphan, false), [Reaction::Orphan]);
        assert_eq!(reactions(Some(&orphan), &orphan, false), [], "a status change of an orphan adopts nothing new");
        assert_eq!(reactions(Some(&orphan), &relabelled, false), [Reaction::Orphan]);
        assert_eq!(reactions(Some(&orphan), &owned, false), [owned_by(false, false)], "adopted: no create");
        assert_eq!(reactions(None, &others, false), [], "another controller's Pod is none of ours");
    }

    // The informer's DeletedFinalStateUnknown: Pods gone while the watch was down are deletes too.
    #[test]
    fn a_relist_reports_the_pods_it_no_longer_holds() {
        let seen = Seen::of(&pod(None, json!({})));
        let known: HashMap<String, Seen> = ["a", "b", "c"].map(|u| (u.to_owned(), seen.clone())).into();
        let relisted: HashSet<String> = ["a", "c", "d"].map(str::to_owned).into();
        assert_eq!(missed(&known, &relisted), ["b"]);
    }
}
