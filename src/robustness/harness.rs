//! The robustness harness: a three-member etcd cluster, replicas of podset-apiserver on it behind the real
//! aggregator with the controller on, clients and watches on every replica and through kube-apiserver, and faults
//! drawn from a seed. Everything runs inside the envtest network namespace ([`crate::envtest::namespace_command`]).
//! The run's [`History`] goes to [`super::check`].

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::etcd_cluster::EtcdCluster;
use super::history::{
    Change, History, Operation, PodCount, ReadFrom, ReplicaStart, ReplicasSet, Request, Response, Seen, Settled, Watch,
    WatchItem, AGGREGATOR, ANSWER_WITHIN, NEVER,
};
use crate::api::PodSet;
use crate::envtest::{assets_dir, Cluster, ServerCommand, REPLICA_IPS};

/// The annotation each client write sets to a value of its own.
pub const MARKER: &str = "robustness.demo.k8s.io/marker";
const NAMESPACE: &str = "default";
/// Where PodSets live in etcd (`--etcd-prefix` /registry).
const ETCD_PREFIX: &str = "/registry/demo.k8s.io/podsets/";
/// A request without an answer by then is lost.
const CALL_TIMEOUT: Duration = Duration::from_nanos(ANSWER_WITHIN);
/// A pause outlasts the controller's Lease (15 s) and the server's request timeout (30 s).
const PAUSE: Duration = Duration::from_secs(32);

fn replica_route(i: usize) -> String {
    format!("replica {i}")
}

/// Replica `i` dials etcd at this address, so it can be cut off (or slowed) alone.
fn etcd_route(i: usize) -> String {
    format!("10.250.2.{}", i + 1)
}

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// podset-apiserver replicas (2 or 3).
    pub replicas: usize,
    pub clients: usize,
    pub watchers: usize,
    /// PodSets the clients fight over.
    pub keys: usize,
    pub faults: usize,
    /// Faults every run has, in the first slots; the rest are drawn from the seed.
    pub fixed: Vec<Fault>,
    /// The faults happen within this window; traffic goes on a while after.
    pub fault_window: Duration,
    pub server: ServerCommand,
}

impl Options {
    /// A few faults, for CI.
    pub fn short(seed: u64, server: ServerCommand) -> Self {
        Self {
            seed,
            replicas: 2,
            clients: 4,
            watchers: 2,
            keys: 6,
            faults: 3,
            // The two classes users fear most: a paused leader, and etcd losing its leader.
            fixed: vec![Fault::PauseLeader, Fault::KillEtcdLeader],
            fault_window: Duration::from_secs(108),
            server,
        }
    }

    /// More of everything, for the long form.
    pub fn long(seed: u64, server: ServerCommand) -> Self {
        Self {
            replicas: 3,
            clients: 6,
            watchers: 3,
            keys: 8,
            faults: 5,
            fixed: Vec::new(),
            fault_window: Duration::from_secs(180),
            ..Self::short(seed, server)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a replica, start it again later.
    KillReplica(usize),
    /// SIGSTOP the replica leading the controller longer than its Lease, then SIGCONT.
    PauseLeader,
    PauseReplica(usize),
    /// Drop every packet between a replica and etcd, and between it and its clients.
    PartitionReplica(usize),
    /// Every packet to a replica, from etcd and from clients, through a 256 kbit/s link.
    SlowReplica(usize),
    KillEtcdMember(usize),
    KillEtcdLeader,
    /// SIGTERM a member and start it again at once.
    RestartEtcdMember(usize),
}

/// One fault in the schedule: when it starts (from the start of traffic), what, for how long.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
    pub lasts: Duration,
}

/// The faults a seed gives: one per slot of the window, each ending within its slot.
pub fn plan(opts: &Options) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let slot = opts.fault_window / opts.faults.max(1) as u32;
    (0..opts.faults)
        .map(|n| {
            let r = rng.random_range(0..opts.replicas);
            let m = rng.random_range(0..3);
            let drawn = [
                Fault::KillReplica(r),
                Fault::PauseLeader,
                Fault::PauseReplica(r),
                Fault::PartitionReplica(r),
                Fault::SlowReplica(r),
                Fault::KillEtcdMember(m),
                Fault::KillEtcdLeader,
                Fault::RestartEtcdMember(m),
            ][rng.random_range(0..8)];
            let fault = opts.fixed.get(n).copied().unwrap_or(drawn);
            let secs = |rng: &mut StdRng, lo, hi| Duration::from_secs(rng.random_range(lo..hi));
            let lasts = match fault {
                Fault::KillReplica(_) => secs(&mut rng, 2, 8),
                Fault::PauseLeader | Fault::PauseReplica(_) => PAUSE,
                Fault::PartitionReplica(_) => secs(&mut rng, 5, 20),
                Fault::SlowReplica(_) => secs(&mut rng, 5, 15),
                Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => secs(&mut rng, 2, 10),
                Fault::RestartEtcdMember(_) => Duration::ZERO,
            };
            let lasts = lasts.min(slot.saturating_sub(Duration::from_secs(2)));
            let room = (slot - lasts).as_millis().max(1) as u64;
            Planned { at: slot * n as u32 + Duration::from_millis(rng.random_range(0..room)), fault, lasts }
        })
        .collect()
}

