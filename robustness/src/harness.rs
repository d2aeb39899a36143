//! One run: a three-member etcd cluster, replicas of podset-apiserver on it behind the real aggregator with the
//! controller on, the clients' traffic and watches on every replica and through kube-apiserver, and the faults a
//! seed draws. Everything runs inside the envtest network namespace ([`podset_envtest::namespace_command`]). The
//! run's [`History`] goes to [`crate::check`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::Api;
use podset_apiserver::api::PodSet;
use podset_envtest::{assets_dir, Cluster, ServerCommand, REPLICA_IPS};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio_util::sync::CancellationToken;

use crate::failpoint::{etcd_route, inject, plan, rollout, sh, EtcdCluster, Fault, Rollout};
use crate::model::history::in_namespace;
use crate::model::history::{
    AfterRollback, Build, History, ReplicaExit, ReplicaStart, Settled, Time, AGGREGATOR, NEVER,
};
use crate::record::{compactor, EtcdRecord};
use crate::traffic::{
    census, key_of, podset, prober, replica_route, sampler, watcher, Client, Informer, Recorder, Route, Serving,
    VersionClient, NAMESPACES, VERSIONS_NAMESPACE,
};

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
    /// A run that answers fewer calls fails: it did too little under its faults to show anything.
    pub min_answered: usize,
    /// etcd is compacted this often during traffic (to the revision of one interval before), and now and then a
    /// member defragmented.
    pub compaction: Option<Duration>,
    /// Some of a replica's faults come with one of etcd's at the same time.
    pub overlap: bool,
    /// Start on an older build instead, upgrade every replica to `server` and roll back, under the traffic.
    pub rollout: Option<Rollout>,
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
            min_answered: 200,
            compaction: Some(Duration::from_secs(10)),
            overlap: false,
            rollout: None,
        }
    }

    /// Three replicas on `old`, the build before v1beta1, replaced one at a time by `server` (this build), held
    /// there, then rolled back one at a time, as docs/install.md gives it; no faults, but the replacements.
    pub fn upgrade(seed: u64, server: ServerCommand, old: ServerCommand) -> Self {
        Self {
            replicas: 3,
            faults: 0,
            fixed: Vec::new(),
            // No drawn faults: the replacements set the run's length.
            fault_window: Duration::ZERO,
            min_answered: 1_000,
            rollout: Some(Rollout { old, every: Duration::from_secs(12), hold: Duration::from_secs(20) }),
            ..Self::short(seed, server)
        }
    }

    /// A server with a bug planted on purpose (`--planted-bug`, a build with the `planted-bugs` feature): traffic
    /// without faults, long enough for the bug to strike many times; the checker must name what it broke.
    pub fn planted(seed: u64, mut server: ServerCommand, bug: &str) -> Self {
        server.args.push(format!("--planted-bug={bug}").into());
        let (fixed, fault_window) = match bug {
            // A leader that outlives its Lease needs a pause to show it.
            "stale-leader" => (vec![Fault::PauseLeader], Duration::from_secs(60)),
            _ => (Vec::new(), Duration::from_secs(30)),
        };
        Self { faults: fixed.len(), fixed, fault_window, ..Self::short(seed, server) }
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
            // Three runs at a time on two cores answer about 13 000 each.
            min_answered: 2_000,
            overlap: true,
            ..Self::short(seed, server)
        }
    }
}

