//! `--goaway-chance`: after a share of HTTP/2 answers the server sends the connection a GOAWAY, so a long-lived
//! client (kube-apiserver's proxy) reconnects and a Service spreads it again; the answer it came after is whole,
//! and a watch on the same connection goes on. On the real control plane, with kube-apiserver reaching three
//! replicas through their Service's ClusterIP: a replica restarted under load gets its share back with the flag,
//! and none without it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::cluster::{in_namespace, runtime, wait};
use common::*;
use futures::StreamExt;
use http::Request;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use podset_envtest::{Cluster, Credential, ServerCommand};
use tokio::sync::oneshot;

const PODSETS: &str = "/apis/demo.k8s.io/v1beta1/namespaces/default/podsets";

/// An HTTP/2 connection of our own (h2), and a channel that says when it has ended.
async fn connect(server: &TestServer) -> (h2::client::SendRequest<Bytes>, oneshot::Receiver<Result<(), h2::Error>>) {
    let (client, conn) = h2::client::handshake(server.h2_tls().await).await.unwrap();
    let (ended, ended_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = ended.send(conn.await);
    });
    (client, ended_rx)
}

/// Reads a whole answer's body.
async fn body(mut body: h2::RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    all
}

/// GETs the list on `client`, one after another, until the connection refuses a request; returns how many were
/// answered (each one whole), or None if `most` were and none was refused.
async fn lists_until_refused(client: &mut h2::client::SendRequest<Bytes>, most: usize) -> Option<usize> {
    for answered in 0..most {
        let req = Request::get(format!("https://localhost{PODSETS}")).body(()).unwrap();
        let sent = match client.clone().ready().await {
            Ok(mut ready) => ready.send_request(req, true),
            Err(e) => Err(e),
        };
        let resp = match sent {
            Ok((resp, _)) => resp.await,
            Err(e) => Err(e),
        };
        match resp {
            Ok(resp) => {
                assert_eq!(resp.status(), 200);
                let list: serde_json::Value = serde_json::from_slice(&body(resp.into_body()).await).unwrap();
                assert_eq!(list["kind"], "PodSetList", "a whole answer");
            }
            Err(e) => {
                assert!(e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM), "{e}");
                return Some(answered);
            }
        }
    }
    None
}

#[tokio::test]
async fn a_share_of_http2_answers_end_their_connection_and_a_watch_on_it_goes_on() {
    let server = TestServer::start(&["--goaway-chance=0.02"]);
    let (mut client, ended) = connect(&server).await;

    // A watch first, on the connection that will be sent away.
    let watch = Request::get(format!("https://localhost{PODSETS}?watch=true")).body(()).unwrap();
    let (watch, _) = client.clone().ready().await.unwrap().send_request(watch, true).unwrap();
    let watch = watch.await.unwrap();
    assert_eq!(watch.status(), 200);
    let mut watch = watch.into_body();

    // 1 in 50 on average; 1000 in a row without one would be a 1.7e-9 chance.
    let answered = lists_until_refused(&mut client, 1000).await.expect("a GOAWAY within 1000 requests");
    assert!(answered >= 1, "the request the GOAWAY came after was answered");

    // The watch on the connection still gets its events; the connection ends once the watch does.
    let api: Api<PodSet> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &serde_json::from_value(podset("after-goaway", 1)).unwrap()).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), watch.data()).await.unwrap().unwrap().unwrap();
    let event: serde_json::Value = serde_json::from_slice(&event).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("after-goaway"))
    );
    drop(watch);
    // The server closes it (the client would keep it while it holds `client`). The close can cross the client's
    // last frame (the dropped watch's RST_STREAM), so a socket reset by then counts as closed too.
    let ended = tokio::time::timeout(Duration::from_secs(10), ended).await.expect("the connection closes").unwrap();
    assert!(ended.as_ref().map_or_else(|e| e.is_io(), |()| true), "{ended:?}");
    drop(client);
}

#[tokio::test]
async fn watches_never_end_their_connection_and_without_the_flag_nothing_does() {
    let server = TestServer::start(&["--goaway-chance=0.02"]);
    let (client, _) = connect(&server).await;
    // 500 watches opened and dropped: had each a 1 in 50 chance, all would pass with a 4e-5 one.
    for _ in 0..500 {
        let watch = Request::get(format!("https://localhost{PODSETS}?watch=true")).body(()).unwrap();
        let (watch, mut stream) = client.clone().ready().await.unwrap().send_request(watch, true).unwrap();
        assert_eq!(watch.await.unwrap().status(), 200);
        stream.send_reset(h2::Reason::CANCEL);
    }
    let mut client = client;
    assert!(lists_until_refused(&mut client, 1).await.is_none(), "the connection took requests after 500 watches");

    let server = TestServer::start(&[]);
    let (mut client, _) = connect(&server).await;
    assert_eq!(lists_until_refused(&mut client, 500).await, None, "no GOAWAY without --goaway-chance");
}

