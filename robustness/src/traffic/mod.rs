//! The clients' traffic: each client's calls (creates, reads, lists, conditional updates, patches, applies,
//! deletes) on a few contended PodSets through a random route, each call timed and recorded with its answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use podset_apiserver::api::PodSet;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use crate::model::history::{
    Operation, PodCount, ReadFrom, ReplicaStart, ReplicasSet, Request, Response, Seen, Watch, ANSWER_WITHIN, NEVER,
};

mod census;
mod watch;

pub(crate) use census::{census, sampler};
pub(crate) use watch::watcher;

/// The annotation each client write sets to a value of its own.
pub const MARKER: &str = "robustness.demo.k8s.io/marker";
pub(crate) const NAMESPACE: &str = "default";
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
    /// (marker, the write) for every write of spec.replicas, answered or lost.
    pub(crate) replicas_sets: Mutex<Vec<(String, ReplicasSet)>>,
    /// The newest revision a client saw, for watches to start near.
    pub(crate) latest: AtomicU64,
    /// Each replica process's start, for where its cache begins.
    pub(crate) replica_starts: Mutex<Vec<ReplicaStart>>,
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
    let resource_version = ps.metadata.resource_version.as_deref()?.parse().ok()?;
    let marker = ps.metadata.annotations.as_ref().and_then(|a| a.get(MARKER)).cloned().unwrap_or_default();
    Some(Seen { resource_version, marker })
}

pub(crate) fn key_of(ps: &PodSet) -> String {
    format!("{}/{}", ps.metadata.namespace.as_deref().unwrap_or(NAMESPACE), ps.metadata.name.as_deref().unwrap_or(""))
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

pub(crate) fn podset(name: &str, marker: &str, replicas: u32) -> serde_json::Value {
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

pub(crate) struct Client {
    pub(crate) id: usize,
    pub(crate) routes: Arc<Vec<Route>>,
    pub(crate) rec: Arc<Recorder>,
    pub(crate) rng: StdRng,
    pub(crate) keys: usize,
    pub(crate) seq: u64,
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

    pub(crate) async fn step(&mut self) {
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
