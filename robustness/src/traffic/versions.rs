//! Traffic of a rolling upgrade between the build that serves only v1alpha1 and this build. A prober reads every
//! route's PodSets as JSON (lists, their items, one object, a watch's events), so that the apiVersion and kind of
//! each object answered are known. A client writes spec.minReadySeconds through v1beta1 (where a route serves it)
//! and writes the same PodSets through v1alpha1 on any route, the old build's replicas included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, WatchEvent};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{failure, podset, record, seen_meta, Recorder, Route, CALL_TIMEOUT, MARKER, MIN_READY_SECONDS};
use crate::model::history::{ReadFrom, Request, Response, Seen, ServedObject, VersionAnswer};

/// Where the version client's PodSets live: no other client deletes there.
pub(crate) const VERSIONS_NAMESPACE: &str = "versions";
/// The version client's PodSets.
const KEYS: usize = 3;

/// Which routes serve v1beta1 now, by index in the run's routes (the replicas', then the aggregator's), as the
/// rollout changes them.
pub(crate) struct Serving(Vec<AtomicBool>);

impl Serving {
    pub(crate) fn new(routes: usize) -> Self {
        Self((0..routes).map(|_| AtomicBool::new(false)).collect())
    }

    pub(crate) fn set(&self, route: usize, v1beta1: bool) {
        self.0[route].store(v1beta1, Ordering::SeqCst);
    }

    fn v1beta1(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&k| self.0[k].load(Ordering::SeqCst)).collect()
    }
}

fn resource(version: &str) -> ApiResource {
    ApiResource {
        group: "demo.k8s.io".into(),
        version: version.into(),
        api_version: format!("demo.k8s.io/{version}"),
        kind: "PodSet".into(),
        plural: "podsets".into(),
    }
}