/// Calls, watches and Pod counts as they happen.
struct Recorder {
    start: Instant,
    operations: Mutex<Vec<Operation>>,
    watches: Mutex<Vec<Watch>>,
    pod_counts: Mutex<Vec<PodCount>>,
    /// (marker, the write) for every write of spec.replicas, answered or lost.
    replicas_sets: Mutex<Vec<(String, ReplicasSet)>>,
    /// The newest revision a client saw, for watches to start near.
    latest: AtomicU64,
    /// Each replica process's start, for where its cache begins.
    replica_starts: Mutex<Vec<ReplicaStart>>,
}

impl Recorder {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn saw(&self, rv: u64) {
        self.latest.fetch_max(rv, Ordering::Relaxed);
    }
}

/// Where a client sends its requests.
#[derive(Clone)]
struct Route {
    name: String,
    client: kube::Client,
}

fn seen(ps: &PodSet) -> Option<Seen> {
    let resource_version = ps.metadata.resource_version.as_deref()?.parse().ok()?;
    let marker = ps.metadata.annotations.as_ref().and_then(|a| a.get(MARKER)).cloned().unwrap_or_default();
    Some(Seen { resource_version, marker })
}

fn key_of(ps: &PodSet) -> String {
    format!("{}/{}", ps.metadata.namespace.as_deref().unwrap_or(NAMESPACE), ps.metadata.name.as_deref().unwrap_or(""))
}

/// What an error says happened; anything but a definite answer from our server is a lost answer.
fn failure(e: &kube::Error) -> Response {
    let kube::Error::Api(s) = e else { return Response::Lost };
    match (s.code, s.reason.as_str()) {
        // The aggregator's own 404s (no route) say nothing about the object.
        (404, "NotFound") if s.message.contains("podsets") => Response::NotFound,
        (409, "AlreadyExists") => Response::AlreadyExists,
        (409, "Conflict") => Response::Conflict,
        (c, _) if c >= 500 || c == 429 || c == 404 => Response::Lost,
        (c, r) => Response::Refused(format!("{c} {r}: {}", s.message)),
    }
}

fn object(r: Result<PodSet, kube::Error>) -> Response {
    match r {
        Ok(ps) => seen(&ps).map_or_else(|| Response::Refused("no resourceVersion".into()), Response::Object),
        Err(e) => failure(&e),
    }
}

