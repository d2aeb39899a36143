//! The storage backends side by side, and kube-apiserver serving the same type as a CRD on the same etcd: one
//! workload, over HTTPS on loopback, against
//!
//! - `sled`: the release server on its embedded store (the default backend);
//! - `etcd`: the release server with `--storage-backend=etcd` on the local control plane's etcd, under a prefix of
//!   its own;
//! - `etcd2`: two such servers on one prefix: requests take turns between them (half the creates to each,
//!   concurrently), and watch latency is from a write sent to one to the event arriving from the other;
//! - `crd`: kube-apiserver 1.20 on that same etcd, PodSet as a CRD (envtest's local control plane from
//!   `KUBEBUILDER_ASSETS`, in a private network namespace: nothing listens outside it).
//!
//! The measures, per target: creates per second (32 in flight, PodSets of about 0.7 KB), gets per second (consistent
//! reads, 32 in flight), the median of 15 lists of 2000 (JSON, received but not parsed), and the p50 / p99 from a
//! write being sent to each of the watchers receiving its event (200 writes, one at a time); beside each, the CPU
//! time per request of the API server(s) and of etcd, read from /proc. Each measure is taken on every target in
//! turn before the next measure, so a busy moment on a shared machine falls on all alike. Ratios say how many times
//! faster (or, for CPU, how many times cheaper) a target is than the CRD, and etcd than sled: above 1 is better.
//! Our servers run with `--insecure-allow-all`; kube-apiserver authenticates the admin's client certificate (RBAC
//! lets `system:masters` through without a lookup).
//!
//! `cargo bench --bench backends`, as root, with `KUBEBUILDER_ASSETS` set (see hack/test.sh).
//! Knobs (environment):
//! - `BACKENDS_N` (10000): PodSets created per target, at least 2000 (the lists);
//! - `BACKENDS_GETS` (20000): gets per target;
//! - `BACKENDS_WATCHERS` (10): watchers, each on a connection of its own;
//! - `BACKENDS_ONLY` (all): the targets to run, comma separated among `sled,etcd,etcd2,crd` (kube-apiserver and etcd
//!   start either way; a ratio needs both of its sides);
//! - `PODSET_APISERVER_BIN`, `PODSET_APISERVER_ARGS`: another build of our server, and flags for every one of ours
//!   (see benches/common).

mod common;

use std::future::Future;

use http::Request;

use common::workload::{create_range, list_ms, name, throughput, watch_latency, Target, Watchers, WATCH_WRITES};
use common::{cpu_us, Server, PATH};
use podset_envtest::reenter_namespace;

const TARGETS: [&str; 4] = ["sled", "etcd", "etcd2", "crd"];
const TITLES: [&str; 4] = ["sled", "etcd", "etcd, 2 replicas", "CRD on kube-apiserver 1.20"];
/// Ratios printed: (numerator target, denominator target), as "how many times better".
const RATIOS: [(usize, usize); 3] = [(1, 3), (2, 3), (1, 0)];

/// One target, running.
struct Subject {
    /// Index in `TARGETS`.
    kind: usize,
    target: Target,
    /// The API servers' processes (ours, or kube-apiserver).
    pids: Vec<u32>,
    /// Clients for the watchers: of the replica the writes do not go to, where there are two.
    watchers: Vec<kube::Client>,
    _servers: Vec<(Server, tempfile::TempDir)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Unit {
    PerSecond,
    Ms,
    CpuUs,
}

struct Row {
    label: String,
    unit: Unit,
    /// Per target (index in `TARGETS`).
    values: [Option<f64>; 4],
}

impl Row {
    /// How many times better `a` is than `b`.
    fn ratio(&self, a: usize, b: usize) -> Option<f64> {
        let (a, b) = (self.values[a]?, self.values[b]?);
        match self.unit {
            Unit::PerSecond => Some(a / b),
            Unit::Ms | Unit::CpuUs => Some(b / a),
        }
    }
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

impl Table {
    fn put(&mut self, label: &str, unit: Unit, kind: usize, value: f64) {
        let at = match self.rows.iter().position(|r| r.label == label) {
            Some(at) => at,
            None => {
                self.rows.push(Row { label: label.to_owned(), unit, values: [None; 4] });
                self.rows.len() - 1
            }
        };
        self.rows[at].values[kind] = Some(value);
    }