/// A client straight at replica `i` with a client certificate, without kube-rs's retries.
fn replica_client(c: &Cluster, i: usize, (cert, key): &(String, String)) -> kube::Client {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let addr = format!("https://{}:{}", REPLICA_IPS[i], c.podset_addr.port());
    let mut config = kube::Config::new(addr.parse().expect("address"));
    let ca = podset_apiserver::apiserver::tls::read_certs(&c.podset_ca()).expect("our CA");
    config.root_cert = Some(ca.iter().map(|c| c.to_vec()).collect());
    config.auth_info.client_certificate_data = Some(b64(cert));
    config.auth_info.client_key_data = Some(b64(key).into());
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

/// Watches each replica's cache floor (`podset_storage_compacted_revision`): when it moves on inside a process,
/// the cache began again (it reloaded after etcd compacted past it), which the 410 judge must know.
async fn floor_poller(route: Route, rec: Arc<Recorder>, stop: CancellationToken) {
    let mut last: Option<(u64, Time)> = None;
    while !stop.is_cancelled() {
        let asked = rec.now();
        let req = http::Request::get("/metrics").body(Vec::new()).expect("request");
        let text = tokio::time::timeout(Duration::from_secs(5), route.client.request_text(req)).await;
        let floor = text.ok().and_then(Result::ok).and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("podset_storage_compacted_revision ")?.trim().parse::<u64>().ok())
        });
        // A replica that does not answer (paused, cut off, restarting) keeps its last floor: a cache that reloads
        // meanwhile is seen when it answers again, and a restarted process's new floor only makes the judge more
        // lenient around the restart.
        if let Some(floor) = floor {
            let now = rec.now();
            if let Some((before, since)) = last.filter(|(before, _)| floor > *before) {
                tracing_line(&format!("{}: cache floor moved from {before} to {floor}", route.name));
                let start = ReplicaStart { route: route.name.clone(), at: since, answers_from: Some(now) };
                rec.replica_starts.lock().unwrap().push(start);
            }
            last = Some((floor, asked));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn tracing_line(s: &str) {
    if std::env::var_os("ROBUSTNESS_VERBOSE").is_some() {
        eprintln!("{s}");
    }
}

/// What one run did, beside its history.
pub struct Run {
    pub history: History,
    /// (kind, what happened when) of each fault.
    pub faults: Vec<(&'static str, String)>,
    /// What happened when, for each replacement of a rollout.
    pub replacements: Vec<String>,
    pub took: Duration,
}

/// What a rollback left: whether a namespace with PodSets, deleted, goes away (an APIService left without a server
/// fails kube-controller-manager's discovery, and every deletion stalls), and the APIServices of demo.k8s.io.
fn after_rollback(c: &Cluster, rec: &Recorder) -> AfterRollback {
    let namespace = "after-rollback";
    c.kubectl(&["create", "namespace", namespace]);
    let podsets: Vec<String> = (0..2)
        .map(|i| serde_json::to_string(&podset(namespace, &format!("ps-{i}"), "after-rollback", 1)).unwrap())
        .collect();
    c.apply_text("after-rollback.yaml", &podsets.join("\n---\n"));
    let deleted = rec.now();
    c.kubectl(&["delete", "namespace", namespace, "--wait=false"]);
    let deadline = Instant::now() + Duration::from_secs(90);
    let gone = loop {
        if c.kubectl_try(&["get", "namespace", namespace]).is_err_and(|e| e.contains("NotFound")) {
            break Some(rec.now());
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let conditions = c
        .kubectl_try(&[
            "get",
            "namespace",
            namespace,
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status}: {.message}{\"\\n\"}{end}",
        ])
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let apiservices = c
        .kubectl(&["get", "apiservices", "-o", "jsonpath={.items[*].metadata.name}"])
        .split_whitespace()
        .filter(|n| n.ends_with(".demo.k8s.io"))
        .map(str::to_owned)
        .collect();
    AfterRollback { namespace: namespace.into(), deleted, gone, conditions, apiservices }
}

/// Runs the cluster, the traffic and the faults of `opts.seed`, and returns the history. Inside the namespace.
pub fn run(opts: &Options) -> Run {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // etcd's members run as users of their own (to be cut from their peers alone): they must get to their data.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    for i in 0..opts.replicas {
        sh(&format!("ip addr replace {}/32 dev lo", etcd_route(i)));
    }
    let mut etcd = EtcdCluster::start(&assets_dir().join("etcd"), dir.path(), 3);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // etcd's record is read as it grows: compaction erases etcd's own history.
    let record = Arc::new(EtcdRecord::default());
    let record_stop = CancellationToken::new();
    let record_task = rt.spawn(record.clone().follow(etcd.endpoints(), record_stop.clone()));
    let servers: Vec<String> = (0..opts.replicas)
        .map(|i| {
            (0..etcd.len())
                .map(|m| format!("http://{}:{}", etcd_route(i), etcd.client_port(m)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    // The harness compacts etcd, behind its record; the servers do not. Caches keep all of a run's history, so
    // each begins where its process read the store (or where it reloaded after etcd compacted past it), and a
    // watch from later must never be told 410. The build before v1beta1 has these flags too.
    let with_history = |command: &ServerCommand| {
        let mut command = command.clone();
        command.args.extend(
            ["--etcd-compaction-interval=0", "--watch-history-seconds=3600", "--watch-history-max-bytes=1073741824"]
                .map(Into::into),
        );
        command
    };
    let server = with_history(&opts.server);
    let old = opts.rollout.as_ref().map(|r| with_history(&r.old));
    assert!(old.is_none() || opts.faults == 0, "a rollout's replacements are its only faults");
    let mut c = match &old {
        Some(old) => {
            Cluster::start_replicated_serving(old.clone(), opts.replicas, servers, &rollout::versions(Build::Old))
        }
        None => Cluster::start_replicated_on(server.clone(), opts.replicas, servers),
    };
    c.wait_for("a controller leader", Duration::from_secs(60), |c| c.controller_leader().is_some());

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
        let namespaces: Api<Namespace> = Api::all(main.clone());
        let versions = old.is_some().then_some(VERSIONS_NAMESPACE);
        for ns in NAMESPACES[1..].iter().copied().chain(versions) {
            let body = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
            namespaces.create(&Default::default(), &body).await.expect("a namespace for the clients");
        }
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
            (0..opts.replicas).map(|i| ReplicaStart { route: replica_route(i), at: 0, answers_from: None }).collect(),
        ),
        compactions: Mutex::default(),
        defragmentations: Mutex::default(),
        version_answers: Mutex::default(),
        rollout: Mutex::default(),
    });
    // Which routes serve v1beta1 as the rollout goes; in a run of one build, the version client and prober do not
    // run.
    let serving = Arc::new(Serving::new(routes.len()));
    let stop = CancellationToken::new();
    // If the run panics (a rollout step that cannot register v1beta1, say), the traffic stops as the stack unwinds,
    // so the runtime can shut down; left running, the clients would go on calling a cluster that is gone.
    let _stop_on_unwind = stop.clone().drop_guard();
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
    // An informer on every route, for the whole run: every namespace or one; through the aggregator metadata
    // only, as kube-controller-manager's garbage collector and quota controller watch.
    let informers_stop = CancellationToken::new();
    let _informers_stop_on_unwind = informers_stop.clone().drop_guard();
    let mut informers = Vec::new();
    for (k, route) in routes.iter().enumerate() {
        let aggregator = route.name == AGGREGATOR;
        let namespace = if aggregator || k % 2 == 0 { "" } else { NAMESPACES[1] };
        let reached = Arc::new(AtomicU64::new(0));
        let informer = Informer {
            id: k,
            client: opts.clients + opts.watchers + k,
            route: route.clone(),
            namespace: namespace.into(),
            metadata_only: aggregator,
            reached: reached.clone(),
        };
        let rng = StdRng::seed_from_u64(opts.seed ^ ((k as u64 + 200) << 32));
        let task = rt.spawn(informer.run(rec.clone(), rng, informers_stop.clone()));
        informers.push((namespace, reached, task));
    }
    // Until the informers stop: a reload while they finish must be known too.
    let pollers: Vec<_> = routes
        .iter()
        .filter(|r| r.name != AGGREGATOR)
        .map(|route| rt.spawn(floor_poller(route.clone(), rec.clone(), informers_stop.clone())))
        .collect();
    if let Some(interval) = opts.compaction {
        let rng = StdRng::seed_from_u64(opts.seed ^ (300 << 32));
        let endpoints = etcd.endpoints();
        tasks.push(rt.spawn(compactor(record.clone(), endpoints, rec.clone(), interval, rng, stop.clone())));
    }
    let podsets: Api<PodSet> = Api::all(main.clone());
    let pods: Api<Pod> = Api::all(main.clone());
    tasks.push(rt.spawn(sampler(podsets.clone(), pods.clone(), rec.clone(), stop.clone())));
    if old.is_some() {
        for k in 0..routes.len() {
            let rng = StdRng::seed_from_u64(opts.seed ^ ((k as u64 + 400) << 32));
            tasks.push(rt.spawn(prober(k, routes.clone(), serving.clone(), rec.clone(), rng, stop.clone())));
        }
        let id = opts.clients + opts.watchers + routes.len();
        let rng = StdRng::seed_from_u64(opts.seed ^ (500 << 32));
        let mut client = VersionClient::new(id, routes.clone(), serving.clone(), rec.clone(), rng);
        let stop = stop.clone();
        tasks.push(rt.spawn(async move {
            while !stop.is_cancelled() {
                client.step().await;
            }
        }));
    }

    let mut faults = Vec::new();
    for p in plan(opts) {
        let wait = p.at.saturating_sub(rec.start.elapsed());
        std::thread::sleep(wait);
        let at = rec.start.elapsed();
        for done in inject(&mut c, &mut etcd, &rt, &rec, p) {
            faults.push((done.kind, format!("{:>6.1}s: {}", at.as_secs_f64(), done.what)));
        }
    }
    let mut replacements = Vec::new();
    if let (Some(r), Some(old)) = (&opts.rollout, &old) {
        let steps = rollout::plan(opts.replicas);
        for (n, (replica, build)) in steps.iter().copied().enumerate() {
            // The first step back waits out the hold with every replica on this build.
            let back = n > 0 && build == Build::Old && steps[n - 1].1 == Build::New;
            std::thread::sleep(if back { r.hold } else { r.every });
            let at = rec.start.elapsed();
            let command = if build == Build::New { &server } else { old };
            let done = rollout::replace(&mut c, &rt, &rec, &routes, &serving, replica, build, command);
            replacements.push(format!("{:>6.1}s: {}", at.as_secs_f64(), done.what));
        }
        // Traffic on the old build again.
        std::thread::sleep(r.every);
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
    let (changes, record_gap) = match rt.block_on(record.finish(etcd.endpoints())) {
        Ok(changes) => (changes, None),
        Err(gap) => (Vec::new(), Some(gap)),
    };
    let record_until = changes.last().map(|c| c.resource_version);
    record_stop.cancel();
    let _ = rt.block_on(record_task);
    // Every informer must get to etcd's last change in its scope; the checker says which did not.
    let reach_deadline = Instant::now() + Duration::from_secs(60);
    for (namespace, reached, _) in &informers {
        let last = changes.iter().filter(|c| in_namespace(namespace, &c.key)).map(|c| c.resource_version).max();
        while last.is_some_and(|l| reached.load(Ordering::Relaxed) < l) && Instant::now() < reach_deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    informers_stop.cancel();
    rt.block_on(async {
        for (_, _, t) in informers {
            let _ = t.await;
        }
        for t in pollers {
            let _ = t.await;
        }
    });

    let made: std::collections::HashSet<&str> = changes.iter().filter_map(|ch| ch.marker.as_deref()).collect();
    let replicas_sets = rec
        .replicas_sets
        .lock()
        .unwrap()
        .iter()
        // A lost write of /scale cannot be told apart in etcd's record: kept as if it may have happened.
        .filter(|(marker, s)| s.ret != NEVER || marker.as_deref().is_none_or(|m| made.contains(m)))
        .map(|(_, s)| s.clone())
        .collect();
    // Once etcd's record is read: the namespace's PodSets are no client's calls.
    let after_rollback = opts.rollout.as_ref().map(|_| after_rollback(&c, &rec));
    // A replica that exited on its own is not running any more: nothing restarts it here, as a kubelet would.
    let replica_exits = (0..opts.replicas)
        .filter_map(|i| {
            let (status, log) = c.replica_exit(i)?;
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].iter().map(|l| l.to_string()).collect();
            Some(ReplicaExit { route: replica_route(i), status: status.to_string(), log_tail: tail })
        })
        .collect();
    let history = History {
        seed: opts.seed,
        operations: std::mem::take(&mut *rec.operations.lock().unwrap()),
        watches: std::mem::take(&mut *rec.watches.lock().unwrap()),
        changes,
        replica_starts: std::mem::take(&mut *rec.replica_starts.lock().unwrap()),
        replica_exits,
        pod_counts: std::mem::take(&mut *rec.pod_counts.lock().unwrap()),
        replicas_sets,
        reconcile_grace: Duration::from_secs(30).as_nanos() as u64,
        settled,
        min_answered: opts.min_answered,
        compactions: std::mem::take(&mut *rec.compactions.lock().unwrap()),
        defragmentations: std::mem::take(&mut *rec.defragmentations.lock().unwrap()),
        record_gap,
        record_until,
        rollout: std::mem::take(&mut *rec.rollout.lock().unwrap()),
        version_answers: std::mem::take(&mut *rec.version_answers.lock().unwrap()),
        stored: record.stored(),
        after_rollback,
    };
    drop(c);
    drop(etcd);
    Run { history, faults, replacements, took: started.elapsed() }
}