fn podset(name: &str, marker: &str, replicas: u32) -> serde_json::Value {
    json!({
        "apiVersion": "demo.k8s.io/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {MARKER: marker}},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    })
}

struct Client {
    id: usize,
    routes: Arc<Vec<Route>>,
    rec: Arc<Recorder>,
    rng: StdRng,
    keys: usize,
    seq: u64,
}

impl Client {
    /// Times `call`, records it, and returns its answer.
    async fn call<F>(&self, route: &Route, request: Request, call: F) -> Response
    where
        F: std::future::Future<Output = Response>,
    {
        let start = self.rec.now();
        let response = tokio::time::timeout(CALL_TIMEOUT, call).await.unwrap_or(Response::Lost);
        let ret = if response == Response::Lost { NEVER } else { self.rec.now() };
        match &response {
            Response::Object(s) => self.rec.saw(s.resource_version),
            Response::List { resource_version, .. } => self.rec.saw(*resource_version),
            _ => {}
        }
        if let (Some(key), Some(marker), Some(replicas)) = (request.key(), request.marker(), self.replicas_of(&request))
        {
            if matches!(response, Response::Object(_) | Response::Lost) {
                let set = ReplicasSet { key: key.to_owned(), call: start, ret, replicas };
                self.rec.replicas_sets.lock().unwrap().push((marker.to_owned(), set));
            }
        }
        let answer = response.clone();
        let op = Operation { client: self.id, route: route.name.clone(), call: start, ret, request, response };
        self.rec.operations.lock().unwrap().push(op);
        answer
    }

    /// The replicas a write sets: its marker says (`c<client>-<seq>-r<replicas>`).
    fn replicas_of(&self, request: &Request) -> Option<u32> {
        request.marker()?.rsplit_once("-r")?.1.parse().ok()
    }

    async fn step(&mut self) {
        let route = self.routes[self.rng.random_range(0..self.routes.len())].clone();
        let api: Api<PodSet> = Api::namespaced(route.client.clone(), NAMESPACE);
        let name = format!("ps-{}", self.rng.random_range(0..self.keys));
        let key = format!("{NAMESPACE}/{name}");
        self.seq += 1;
        let replicas = self.rng.random_range(0..=3u32);
        let marker = format!("c{}-{}-r{replicas}", self.id, self.seq);
        let latest = self.rec.latest.load(Ordering::Relaxed);
        match self.rng.random_range(0..100) {
            0..10 => {
                let ps: PodSet = serde_json::from_value(podset(&name, &marker, replicas)).unwrap();
                let req = Request::Create { key, marker };
                self.call(&route, req, async { object(api.create(&PostParams::default(), &ps).await) }).await;
            }
            10..40 => {
                let (from, rv) = match self.rng.random_range(0..6) {
                    0 => (ReadFrom::Any, Some("0".to_owned())),
                    1 if latest > 0 => (ReadFrom::AtLeast(latest), Some(latest.to_string())),
                    _ => (ReadFrom::Latest, None),
                };
                let gp = GetParams { resource_version: rv };
                self.call(&route, Request::Get { key, from }, async { object(api.get_with(&name, &gp).await) }).await;
            }
            40..50 => {
                let any = self.rng.random_range(0..4) == 0;
                let limit = self.rng.random_range(1..4);
                let from = if any { ReadFrom::Any } else { ReadFrom::Latest };
                let req = Request::List { namespace: NAMESPACE.into(), from };
                self.call(&route, req, list(&api, any, limit)).await;
            }
            50..70 => {
                // Read, then write back with the resourceVersion read as the precondition.
                let got = Mutex::new(None);
                let req = Request::Get { key: key.clone(), from: ReadFrom::Latest };
                let read = self
                    .call(&route, req, async {
                        let r = api.get(&name).await;
                        *got.lock().unwrap() = r.as_ref().ok().cloned();
                        object(r)
                    })
                    .await;
                let (Response::Object(s), Some(mut ps)) = (read, got.into_inner().unwrap()) else { return };
                ps.metadata.annotations.get_or_insert_with(Default::default).insert(MARKER.into(), marker.clone());
                ps.spec.replicas = Some(replicas as i32);
                let req = Request::Update { key, marker, precondition: Some(s.resource_version) };
                self.call(&route, req, async { object(api.replace(&name, &PostParams::default(), &ps).await) }).await;
            }
            70..80 => {
                let patch = json!({"metadata": {"annotations": {MARKER: marker}}, "spec": {"replicas": replicas}});
                let req = Request::Patch { key, marker };
                let pp = PatchParams::default();
                self.call(&route, req, async { object(api.patch(&name, &pp, &Patch::Merge(&patch)).await) }).await;
            }
            80..90 => {
                let body = podset(&name, &marker, replicas);
                let req = Request::Apply { key, marker };
                let pp = PatchParams::apply("robustness").force();
                self.call(&route, req, async { object(api.patch(&name, &pp, &Patch::Apply(&body)).await) }).await;
            }
            _ => {
                let precondition = if self.rng.random_bool(0.5) {
                    let req = Request::Get { key: key.clone(), from: ReadFrom::Latest };
                    match self.call(&route, req, async { object(api.get(&name).await) }).await {
                        Response::Object(s) => Some(s.resource_version),
                        _ => return,
                    }
                } else {
                    None
                };
                let dp = DeleteParams {
                    preconditions: precondition
                        .map(|rv| Preconditions { resource_version: Some(rv.to_string()), uid: None }),
                    ..Default::default()
                };
                let req = Request::Delete { key, precondition };
                self.call(&route, req, async {
                    match api.delete(&name, &dp).await {
                        Ok(done) => match done.left().as_ref().map(seen) {
                            Some(Some(s)) => Response::Deleted { resource_version: s.resource_version },
                            Some(None) => Response::Refused("a deleted object without a resourceVersion".into()),
                            // A Status: deleted, at a revision it does not say.
                            None => Response::Gone,
                        },
                        Err(e) => failure(&e),
                    }
                })
                .await;
            }
        }
    }
}

/// A namespace's list, page by page (`any`: `resourceVersion=0`, one page).
async fn list(api: &Api<PodSet>, any: bool, limit: u32) -> Response {
    let mut items = Vec::new();
    let mut lp = if any { ListParams::default().match_any() } else { ListParams::default().limit(limit) };
    let mut at = None;
    loop {
        let page = match api.list(&lp).await {
            Ok(p) => p,
            Err(e) => return failure(&e),
        };
        let rv = page.metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok());
        at = at.or(rv);
        for ps in &page.items {
            match seen(ps) {
                Some(s) => items.push((key_of(ps), s)),
                None => return Response::Refused("an item without a resourceVersion".into()),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(limit).continue_token(&c),
            None => break,
        }
    }
    match at {
        Some(resource_version) => Response::List { resource_version, items },
        None => Response::Refused("a list without a resourceVersion".into()),
    }
}

/// Watches from a revision seen, a few seconds each, one after another.
async fn watcher(id: usize, routes: Arc<Vec<Route>>, rec: Arc<Recorder>, mut rng: StdRng, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let latest = rec.latest.load(Ordering::Relaxed);
        if latest == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let route = routes[rng.random_range(0..routes.len())].clone();
        let api: Api<PodSet> = Api::namespaced(route.client.clone(), NAMESPACE);
        // Mostly near the newest revision; sometimes far back, to replay (or be told 410 by a cache that started
        // later).
        let from = if rng.random_range(0..5) == 0 {
            rng.random_range(1..=latest)
        } else {
            latest.saturating_sub(rng.random_range(0..40)).max(1)
        };
        let wp = WatchParams::default().timeout(rng.random_range(3..10));
        let call = rec.now();
        let mut items = Vec::new();
        match tokio::time::timeout(CALL_TIMEOUT, api.watch(&wp, &from.to_string())).await {
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => items.push(WatchItem::Expired),
            Ok(Err(_)) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Ok(Ok(stream)) => {
                let mut stream = stream.boxed();
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => break,
                        n = tokio::time::timeout(Duration::from_secs(15), stream.next()) => n,
                    };
                    let item = match next {
                        Ok(Some(Ok(WatchEvent::Added(ps)))) => {
                            seen(&ps).map(|s| WatchItem::Added { key: key_of(&ps), seen: s })
                        }
                        Ok(Some(Ok(WatchEvent::Modified(ps)))) => {
                            seen(&ps).map(|s| WatchItem::Modified { key: key_of(&ps), seen: s })
                        }
                        Ok(Some(Ok(WatchEvent::Deleted(ps)))) => seen(&ps)
                            .map(|s| WatchItem::Deleted { key: key_of(&ps), resource_version: s.resource_version }),
                        Ok(Some(Ok(WatchEvent::Bookmark(b)))) => b
                            .metadata
                            .resource_version
                            .parse()
                            .ok()
                            .map(|rv| WatchItem::Bookmark { resource_version: rv }),
                        Ok(Some(Ok(WatchEvent::Error(s)))) if s.code == 410 => {
                            items.push(WatchItem::Expired);
                            break;
                        }
                        _ => break,
                    };
                    match item {
                        Some(i) => items.push(i),
                        None => break,
                    }
                }
            }
        }
        rec.watches.lock().unwrap().push(Watch {
            client: id,
            route: route.name.clone(),
            namespace: NAMESPACE.into(),
            from,
            call,
            items,
        });
    }
}

