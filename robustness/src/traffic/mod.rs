//! The clients' traffic: each client's calls (creates, reads, lists, conditional updates, patches, applies,
//! deletes) on a few contended PodSets through a random route, each call timed and recorded with its answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{
    Api, DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions, VersionMatch,
};
use podset_apiserver::api::PodSet;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use crate::model::history::{
    group_of, Compaction, Defragmentation, Operation, PodCount, ReadFrom, ReplicaStart, ReplicasSet, Request, Response,
    RolloutStep, Seen, VersionAnswer, Watch, ANSWER_WITHIN, GROUP_LABEL, NEVER,
};

mod census;
mod versions;
mod watch;

pub(crate) use census::{census, sampler};
pub(crate) use podset_apiserver::api::conversion::MIN_READY_SECONDS;
pub(crate) use versions::{prober, Serving, VersionClient, VERSIONS_NAMESPACE};
pub(crate) use watch::{watcher, Informer};

/// The annotation each client write sets to a value of its own.
pub const MARKER: &str = "robustness.demo.k8s.io/marker";
/// The namespaces the clients write in; the first also holds the Pods' census... of every namespace.
pub(crate) const NAMESPACES: [&str; 2] = ["default", "robustness"];
/// A request without an answer by then is lost.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_nanos(ANSWER_WITHIN);

pub(crate) fn replica_route(i: usize) -> String {
    format!("replica {i}")
}

/// Calls, watches and Pod counts as they happen.
pub(crate) struct Recorder {
    pub(crate) start: Instant,
    pub(crate) operations: Mutex<Vec<Operation>>,
    pub(crate) watches: Mutex<Vec<Watch>>,
    pub(crate) pod_counts: Mutex<Vec<PodCount>>,
    /// (marker, the write) for every write of spec.replicas, answered or lost; `/scale` writes have no marker.
    pub(crate) replicas_sets: Mutex<Vec<(Option<String>, ReplicasSet)>>,
    /// The newest revision a client saw, for watches to start near.
    pub(crate) latest: AtomicU64,
    /// Each replica process's start (or its cache's reload), for where its cache begins.
    pub(crate) replica_starts: Mutex<Vec<ReplicaStart>>,
    pub(crate) compactions: Mutex<Vec<Compaction>>,
    pub(crate) defragmentations: Mutex<Vec<Defragmentation>>,
    pub(crate) version_answers: Mutex<Vec<VersionAnswer>>,
    pub(crate) rollout: Mutex<Vec<RolloutStep>>,
}

impl Recorder {
    pub(crate) fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn saw(&self, rv: u64) {
        self.latest.fetch_max(rv, Ordering::Relaxed);
    }
}

/// Where a client sends its requests.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) name: String,
    pub(crate) client: kube::Client,
}

pub(crate) fn seen(ps: &PodSet) -> Option<Seen> {
    seen_meta(&ps.metadata)
}

pub(crate) fn seen_meta(meta: &kube::core::ObjectMeta) -> Option<Seen> {
    let resource_version = meta.resource_version.as_deref()?.parse().ok()?;
    let marker = meta.annotations.as_ref().and_then(|a| a.get(MARKER)).cloned().unwrap_or_default();
    Some(Seen { resource_version, marker })
}

pub(crate) fn key_of(ps: &PodSet) -> String {
    format!("{}/{}", ps.metadata.namespace.as_deref().unwrap_or(""), ps.metadata.name.as_deref().unwrap_or(""))
}

/// What an error says happened; anything but a definite answer from our server is a lost answer.
pub(crate) fn failure(e: &kube::Error) -> Response {
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

pub(crate) fn object(r: Result<PodSet, kube::Error>) -> Response {
    match r {
        Ok(ps) => seen(&ps).map_or_else(|| Response::Refused("no resourceVersion".into()), Response::Object),
        Err(e) => failure(&e),
    }
}

pub(crate) fn podset(namespace: &str, name: &str, marker: &str, replicas: u32) -> serde_json::Value {
    json!({
        "apiVersion": "demo.k8s.io/v1alpha1",
        "kind": "PodSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {MARKER: marker},
            "labels": {GROUP_LABEL: group_of(name)},
        },
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    })
}