    fn print(&self, kinds: &[usize]) {
        let ratios: Vec<(usize, usize)> =
            RATIOS.iter().copied().filter(|(a, b)| kinds.contains(a) && kinds.contains(b)).collect();
        let mut head = String::from("| measure |");
        for k in kinds {
            head.push_str(&format!(" {} |", TITLES[*k]));
        }
        for (a, b) in &ratios {
            head.push_str(&format!(" {} vs {} |", TARGETS[*a], TARGETS[*b]));
        }
        println!("{head}");
        println!("|---|{}", "---|".repeat(kinds.len() + ratios.len()));
        for row in &self.rows {
            let mut line = format!("| {} |", row.label);
            for k in kinds {
                line.push_str(&format!(" {} |", row.values[*k].map(|v| figure(v, row.unit)).unwrap_or("—".into())));
            }
            for (a, b) in &ratios {
                line.push_str(&format!(" {} |", row.ratio(*a, *b).map(|r| format!("{r:.2}x")).unwrap_or("—".into())));
            }
            println!("{line}");
        }
        // The target: the etcd backend at least as fast as the CRD (time and rate; CPU is not speed).
        for (a, b) in ratios.iter().filter(|(_, b)| TARGETS[*b] == "crd") {
            let slower: Vec<String> = self
                .rows
                .iter()
                .filter(|r| r.unit != Unit::CpuUs)
                .filter_map(|r| r.ratio(*a, *b).filter(|x| *x < 1.0).map(|x| format!("{} ({x:.2}x)", r.label)))
                .collect();
            match slower.is_empty() {
                true => println!("{} at least as fast as the CRD on every measure", TARGETS[*a]),
                false => println!("{} slower than the CRD on: {}", TARGETS[*a], slower.join(", ")),
            }
        }
    }
}

/// A figure as the README writes it: thousands apart, a unit after.
fn figure(v: f64, unit: Unit) -> String {
    match unit {
        Unit::PerSecond => format!("{} /s", thousands(v)),
        Unit::Ms if v < 10.0 => format!("{v:.2} ms"),
        Unit::Ms => format!("{v:.1} ms"),
        Unit::CpuUs => format!("{} µs", thousands(v)),
    }
}

fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f` and returns its output with etcd's CPU time per request (`requests` of them) meanwhile.
async fn with_etcd_cpu<T>(etcd: u32, requests: usize, f: impl Future<Output = T>) -> (T, f64) {
    let before = cpu_us(etcd);
    let out = f.await;
    (out, (cpu_us(etcd) - before) / requests as f64)
}

/// Our server on `--storage-backend=etcd` under `prefix`, `replicas` of them; the watchers on the last.
fn on_etcd(kind: usize, etcd_url: &str, prefix: &str, replicas: usize, watchers: usize) -> Subject {
    let args = ["--storage-backend=etcd", &format!("--etcd-servers={etcd_url}"), &format!("--etcd-prefix={prefix}")];
    let servers: Vec<_> = (0..replicas)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            (Server::start(dir.path(), &args), dir)
        })
        .collect();
    let last = &servers[replicas - 1].0;
    Subject {
        kind,
        target: Target {
            path: PATH.into(),
            api_version: "demo.k8s.io/v1alpha1",
            clients: servers.iter().map(|(s, _)| s.client()).collect(),
        },
        pids: servers.iter().map(|(s, _)| s.pid()).collect(),
        watchers: (0..watchers).map(|_| last.client()).collect(),
        _servers: servers,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    tokio::runtime::Runtime::new().unwrap().block_on(run());
}

async fn run() {
    let n = knob("BACKENDS_N", 10_000);
    assert!(n >= 2000, "BACKENDS_N={n}: the lists need 2000 PodSets");
    let gets = knob("BACKENDS_GETS", 20_000);
    let watchers = knob("BACKENDS_WATCHERS", 10);
    let only = std::env::var("BACKENDS_ONLY").unwrap_or_else(|_| TARGETS.join(","));
    let kinds: Vec<usize> = (0..TARGETS.len()).filter(|k| only.split(',').any(|o| o.trim() == TARGETS[*k])).collect();
    assert!(!kinds.is_empty(), "BACKENDS_ONLY={only}: none of {TARGETS:?}");

    let (cluster, crd) = common::crd::start().await;
    let etcd = cluster.pid("etcd").unwrap();
    let mut subjects = Vec::new();
    for &kind in &kinds {
        subjects.push(match TARGETS[kind] {
            "sled" => {
                let dir = tempfile::tempdir().unwrap();
                let server = Server::start(dir.path(), &[]);
                Subject {
                    kind,
                    target: Target {
                        path: PATH.into(),
                        api_version: "demo.k8s.io/v1alpha1",
                        clients: vec![server.client()],
                    },
                    pids: vec![server.pid()],
                    watchers: (0..watchers).map(|_| server.client()).collect(),
                    _servers: vec![(server, dir)],
                }
            }
            "etcd" => on_etcd(kind, cluster.etcd_url(), "/bench-etcd", 1, watchers),
            "etcd2" => on_etcd(kind, cluster.etcd_url(), "/bench-etcd2", 2, watchers),
            _ => {
                let mut clients = Vec::new();
                for _ in 0..watchers {
                    clients.push(cluster.client().await);
                }
                let pids = vec![cluster.pid("kube-apiserver").unwrap()];
                Subject { kind, target: crd.clone(), pids, watchers: clients, _servers: Vec::new() }
            }
        });
    }
    eprintln!("targets: {only}; {n} PodSets each, {gets} gets, {watchers} watchers");

    let mut table = Table::default();
    let uses_etcd = |kind: usize| TARGETS[kind] != "sled";
    for s in &subjects {
        let ((rate, cpu), etcd_cpu) = with_etcd_cpu(etcd, n, create_range(&s.target, &s.pids, 0, n)).await;
        table.put("create /s (32 in flight)", Unit::PerSecond, s.kind, rate);
        table.put("API server CPU per create", Unit::CpuUs, s.kind, cpu);
        if uses_etcd(s.kind) {
            table.put("etcd CPU per create", Unit::CpuUs, s.kind, etcd_cpu);
        }
        eprintln!("{}: created {n}", TARGETS[s.kind]);
    }
    for s in &subjects {
        let path = s.target.path.clone();
        let get = move |i| Request::get(format!("{path}/{}", name(i % n))).body(vec![]).unwrap();
        let ((rate, cpu), etcd_cpu) =
            with_etcd_cpu(etcd, gets, throughput(&s.target.clients, &s.pids, gets, get)).await;
        table.put("get /s (32 in flight)", Unit::PerSecond, s.kind, rate);
        table.put("API server CPU per get", Unit::CpuUs, s.kind, cpu);
        if uses_etcd(s.kind) {
            table.put("etcd CPU per get", Unit::CpuUs, s.kind, etcd_cpu);
        }
    }
    for s in &subjects {
        table.put("list of 2000, median", Unit::Ms, s.kind, list_ms(&s.target, "application/json").await);
    }
    for s in &subjects {
        let ((p50, p99, cpu), etcd_cpu) =
            with_etcd_cpu(etcd, WATCH_WRITES, watch_latency(&s.target, &s.pids, &Watchers::Own(&s.watchers), watchers))
                .await;
        table.put(&format!("watch p50, {watchers} watchers (write sent → event)"), Unit::Ms, s.kind, p50);
        table.put(&format!("watch p99, {watchers} watchers"), Unit::Ms, s.kind, p99);
        table.put("API server CPU per watched write", Unit::CpuUs, s.kind, cpu);
        if uses_etcd(s.kind) {
            table.put("etcd CPU per watched write", Unit::CpuUs, s.kind, etcd_cpu);
        }
    }
    table.print(&kinds);
}