/// The Pods each PodSet owns (controller reference to its uid, not terminating), with the PodSets read first.
async fn census(podsets: &Api<PodSet>, pods: &Api<Pod>) -> Option<Vec<(PodSet, u32)>> {
    let sets = podsets.list(&ListParams::default()).await.ok()?;
    let pods = pods.list(&ListParams::default()).await.ok()?;
    let mut owned: HashMap<String, u32> = HashMap::new();
    for p in &pods.items {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if p.metadata.deletion_timestamp.is_some() || !(phase == "Pending" || phase == "Running") {
            continue;
        }
        for r in p.metadata.owner_references.iter().flatten() {
            if r.controller == Some(true) && r.kind == "PodSet" {
                *owned.entry(r.uid.clone()).or_default() += 1;
            }
        }
    }
    Some(
        sets.items
            .into_iter()
            .map(|ps| {
                let n = ps.metadata.uid.as_ref().and_then(|u| owned.get(u)).copied().unwrap_or(0);
                (ps, n)
            })
            .collect(),
    )
}

async fn sampler(podsets: Api<PodSet>, pods: Api<Pod>, rec: Arc<Recorder>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let call = rec.now();
        if let Ok(Some(census)) = tokio::time::timeout(CALL_TIMEOUT, census(&podsets, &pods)).await {
            let ret = rec.now();
            let mut counts = rec.pod_counts.lock().unwrap();
            counts.extend(census.iter().map(|(ps, n)| {
                let replicas = ps.spec.replicas.unwrap_or(1) as u32;
                let status = ps.status.as_ref();
                let settled = status
                    .is_some_and(|s| s.observed_generation == ps.metadata.generation && s.replicas as u32 == replicas);
                PodCount { key: key_of(ps), call, ret, active: *n, replicas, settled }
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

fn sh(cmd: &str) {
    let status = Command::new("sh").args(["-c", cmd]).status().expect("sh");
    assert!(status.success(), "`{cmd}` failed: {status}");
}

/// A client straight at replica `i` with a client certificate, without kube-rs's retries.
fn replica_client(c: &Cluster, i: usize, (cert, key): &(String, String)) -> kube::Client {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let addr = format!("https://{}:{}", REPLICA_IPS[i], c.podset_addr.port());
    let mut config = kube::Config::new(addr.parse().expect("address"));
    let ca = crate::apiserver::tls::read_certs(&c.podset_ca()).expect("our CA");
    config.root_cert = Some(ca.iter().map(|c| c.to_vec()).collect());
    config.auth_info.client_certificate_data = Some(b64(cert));
    config.auth_info.client_key_data = Some(b64(key).into());
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

/// A fault, done and undone; returns what happened, for the report.
fn inject(c: &mut Cluster, etcd: &mut EtcdCluster, rt: &tokio::runtime::Runtime, rec: &Recorder, p: Planned) -> String {
    let port = c.podset_addr.port();
    let what = match p.fault {
        Fault::KillReplica(i) => {
            c.kill_replica(i);
            std::thread::sleep(p.lasts);
            rec.replica_starts.lock().unwrap().push(ReplicaStart { route: replica_route(i), at: rec.now() });
            c.start_replica(i);
            format!("kill -9 replica {i}, started again after {:?}", p.lasts)
        }
        Fault::PauseLeader | Fault::PauseReplica(_) => {
            let i = match p.fault {
                Fault::PauseReplica(i) => i,
                _ => c.controller_leader().unwrap_or(0),
            };
            let pid = c.replica_pid(i).expect("replica runs").to_string();
            sh(&format!("kill -STOP {pid}"));
            std::thread::sleep(p.lasts);
            sh(&format!("kill -CONT {pid}"));
            let leader = if p.fault == Fault::PauseLeader { " (the controller's leader)" } else { "" };
            format!("SIGSTOP replica {i}{leader} for {:?}, then SIGCONT", p.lasts)
        }
        Fault::PartitionReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            sh(&format!(
                "iptables -I OUTPUT -d {ip} -p tcp --dport {port} -j DROP && iptables -I OUTPUT -d {route} -j DROP"
            ));
            std::thread::sleep(p.lasts);
            sh(&format!(
                "iptables -D OUTPUT -d {ip} -p tcp --dport {port} -j DROP && iptables -D OUTPUT -d {route} -j DROP"
            ));
            format!("cut replica {i} from etcd and its clients for {:?}", p.lasts)
        }
        Fault::SlowReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            // A rate limit, not netem's delay: netem is not in every kernel (not in the sandboxes CI runs in).
            sh(&format!(
                "tc qdisc add dev lo root handle 1: htb default 10 && \
                 tc class add dev lo parent 1: classid 1:10 htb rate 10gbit quantum 60000 && \
                 tc class add dev lo parent 1: classid 1:20 htb rate 256kbit && \
                 tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {ip}/32 flowid 1:20 && \
                 tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {route}/32 flowid 1:20"
            ));
            std::thread::sleep(p.lasts);
            sh("tc qdisc del dev lo root");
            format!("replica {i}'s packets (from clients and etcd) throttled to 256 kbit/s for {:?}", p.lasts)
        }
        Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => {
            let (m, leader) = match p.fault {
                Fault::KillEtcdMember(m) => (m, ""),
                _ => (rt.block_on(etcd.leader()).unwrap_or(0), " (the leader)"),
            };
            etcd.kill(m);
            std::thread::sleep(p.lasts);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            format!("kill -9 etcd member {m}{leader}, started again after {:?}", p.lasts)
        }
        Fault::RestartEtcdMember(m) => {
            etcd.stop(m);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            format!("restart etcd member {m} (SIGTERM)")
        }
    };
    what
}

/// Every change to PodSets, in order, from etcd's history (nothing is compacted during a run).
async fn etcd_changes(endpoints: Vec<String>) -> Vec<Change> {
    let mut client = etcd_client::Client::connect(endpoints, None).await.expect("etcd");
    let head = client.get("/", None).await.expect("etcd revision").header().expect("header").revision();
    let opts = etcd_client::WatchOptions::new().with_prefix().with_start_revision(1);
    let mut stream = client.watch(ETCD_PREFIX, Some(opts)).await.expect("etcd watch");
    let mut changes = Vec::new();
    let mut last = 0;
    while last < head {
        // Every write of ours bumps the revision with a PodSet change, so the last one is at the head; a silence
        // means there is no more.
        let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_secs(5), stream.message()).await else { break };
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).trim_start_matches(ETCD_PREFIX).to_owned();
            last = last.max(kv.mod_revision());
            let marker = match ev.event_type() {
                etcd_client::EventType::Delete => None,
                etcd_client::EventType::Put => {
                    let v: serde_json::Value = serde_json::from_slice(kv.value()).unwrap_or_default();
                    Some(v["metadata"]["annotations"][MARKER].as_str().unwrap_or_default().to_owned())
                }
            };
            changes.push(Change { resource_version: kv.mod_revision() as u64, key, marker });
        }
    }
    changes
}

/// What one run did, beside its history.
pub struct Run {
    pub history: History,
    pub faults: Vec<String>,
    pub took: Duration,
}

/// Runs the cluster, the traffic and the faults of `opts.seed`, and returns the history. Inside the namespace.
pub fn run(opts: &Options) -> Run {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    for i in 0..opts.replicas {
        sh(&format!("ip addr replace {}/32 dev lo", etcd_route(i)));
    }
    let mut etcd = EtcdCluster::start(&assets_dir().join("etcd"), dir.path(), 3);
    let servers: Vec<String> = (0..opts.replicas)
        .map(|i| {
            (0..etcd.len())
                .map(|m| format!("http://{}:{}", etcd_route(i), etcd.client_port(m)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let mut server = opts.server.clone();
    // No compaction: etcd's history is the record the checker reads back. Caches keep all of a run's history
    // too, so each begins where its process read the store, and a watch from later must never be told 410.
    server.args.extend(
        ["--etcd-compaction-interval=0", "--watch-history-seconds=3600", "--watch-history-max-bytes=1073741824"]
            .map(Into::into),
    );
    let mut c = Cluster::start_replicated_on(server, opts.replicas, servers);
    c.wait_for("a controller leader", Duration::from_secs(60), |c| c.controller_leader().is_some());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let admin = c.client_cert("ca", "robustness", Some("system:masters"));
    let (routes, main) = rt.block_on(async {
        let mut routes: Vec<Route> = (0..opts.replicas)
            .map(|i| Route { name: replica_route(i), client: replica_client(&c, i, &admin) })
            .collect();
        let mut config = c.config().await;
        // One call, one request: kube-rs retries 503s and 504s by default, even writes that may have been applied.
        config.default_retry = false;
        let main = kube::Client::try_from(config).expect("client");
        routes.push(Route { name: AGGREGATOR.into(), client: main.clone() });
        (Arc::new(routes), main)
    });
    let rec = Arc::new(Recorder {
        start: Instant::now(),
        operations: Mutex::default(),
        watches: Mutex::default(),
        pod_counts: Mutex::default(),
        replicas_sets: Mutex::default(),
        latest: AtomicU64::new(0),
        replica_starts: Mutex::new(
            (0..opts.replicas).map(|i| ReplicaStart { route: replica_route(i), at: 0 }).collect(),
        ),
    });
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for id in 0..opts.clients {
        let mut client = Client {
            id,
            routes: routes.clone(),
            rec: rec.clone(),
            rng: StdRng::seed_from_u64(opts.seed ^ ((id as u64 + 1) << 32)),
            keys: opts.keys,
            seq: 0,
        };
        let stop = stop.clone();
        tasks.push(rt.spawn(async move {
            while !stop.is_cancelled() {
                client.step().await;
            }
        }));
    }
    for w in 0..opts.watchers {
        let rng = StdRng::seed_from_u64(opts.seed ^ ((w as u64 + 100) << 32));
        tasks.push(rt.spawn(watcher(opts.clients + w, routes.clone(), rec.clone(), rng, stop.clone())));
    }
    let podsets: Api<PodSet> = Api::namespaced(main.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(main.clone(), NAMESPACE);
    tasks.push(rt.spawn(sampler(podsets.clone(), pods.clone(), rec.clone(), stop.clone())));

    let mut faults = Vec::new();
    for p in plan(opts) {
        let wait = p.at.saturating_sub(rec.start.elapsed());
        std::thread::sleep(wait);
        let at = rec.start.elapsed();
        let what = inject(&mut c, &mut etcd, &rt, &rec, p);
        faults.push(format!("{:>6.1}s: {what}", at.as_secs_f64()));
    }
    // Traffic on a healed system for a while, then quiet until it settles.
    std::thread::sleep((opts.fault_window + Duration::from_secs(10)).saturating_sub(rec.start.elapsed()));
    stop.cancel();
    rt.block_on(async {
        for t in tasks {
            let _ = t.await;
        }
    });
    let settle_deadline = Instant::now() + Duration::from_secs(120);
    let settled = loop {
        let census = rt.block_on(census(&podsets, &pods)).unwrap_or_default();
        let settled: Vec<Settled> = census
            .iter()
            .map(|(ps, active)| Settled {
                key: key_of(ps),
                generation: ps.metadata.generation.unwrap_or(0),
                replicas: ps.spec.replicas.unwrap_or(1) as u32,
                active: *active,
                status_replicas: ps.status.as_ref().map(|s| s.replicas as u32),
                observed_generation: ps.status.as_ref().and_then(|s| s.observed_generation),
            })
            .collect();
        let done = settled.iter().all(|s| {
            s.active == s.replicas
                && s.status_replicas == Some(s.replicas)
                && s.observed_generation == Some(s.generation)
        });
        if done || Instant::now() > settle_deadline {
            break settled;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let changes = rt.block_on(etcd_changes(etcd.endpoints()));

    let made: std::collections::HashSet<&str> = changes.iter().filter_map(|ch| ch.marker.as_deref()).collect();
    let replicas_sets = rec
        .replicas_sets
        .lock()
        .unwrap()
        .iter()
        .filter(|(marker, s)| s.ret != NEVER || made.contains(marker.as_str()))
        .map(|(_, s)| s.clone())
        .collect();
    let history = History {
        seed: opts.seed,
        operations: std::mem::take(&mut *rec.operations.lock().unwrap()),
        watches: std::mem::take(&mut *rec.watches.lock().unwrap()),
        changes,
        replica_starts: std::mem::take(&mut *rec.replica_starts.lock().unwrap()),
        pod_counts: std::mem::take(&mut *rec.pod_counts.lock().unwrap()),
        replicas_sets,
        reconcile_grace: Duration::from_secs(30).as_nanos() as u64,
        settled,
    };
    drop(c);
    drop(etcd);
    Run { history, faults, took: started.elapsed() }
}