fn key_of_value(v: &Value) -> String {
    let m = &v["metadata"];
    format!("{}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""))
}

fn served(what: String, v: &Value) -> ServedObject {
    let field = |f: &str| v[f].as_str().unwrap_or_default().to_owned();
    ServedObject { what, api_version: field("apiVersion"), kind: field("kind") }
}

impl Recorder {
    fn answered(&self, route: &str, at: u64, asked: &str, call: String, objects: Vec<ServedObject>) {
        let answer = VersionAnswer { route: route.into(), at, asked: asked.into(), call, objects };
        self.version_answers.lock().unwrap().push(answer);
    }
}

async fn get_json(route: &Route, path: &str) -> Option<Value> {
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let text = tokio::time::timeout(Duration::from_secs(5), route.client.request_text(req)).await.ok()?.ok()?;
    serde_json::from_str(&text).ok()
}

/// Route `k`'s PodSets in `v1alpha1`, and in `v1beta1` while the route serves it, read again and again until `stop`:
/// a list of every namespace and its items, one of them by name, and a watch of a second (an ADDED event for each
/// object, then the changes).
pub(crate) async fn prober(
    k: usize,
    routes: Arc<Vec<Route>>,
    serving: Arc<Serving>,
    rec: Arc<Recorder>,
    mut rng: StdRng,
    stop: CancellationToken,
) {
    let route = &routes[k];
    while !stop.is_cancelled() {
        let versions: &[&str] = if serving.v1beta1().contains(&k) { &["v1alpha1", "v1beta1"] } else { &["v1alpha1"] };
        for version in versions {
            probe(route, version, &rec, &mut rng).await;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}

async fn probe(route: &Route, version: &str, rec: &Recorder, rng: &mut StdRng) {
    let base = format!("/apis/demo.k8s.io/{version}");
    let at = rec.now();
    if let Some(list) = get_json(route, &format!("{base}/podsets")).await {
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let mut objects = vec![served("the list".into(), &list)];
        objects.extend(items.iter().map(|i| served(format!("item {}", key_of_value(i)), i)));
        rec.answered(&route.name, at, version, "list".into(), objects);
        if !items.is_empty() {
            let key = key_of_value(&items[rng.random_range(0..items.len())]);
            let (ns, name) = key.split_once('/').expect("namespace/name");
            let at = rec.now();
            if let Some(obj) = get_json(route, &format!("{base}/namespaces/{ns}/podsets/{name}")).await {
                if obj["kind"] != "Status" {
                    rec.answered(&route.name, at, version, format!("get {key}"), vec![served(key, &obj)]);
                }
            }
        }
    }
    let at = rec.now();
    let req = http::Request::get(format!("{base}/podsets?watch=1&timeoutSeconds=1")).body(Vec::new()).expect("request");
    let events = async {
        let stream = route.client.request_events::<Value>(req).await.ok()?;
        let events: Vec<kube::Result<WatchEvent<Value>>> = stream.collect().await;
        events.into_iter().collect::<kube::Result<Vec<_>>>().ok()
    };
    if let Ok(Some(events)) = tokio::time::timeout(Duration::from_secs(5), events).await {
        let objects: Vec<ServedObject> = events
            .iter()
            .filter_map(|e| match e {
                WatchEvent::Added(o) => Some(("ADDED", o)),
                WatchEvent::Modified(o) => Some(("MODIFIED", o)),
                WatchEvent::Deleted(o) => Some(("DELETED", o)),
                WatchEvent::Bookmark(_) | WatchEvent::Error(_) => None,
            })
            .map(|(t, o)| served(format!("{t} {}", key_of_value(o)), o))
            .collect();
        rec.answered(&route.name, at, version, "watch".into(), objects);
    }
}

/// A client of [`VERSIONS_NAMESPACE`]'s PodSets: spec.minReadySeconds written through v1beta1, or through
/// v1alpha1's annotation (markers `b<client>-<seq>-s<seconds>`), and every other write through v1alpha1 on any
/// route. Its calls are recorded as every client's are.
pub(crate) struct VersionClient {
    pub(crate) id: usize,
    pub(crate) routes: Arc<Vec<Route>>,
    pub(crate) serving: Arc<Serving>,
    pub(crate) rec: Arc<Recorder>,
    pub(crate) rng: StdRng,
    pub(crate) seq: u64,
    /// Per key, whether it exists (as far as this client knows).
    pub(crate) created: [bool; KEYS],
}

impl VersionClient {
    pub(crate) fn new(
        id: usize,
        routes: Arc<Vec<Route>>,
        serving: Arc<Serving>,
        rec: Arc<Recorder>,
        rng: StdRng,
    ) -> Self {
        Self { id, routes, serving, rec, rng, seq: 0, created: [false; KEYS] }
    }

    /// An answer as the history records it; its object's apiVersion and kind as the version check reads them.
    fn object(&self, route: &str, version: &str, call: &str, r: kube::Result<DynamicObject>) -> Response {
        match r {
            Ok(obj) => {
                let v = serde_json::to_value(&obj).unwrap_or_default();
                let key = key_of_value(&v);
                self.rec.answered(route, self.rec.now(), version, format!("{call} {key}"), vec![served(key, &v)]);
                seen_meta(&obj.metadata)
                    .map_or_else(|| Response::Refused("no resourceVersion".into()), Response::Object)
            }
            Err(e) => failure(&e),
        }
    }

    pub(crate) async fn step(&mut self) {
        let k = self.rng.random_range(0..KEYS);
        let name = format!("mrs-{k}");
        let key = format!("{VERSIONS_NAMESPACE}/{name}");
        self.seq += 1;
        let tag = format!("b{}-{}", self.id, self.seq);
        let seconds = self.rng.random_range(1..=600u32);
        let replicas = self.rng.random_range(0..=2u32);
        let beta = self.serving.v1beta1();
        let (route, version) = if !beta.is_empty() && self.rng.random_bool(0.4) {
            (self.routes[beta[self.rng.random_range(0..beta.len())]].clone(), "v1beta1")
        } else {
            (self.routes[self.rng.random_range(0..self.routes.len())].clone(), "v1alpha1")
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(route.client.clone(), VERSIONS_NAMESPACE, &resource(version));
        let rec = self.rec.clone();
        let response = if !self.created[k] {
            let marker = format!("{tag}-s{seconds}-r{replicas}");
            let mut body = podset(VERSIONS_NAMESPACE, &name, &marker, replicas);
            if version == "v1beta1" {
                body["apiVersion"] = "demo.k8s.io/v1beta1".into();
                body["spec"]["minReadySeconds"] = seconds.into();
            } else {
                body["metadata"]["annotations"][MIN_READY_SECONDS] = seconds.to_string().into();
            }
            let obj: DynamicObject = serde_json::from_value(body).expect("a PodSet");
            let req = Request::Create { key: key.clone(), marker };
            let call =
                async { self.object(&route.name, version, "create", api.create(&PostParams::default(), &obj).await) };
            let r = record(&rec, self.id, &route.name, req, call).await;
            if matches!(r, Response::Object(_) | Response::AlreadyExists) {
                self.created[k] = true;
            }
            r
        } else if version == "v1beta1" {
            let marker = format!("{tag}-s{seconds}");
            let patch = json!({"metadata": {"annotations": {MARKER: marker}}, "spec": {"minReadySeconds": seconds}});
            self.patch(&route, &api, version, Request::Patch { key, marker }, &name, patch).await
        } else {
            match self.rng.random_range(0..6) {
                0 => {
                    // Read, then write back what was read (the annotation with it) at that revision.
                    let req = Request::Get { key: key.clone(), from: ReadFrom::Latest };
                    let mut got = None;
                    let read = record(&rec, self.id, &route.name, req, async {
                        let r = api.get(&name).await;
                        got = r.as_ref().ok().cloned();
                        self.object(&route.name, version, "get", r)
                    })
                    .await;
                    let (Response::Object(Seen { resource_version, .. }), Some(mut obj)) = (read, got) else {
                        return;
                    };
                    let marker = format!("{tag}-r{replicas}");
                    obj.metadata.annotations.get_or_insert_with(Default::default).insert(MARKER.into(), marker.clone());
                    obj.data["spec"]["replicas"] = replicas.into();
                    let req = Request::Update { key, marker, precondition: Some(resource_version) };
                    let call = async {
                        self.object(
                            &route.name,
                            version,
                            "update",
                            api.replace(&name, &PostParams::default(), &obj).await,
                        )
                    };
                    record(&rec, self.id, &route.name, req, call).await
                }
                1 => {
                    let marker = format!("{tag}-r{replicas}");
                    let patch = json!({"metadata": {"annotations": {MARKER: marker}}, "spec": {"replicas": replicas}});
                    self.patch(&route, &api, version, Request::Patch { key, marker }, &name, patch).await
                }
                2 => {
                    // spec.minReadySeconds as v1alpha1 carries it.
                    let marker = format!("{tag}-s{seconds}");
                    let patch =
                        json!({"metadata": {"annotations": {MARKER: marker, MIN_READY_SECONDS: seconds.to_string()}}});
                    self.patch(&route, &api, version, Request::Patch { key, marker }, &name, patch).await
                }
                3 => {
                    let Ok(Ok(mut scale)) = tokio::time::timeout(CALL_TIMEOUT, api.get_scale(&name)).await else {
                        return;
                    };
                    let Some(rv) = scale.metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok())
                    else {
                        return;
                    };
                    let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) as u32;
                    let replicas = (current + 1) % 3;
                    scale.spec.get_or_insert_with(Default::default).replicas = Some(replicas as i32);
                    let req = Request::Scale { key, replicas, precondition: Some(rv) };
                    record(&rec, self.id, &route.name, req, async {
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
                    .await
                }
                4 => {
                    let req = Request::Get { key: key.clone(), from: ReadFrom::Latest };
                    let read = record(&rec, self.id, &route.name, req, async {
                        self.object(&route.name, version, "get", api.get(&name).await)
                    })
                    .await;
                    let Response::Object(s) = read else { return };
                    let patch = super::status_patch(s.resource_version, &tag);
                    let req = Request::Status { key, precondition: Some(s.resource_version) };
                    let pp = PatchParams::default();
                    record(&rec, self.id, &route.name, req, async {
                        self.object(
                            &route.name,
                            version,
                            "status",
                            api.patch_status(&name, &pp, &Patch::Merge(&patch)).await,
                        )
                    })
                    .await
                }
                _ => {
                    // Another manager's apply, without the annotation: it must not take what it never set.
                    let marker = format!("{tag}-r{replicas}");
                    let body = podset(VERSIONS_NAMESPACE, &name, &marker, replicas);
                    let req = Request::Apply { key, marker };
                    let pp = PatchParams::apply("robustness-versions").force();
                    record(&rec, self.id, &route.name, req, async {
                        self.object(&route.name, version, "apply", api.patch(&name, &pp, &Patch::Apply(&body)).await)
                    })
                    .await
                }
            }
        };
        if response == Response::NotFound {
            self.created[k] = false;
        }
    }

    async fn patch(
        &self,
        route: &Route,
        api: &Api<DynamicObject>,
        version: &str,
        req: Request,
        name: &str,
        patch: Value,
    ) -> Response {
        let pp = PatchParams::default();
        record(&self.rec, self.id, &route.name, req, async {
            self.object(&route.name, version, "patch", api.patch(name, &pp, &Patch::Merge(&patch)).await)
        })
        .await
    }
}