pub(crate) struct Client {
    pub(crate) id: usize,
    pub(crate) routes: Arc<Vec<Route>>,
    pub(crate) rec: Arc<Recorder>,
    pub(crate) rng: StdRng,
    pub(crate) keys: usize,
    pub(crate) seq: u64,
}

/// Times `call`, records it as client `client`'s through `route`, and returns its answer.
pub(crate) async fn record<F>(rec: &Recorder, client: usize, route: &str, request: Request, call: F) -> Response
where
    F: std::future::Future<Output = Response>,
{
    let start = rec.now();
    let response = tokio::time::timeout(CALL_TIMEOUT, call).await.unwrap_or(Response::Lost);
    let ret = if response == Response::Lost { NEVER } else { rec.now() };
    match &response {
        Response::Object(s) => rec.saw(s.resource_version),
        Response::List { resource_version, .. } => rec.saw(*resource_version),
        _ => {}
    }
    if let (Some(key), Some(replicas)) = (request.key(), replicas_of(&request)) {
        if matches!(response, Response::Object(_) | Response::Lost) {
            let set = ReplicasSet { key: key.to_owned(), call: start, ret, replicas };
            rec.replicas_sets.lock().unwrap().push((request.marker().map(str::to_owned), set));
        }
    }
    let answer = response.clone();
    let op = Operation { client, route: route.to_owned(), call: start, ret, request, response };
    rec.operations.lock().unwrap().push(op);
    answer
}

/// The replicas a write sets: `/scale` says so, other writes' markers do (`c<client>-<seq>-r<replicas>`).
fn replicas_of(request: &Request) -> Option<u32> {
    match request {
        Request::Scale { replicas, .. } => Some(*replicas),
        r => r.marker()?.rsplit_once("-r")?.1.parse().ok(),
    }
}

impl Client {
    async fn call<F>(&self, route: &Route, request: Request, call: F) -> Response
    where
        F: std::future::Future<Output = Response>,
    {
        record(&self.rec, self.id, &route.name, request, call).await
    }