#[test]
fn the_chance_is_at_most_one_in_fifty() {
    for bad in ["0.03", "-0.01", "often"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
            .args(["--insecure-allow-all", "--secure-port=0", &format!("--goaway-chance={bad}")])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--goaway-chance"), "{bad}: {err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
        .args(["--goaway-chance=0.05"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--goaway-chance can not be less than 0 or greater than 0.02"),
        "kube-apiserver's words"
    );
}

// Through kube-apiserver's aggregator, reaching the replicas at their Services' ClusterIP as in a real cluster:
// kube-apiserver keeps one HTTP/2 connection per Service, kube-proxy picks a replica per connection
// (kubernetes/kubernetes#61296).

/// The load's version (its own Service, so its own connection from kube-apiserver).
const LOAD_VERSION: &str = "v1alpha1";
/// Clients of the load, each sending a request every [`LOAD_PERIOD`].
const LOAD_CLIENTS: usize = 4;
const LOAD_PERIOD: Duration = Duration::from_millis(40);

/// The cluster tests take turns: on 2 cores, two control planes under load would slow each other's.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What one replica's /metrics says about the load.
#[derive(Clone, Copy, Debug, Default)]
struct Scrape {
    /// GETs and LISTs of PodSets in [`LOAD_VERSION`] answered.
    answered: u64,
    /// Namespaced watches of them open: the test's (kube-controller-manager's are cluster-wide).
    watching: u64,
}

async fn scrape(replicas: &[kube::Client]) -> Vec<Scrape> {
    let mut all = Vec::new();
    for client in replicas {
        let (status, _, body) = raw(client, Request::get("/metrics").body(vec![]).unwrap()).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let mut s = Scrape::default();
        for line in String::from_utf8_lossy(&body).lines() {
            let load = line.contains(r#"resource="podsets""#) && line.contains(&format!(r#"version="{LOAD_VERSION}""#));
            let value = || line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64;
            if load
                && line.starts_with("apiserver_request_total{")
                && [r#"verb="GET""#, r#"verb="LIST""#].iter().any(|v| line.contains(v))
            {
                s.answered += value();
            } else if load
                && line.starts_with("apiserver_longrunning_requests{")
                && line.contains(r#"verb="WATCH""#)
                && line.contains(r#"scope="namespace""#)
            {
                s.watching += value();
            }
        }
        all.push(s);
    }
    all
}

/// Each replica's share of the load's requests between two scrapes.
fn shares(from: &[Scrape], to: &[Scrape]) -> Vec<f64> {
    let answered: Vec<u64> = from.iter().zip(to).map(|(a, b)| b.answered.saturating_sub(a.answered)).collect();
    let total = answered.iter().sum::<u64>().max(1) as f64;
    answered.iter().map(|&n| n as f64 / total).collect()
}

fn percent(shares: &[f64]) -> String {
    shares.iter().map(|s| format!("{:.0}%", s * 100.0)).collect::<Vec<_>>().join(" ")
}

/// Steady load through kube-apiserver (LISTs and GETs of PodSets), a PodSet annotated with a new `tick` every
/// second, and a watch held across it all that must see every tick.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    ticked: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    broken: Arc<Mutex<Vec<String>>>,
    watch: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    async fn start(c: &Cluster) -> Self {
        let mut config = c.config().await;
        // Every failure counts: kube's client would retry a 503.
        config.default_retry = false;
        let api: Api<PodSet> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
        for i in 0..5 {
            let ps = serde_json::from_value(podset(&format!("load-{i}"), 0)).unwrap();
            api.create(&PostParams::default(), &ps).await.unwrap();
        }
        let from = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
        let (stop, failures) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (sent, ticked, seen) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let broken = Arc::new(Mutex::new(Vec::new()));

        let mut events = api.watch(&WatchParams::default(), &from).await.unwrap().boxed();
        let watch = tokio::spawn({
            let (stop, seen, broken) = (Arc::clone(&stop), seen.clone(), broken.clone());
            async move {
                let end = loop {
                    match events.next().await {
                        Some(Ok(WatchEvent::Added(ps) | WatchEvent::Modified(ps))) => {
                            let tick = ps.metadata.annotations.as_ref().and_then(|a| a.get("tick")?.parse().ok());
                            seen.fetch_max(tick.unwrap_or(0), Ordering::Relaxed);
                        }
                        Some(Ok(WatchEvent::Error(e))) => break format!("an error event: {e:?}"),
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break format!("{e}"),
                        None => break "ended".to_owned(),
                    }
                };
                if !stop.load(Ordering::Relaxed) {
                    broken.lock().unwrap().push(end);
                }
            }
        });

        let mut tasks = Vec::new();
        for client in 0..LOAD_CLIENTS {
            let (api, stop, sent, failures) =
                (api.clone(), Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&failures));
            tasks.push(tokio::spawn(async move {
                let mut every = tokio::time::interval(LOAD_PERIOD);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for i in 0u64.. {
                    every.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let name = format!("load-{}", (i as usize + client) % 5);
                    let result = if i % 2 == 0 {
                        api.list(&ListParams::default()).await.map(drop)
                    } else {
                        api.get(&name).await.map(drop)
                    };
                    sent.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = result {
                        failures.lock().unwrap().push(format!("{e}"));
                    }
                }
            }));
        }
        tasks.push(tokio::spawn({
            let (stop, ticked, failures) = (stop.clone(), ticked.clone(), failures.clone());
            async move {
                for tick in 1u64.. {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let patch =
                        Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tick": tick.to_string()}}}));
                    match api.patch("load-0", &PatchParams::default(), &patch).await {
                        Ok(_) => ticked.store(tick, Ordering::Relaxed),
                        Err(e) => failures.lock().unwrap().push(format!("tick {tick}: {e}")),
                    }
                }
            }
        }));
        Self { stop, sent, failures, ticked, seen, broken, watch, tasks }
    }

    /// Stops the load once the watch has seen the last tick: how many requests were sent, which failed, and what
    /// broke the watch.
    async fn finish(self) -> (u64, Vec<String>, Vec<String>) {
        let last = self.ticked.load(Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.seen.load(Ordering::Relaxed) < last && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = self.seen.load(Ordering::Relaxed);
        if seen < last {
            self.broken.lock().unwrap().push(format!("saw tick {seen} of {last}"));
        }
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.watch.abort();
        let failures = self.failures.lock().unwrap().clone();
        let broken = self.broken.lock().unwrap().clone();
        (self.sent.load(Ordering::Relaxed), failures, broken)
    }
}

/// Three replicas on etcd behind the aggregator at their Services' ClusterIPs, under [`Load`], and one of them
/// restarted as a rollout does.
struct Rollout {
    c: Cluster,
    rt: tokio::runtime::Runtime,
    admin: (String, String),
    replicas: Vec<kube::Client>,
    load: Option<Load>,
}

impl Rollout {
    fn start(args: &[&str]) -> Self {
        let args = args.iter().map(Into::into).collect();
        let c = Cluster::start_replicated_behind_cluster_ip(ServerCommand { program: BIN.into(), args }, 3);
        let rt = runtime();
        let admin = c.client_cert("ca", "load-spreading-admin", Some("system:masters"));
        let (replicas, load) = rt.block_on(async {
            let replicas = (0..3).map(|i| c.replica_client(i, Credential::Cert(&admin))).collect();
            (replicas, Load::start(&c).await)
        });
        Self { c, rt, admin, replicas, load: Some(load) }
    }

    fn scrape(&self) -> Vec<Scrape> {
        self.rt.block_on(scrape(&self.replicas))
    }

    /// Each replica's share of the load over `window`, and the scrape at its end.
    fn measure(&self, window: Duration) -> (Vec<f64>, Vec<Scrape>) {
        let from = self.scrape();
        std::thread::sleep(window);
        let to = self.scrape();
        (shares(&from, &to), to)
    }

    /// Restarts replica `r` as a rolling update does, so that no request fails: out of the Endpoints first (and so
    /// out of kube-proxy's rules: new connections go elsewhere), then SIGTERM (it fails /readyz and sends its
    /// connections a GOAWAY; their requests finish), started again, and back in the Endpoints once ready.
    fn restart(&mut self, r: usize) {
        let others: Vec<usize> = (0..3).filter(|&i| i != r).collect();
        self.c.set_ready_replicas(&others);
        let status = self.c.stop_replica(r, Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "replica {r} stopped with {status:?}");
        self.c.start_replica(r);
        self.rt.block_on(async {
            let back = self.c.replica_client(r, Credential::Cert(&self.admin));
            let ready = || async {
                let req = Request::get("/readyz").body(kube::client::Body::empty()).unwrap();
                back.send(req).await.is_ok_and(|r| r.status() == 200)
            };
            wait(Duration::from_secs(60), ready, "the restarted replica to be ready").await;
        });
        self.c.set_ready_replicas(&[0, 1, 2]);
    }

    /// Stops the load: every request succeeded and the watch saw every tick, unbroken.
    fn finish(mut self) {
        let load = self.load.take().unwrap();
        let (sent, failures, broken) = self.rt.block_on(load.finish());
        assert!(failures.is_empty(), "{} of {sent} requests failed: {failures:#?}", failures.len());
        assert!(broken.is_empty(), "the watch broke: {broken:?}");
        eprintln!("{sent} requests, none failed; the watch saw every tick");
    }
}

/// Among the replicas not holding the test's watch, the one answering the least of the load.
fn least_loaded_without_the_watch(shares: &[f64], scrape: &[Scrape]) -> usize {
    assert_eq!(scrape.iter().map(|s| s.watching).sum::<u64>(), 1, "one replica holds the watch: {scrape:?}");
    (0..3).filter(|&i| scrape[i].watching == 0).min_by(|&a, &b| shares[a].total_cmp(&shares[b])).unwrap()
}

/// Without the flag, kube-apiserver's one connection for the Service stays where it is: a replica restarted under
/// load gets none of the load back.
#[test]
fn without_goaway_chance_a_restarted_replica_gets_none_of_the_aggregators_requests() {
    let _turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    in_namespace("without_goaway_chance_a_restarted_replica_gets_none_of_the_aggregators_requests", || {
        let mut r = Rollout::start(&[]);
        std::thread::sleep(Duration::from_secs(5));
        let (before, scrape) = r.measure(Duration::from_secs(10));
        // kube-apiserver's one connection for the Service: one replica answers everything.
        assert!(before.iter().any(|&s| s > 0.99), "one replica answers all: {}", percent(&before));
        let restarted = least_loaded_without_the_watch(&before, &scrape);
        r.restart(restarted);
        let (after, _) = r.measure(Duration::from_secs(60));
        eprintln!(
            "without --goaway-chance: shares {} before; replica {restarted} restarted; shares {} over the minute after \
             it was back",
            percent(&before),
            percent(&after)
        );
        assert!(after[restarted] < 0.05, "the restarted replica got requests back: {}", percent(&after));
        r.finish();
    });
}

/// With `--goaway-chance=0.02`, kube-apiserver reconnects every 50 requests or so, and kube-proxy spreads the new
/// connections: a replica restarted under load is back near a third of it within two minutes. No request fails, and
/// the watch, on a connection sent away long before, goes on.
#[test]
fn with_goaway_chance_a_restarted_replica_gets_its_share_of_the_aggregators_requests_back() {
    let _turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    in_namespace("with_goaway_chance_a_restarted_replica_gets_its_share_of_the_aggregators_requests_back", || {
        let mut r = Rollout::start(&["--goaway-chance=0.02"]);
        std::thread::sleep(Duration::from_secs(5));
        let (before, scrape) = r.measure(Duration::from_secs(10));
        let restarted = least_loaded_without_the_watch(&before, &scrape);
        r.restart(restarted);
        let back = Instant::now();
        // Its share over the last 30 s, every 10 s, until it is near a third.
        let mut scrapes = vec![r.scrape()];
        let window = loop {
            std::thread::sleep(Duration::from_secs(10));
            scrapes.push(r.scrape());
            if scrapes.len() < 4 {
                continue;
            }
            let window = shares(&scrapes[scrapes.len() - 4], &scrapes[scrapes.len() - 1]);
            eprintln!(
                "{:>3.0}s after replica {restarted} was back: shares {} over the last 30 s",
                back.elapsed().as_secs_f64(),
                percent(&window)
            );
            if window[restarted] >= 0.2 {
                break window;
            }
            assert!(back.elapsed() < Duration::from_secs(120), "not back near a third within two minutes");
        };
        eprintln!(
            "with --goaway-chance=0.02: shares {} before; replica {restarted} restarted; shares {} over 30 s, {:.0}s \
             after it was back (over all that time: {})",
            percent(&before),
            percent(&window),
            back.elapsed().as_secs_f64(),
            percent(&shares(&scrapes[0], scrapes.last().unwrap())),
        );
        r.finish();
    });
}