    pub(crate) async fn step(&mut self) {
        let route = self.routes[self.rng.random_range(0..self.routes.len())].clone();
        let i = self.rng.random_range(0..self.keys);
        let namespace = NAMESPACES[i * NAMESPACES.len() / self.keys];
        let api: Api<PodSet> = Api::namespaced(route.client.clone(), namespace);
        let name = format!("ps-{i}");
        let key = format!("{namespace}/{name}");
        self.seq += 1;
        let replicas = self.rng.random_range(0..=3u32);
        let marker = format!("c{}-{}-r{replicas}", self.id, self.seq);
        let latest = self.rec.latest.load(Ordering::Relaxed);
        match self.rng.random_range(0..100) {
            0..9 => {
                let ps: PodSet = serde_json::from_value(podset(namespace, &name, &marker, replicas)).unwrap();
                let req = Request::Create { key, marker };
                self.call(&route, req, async { object(api.create(&PostParams::default(), &ps).await) }).await;
            }
            9..33 => {
                let (from, rv) = match self.rng.random_range(0..6) {
                    0 => (ReadFrom::Any, Some("0".to_owned())),
                    1 if latest > 0 => (ReadFrom::AtLeast(latest), Some(latest.to_string())),
                    _ => (ReadFrom::Latest, None),
                };
                let gp = GetParams { resource_version: rv };
                self.call(&route, Request::Get { key, from }, async { object(api.get_with(&name, &gp).await) }).await;
            }
            33..41 => {
                let limit = self.rng.random_range(1..4);
                // Unset (consistent), 0 (any), N (not older), or exactly N: from the cache's history, or 410.
                let from = match self.rng.random_range(0..8) {
                    0 | 1 => ReadFrom::Any,
                    2 if latest > 0 => ReadFrom::AtLeast(latest),
                    3 | 4 if latest > 0 => ReadFrom::Exact(latest.saturating_sub(self.rng.random_range(0..200)).max(1)),
                    _ => ReadFrom::Latest,
                };
                // This namespace, every namespace, or one group by label.
                let (api, namespace) = match self.rng.random_range(0..3) {
                    0 => (Api::all(route.client.clone()), ""),
                    _ => (api, namespace),
                };
                let group = self.rng.random_bool(0.3).then(|| group_of(&name).to_owned());
                let req = Request::List { namespace: namespace.into(), from, group: group.clone() };
                let selector = group.map(|g| format!("{GROUP_LABEL}={g}"));
                self.call(&route, req, list(&api, from, limit, selector)).await;
            }
            41..57 => {
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
            57..63 => {
                let patch = json!({"metadata": {"annotations": {MARKER: marker}}, "spec": {"replicas": replicas}});
                let req = Request::Patch { key, marker };
                let pp = PatchParams::default();
                self.call(&route, req, async { object(api.patch(&name, &pp, &Patch::Merge(&patch)).await) }).await;
            }
            63..67 => {
                let patch: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "replace", "path": format!("/metadata/annotations/{}", MARKER.replace('/', "~1")), "value": marker},
                    {"op": "replace", "path": "/spec/replicas", "value": replicas},
                ]))
                .unwrap();
                let req = Request::Patch { key, marker };
                let pp = PatchParams::default();
                self.call(&route, req, async { object(api.patch(&name, &pp, &Patch::<()>::Json(patch)).await) }).await;
            }
            67..75 => {
                let body = podset(namespace, &name, &marker, replicas);
                let req = Request::Apply { key, marker };
                let pp = PatchParams::apply("robustness").force();
                self.call(&route, req, async { object(api.patch(&name, &pp, &Patch::Apply(&body)).await) }).await;
            }
            75..80 => {
                // `/scale` as the HorizontalPodAutoscaler writes it: read, then a new count at that revision.
                let Ok(Ok(mut scale)) = tokio::time::timeout(CALL_TIMEOUT, api.get_scale(&name)).await else { return };
                let Some(rv) = scale.metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok()) else {
                    return;
                };
                let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) as u32;
                // A count it already has would change nothing and make no revision.
                let replicas = (current + self.rng.random_range(1..=3)) % 4;
                scale.spec.get_or_insert_with(Default::default).replicas = Some(replicas as i32);
                let req = Request::Scale { key, replicas, precondition: Some(rv) };
                self.call(&route, req, async {
                    match api.replace_scale(&name, &PostParams::default(), &scale).await {
                        Ok(s) => match s.metadata.resource_version.and_then(|r| r.parse().ok()) {
                            Some(resource_version) => {
                                Response::Object(Seen { resource_version, marker: String::new() })
                            }
                            None => Response::Refused("a Scale without a resourceVersion".into()),
                        },
                        Err(e) => failure(&e),
                    }
                })
                .await;
            }
            80..84 => {
                // `/status` at a revision read, with a condition of its own so that it changes something.
                let req = Request::Get { key: key.clone(), from: ReadFrom::Latest };
                let Response::Object(s) = self.call(&route, req, async { object(api.get(&name).await) }).await else {
                    return;
                };
                let patch = status_patch(s.resource_version, &marker);
                let req = Request::Status { key, precondition: Some(s.resource_version) };
                let pp = PatchParams::default();
                self.call(&route, req, async { object(api.patch_status(&name, &pp, &Patch::Merge(&patch)).await) })
                    .await;
            }
            84..86 => self.delete_collection(&route, &api, namespace, group_of(&name)).await,
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

impl Client {
    /// deletecollection of one label's PodSets in a namespace: recorded as one delete per key, within the call's
    /// interval; when the answer does not say what was deleted, a lost delete of every key it may have taken.
    async fn delete_collection(&mut self, route: &Route, api: &Api<PodSet>, namespace: &str, group: &str) {
        let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
        let call = self.rec.now();
        let answer = tokio::time::timeout(CALL_TIMEOUT, api.delete_collection(&DeleteParams::default(), &lp)).await;
        let ret = self.rec.now();
        let delete = |key: String, ret, response| Operation {
            client: self.id,
            route: route.name.clone(),
            call,
            ret,
            request: Request::Delete { key, precondition: None },
            response,
        };
        let ops: Vec<Operation> = match answer {
            Ok(Ok(either)) if either.is_left() => {
                let list = either.left().expect("a list");
                list.items
                    .iter()
                    .map(|ps| match seen(ps) {
                        Some(s) => delete(key_of(ps), ret, Response::Deleted { resource_version: s.resource_version }),
                        None => delete(
                            key_of(ps),
                            ret,
                            Response::Refused("a deleted object without a resourceVersion".into()),
                        ),
                    })
                    .collect()
            }
            // A Status, an error (it may have deleted some before failing: kube-apiserver's is not atomic either),
            // or no answer.
            _ => (0..self.keys)
                .filter(|i| NAMESPACES[i * NAMESPACES.len() / self.keys] == namespace)
                .map(|i| format!("ps-{i}"))
                .filter(|name| group_of(name) == group)
                .map(|name| delete(format!("{namespace}/{name}"), NEVER, Response::Lost))
                .collect(),
        };
        for op in &ops {
            if let Response::Deleted { resource_version } = op.response {
                self.rec.saw(resource_version);
            }
        }
        self.rec.operations.lock().unwrap().extend(ops);
    }
}

/// A list, page by page (`resourceVersion=0`: one page), with a label selector if given.
async fn list(api: &Api<PodSet>, from: ReadFrom, limit: u32, selector: Option<String>) -> Response {
    let mut items = Vec::new();
    let select = |lp: ListParams| match &selector {
        Some(s) => lp.labels(s),
        None => lp,
    };
    let mut lp = select(match from {
        ReadFrom::Any => ListParams::default().match_any(),
        ReadFrom::Latest => ListParams::default().limit(limit),
        ReadFrom::AtLeast(n) => {
            ListParams::default().limit(limit).at(&n.to_string()).matching(VersionMatch::NotOlderThan)
        }
        ReadFrom::Exact(n) => ListParams::default().limit(limit).at(&n.to_string()).matching(VersionMatch::Exact),
    });
    let mut at = None;
    loop {
        let page = match api.list(&lp).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 410 => {
                let asked = if let ReadFrom::Exact(n) = from { n } else { 0 };
                return Response::Expired { revision: at.unwrap_or(asked), continued: at.is_some() };
            }
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
            Some(c) => lp = select(ListParams::default().limit(limit).continue_token(&c)),
            None => break,
        }
    }
    match at {
        Some(resource_version) => Response::List { resource_version, items },
        None => Response::Refused("a list without a resourceVersion".into()),
    }
}

/// A `/status` merge patch at revision `rv` that changes something: a condition of the harness's own, carrying
/// `message`.
pub(crate) fn status_patch(rv: u64, message: &str) -> serde_json::Value {
    let condition = json!({
        "type": "RobustnessProbe", "status": "True", "reason": "Probe", "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    });
    json!({"metadata": {"resourceVersion": rv.to_string()}, "status": {"conditions": [condition]}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, reason).with_code(code).boxed())
    }

    #[test]
    fn only_a_definite_answer_from_our_server_is_one() {
        let f = |code, reason, message| failure(&api_error(code, reason, message));
        assert_eq!(f(404, "NotFound", "podsets.demo.k8s.io \"ps-1\" not found"), Response::NotFound);
        assert_eq!(f(404, "NotFound", "the server could not find the requested resource"), Response::Lost);
        assert_eq!(f(409, "AlreadyExists", "exists"), Response::AlreadyExists);
        assert_eq!(f(409, "Conflict", "modified"), Response::Conflict);
        assert_eq!(f(503, "ServiceUnavailable", "down"), Response::Lost);
        assert_eq!(f(429, "TooManyRequests", "later"), Response::Lost);
        assert_eq!(f(422, "Invalid", "bad"), Response::Refused("422 Invalid: bad".into()));
    }
}
