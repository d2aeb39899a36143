//! What ValidatingAdmissionPolicy costs a create, and what loaded policies cost in memory: PodSets created through
//! kube-apiserver's aggregator on the local control plane, our server reading its policies from a
//! `staticManifestsDir` that the bench rewrites between phases (the server reloads it while serving):
//! - no policy;
//! - 10 policies bound, none matching PodSets (they select ConfigMaps);
//! - the same 10, one of them matching PodSets with three validations that pass;
//! - 500 policies and 500 bindings, none matching PodSets: the server's resident memory against no policy, in
//!   cycles of both.
//!
//! `cargo bench --bench policies` (as root, with KUBEBUILDER_ASSETS set: see hack/test.sh). `POLICY_CREATES` sets
//! the creates per phase (default 2000), `POLICY_ROUNDS` the rounds the phases are run in turn, each round
//! starting at the next phase (default 3; the medians are printed).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use http::Request;
use podset_envtest::{reenter_namespace, Cluster, ServerCommand};

use common::workload::{median, podset, throughput};
use common::{rss_mb, send};

const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");
const NS: &str = "bench";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A policy and its binding; `podsets` selects PodSets, else ConfigMaps.
fn policy(i: usize, podsets: bool) -> String {
    let (group, resource) = if podsets { ("demo.k8s.io", "podsets") } else { ("\"\"", "configmaps") };
    format!(
        r#"---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: bench-{i}.static.k8s.io}}
spec:
  matchConstraints:
    resourceRules:
    - {{apiGroups: [{group}], apiVersions: ["*"], resources: [{resource}], operations: [CREATE, UPDATE]}}
  validations:
  - expression: object.spec.replicas <= 100
    message: at most 100 replicas
  - expression: "!has(object.metadata.labels) || !('forbidden' in object.metadata.labels)"
  - expression: object.metadata.name.size() <= 63
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: bench-{i}-binding.static.k8s.io}}
spec: {{policyName: bench-{i}.static.k8s.io, validationActions: [Deny]}}
"#
    )
}

/// Rewrites the manifests to `policies` and waits until the server has reloaded them (its log says so).
fn set_policies(c: &Cluster, dir: &Path, policies: &str, reloads: &mut usize) {
    let file = dir.join("policies.yaml");
    if std::fs::read_to_string(&file).is_ok_and(|now| now == policies) {
        return;
    }
    std::fs::write(file, policies).unwrap();
    *reloads += 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.podset_log().matches("Reloaded manifest-based admission configuration").count() < *reloads {
        assert!(Instant::now() < deadline, "the server did not reload its manifests");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    reenter_namespace();
    let (creates, rounds) = (env_or("POLICY_CREATES", 2000), env_or("POLICY_ROUNDS", 3));
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("policies");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("policies.yaml"), "").unwrap();
    let config = dir.path().join("admission.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ValidatingAdmissionPolicy\n  \
             configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: ValidatingAdmissionPolicyConfiguration\n    \
             staticManifestsDir: {}\n",
            manifests.display()
        ),
    )
    .unwrap();
    let args = vec![format!("--admission-control-config-file={}", config.display()).into()];
    let c = Cluster::start(ServerCommand { program: BIN.into(), args });
    let pid = c.pid("podset-apiserver").expect("our server's pid");
    let none = String::new();
    let ten_none: String = (0..10).map(|i| policy(i, false)).collect();
    let ten_one: String = (0..9).map(|i| policy(i, false)).chain([policy(9, true)]).collect();
    let phases = [
        ("no policy", &none),
        ("10 bound, none matching", &ten_none),
        ("10 bound, 1 matching (3 validations)", &ten_one),
    ];
    let mut reloads = 0;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut results = vec![(Vec::new(), Vec::new()); phases.len()];
    let client = rt.block_on(c.client());
    // Memory first, while the server holds no PodSet (later, the controller's caches grow with the Pods it makes):
    // cycles of no policy, then the 500, each settled (after reads and past the allocator's decay of freed pages);
    // the median of the cycles' differences is the figure.
    let reads = || {
        rt.block_on(async {
            for _ in 0..200 {
                let req = Request::get("/apis/demo.k8s.io/v1alpha1/podsets").body(Vec::new()).unwrap();
                assert_eq!(send(&client, req).await.0, 200);
            }
        })
    };
    let settled_rss = || {
        reads();
        std::thread::sleep(Duration::from_secs(3));
        reads();
        rss_mb(pid).0
    };
    let many: String = (0..500).map(|i| policy(i, false)).collect();
    let mut cycles = Vec::new();
    for _ in 0..3 {
        set_policies(&c, &manifests, &none, &mut reloads);
        let before = settled_rss();
        set_policies(&c, &manifests, &many, &mut reloads);
        cycles.push((before, settled_rss()));
    }
    let text: Vec<String> = cycles.iter().map(|(b, a)| format!("{b:.1} -> {a:.1}")).collect();
    let memory = format!(
        "500 policies and 500 bindings loaded (none matching PodSets): RSS +{:.1} MB (median of {} cycles: {})",
        median(cycles.iter().map(|(b, a)| a - b).collect()),
        cycles.len(),
        text.join(", ")
    );
    rt.block_on(async {
        let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        let req = Request::post("/api/v1/namespaces").header("content-type", "application/json");
        assert_eq!(send(&client, req.body(ns.to_string().into_bytes()).unwrap()).await.0, 201);
        let path = format!("/apis/demo.k8s.io/v1alpha1/namespaces/{NS}/podsets");
        let run = |tag: String, n: usize| {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let make = move |i: usize| {
                    let req = Request::post(path.clone()).header("content-type", "application/json");
                    req.body(podset("demo.k8s.io/v1alpha1", &format!("{tag}-{i:05}"))).unwrap()
                };
                throughput(&[client], &[pid], n, make).await
            }
        };
        run("warm".into(), 300).await;
        for round in 0..rounds {
            // Each round starts at another phase: the objects made so far (and the controller's work on them)
            // weigh on no phase more than on another.
            for p in (0..phases.len()).map(|i| (i + round) % phases.len()) {
                let policies = phases[p].1;
                set_policies(&c, &manifests, policies, &mut reloads);
                run(format!("w{round}-{p}"), 100).await;
                let (rate, cpu) = run(format!("r{round}-{p}"), creates).await;
                results[p].0.push(rate);
                results[p].1.push(cpu);
            }
        }
    });
    println!(
        "PodSet creates through kube-apiserver 1.20's aggregator, {creates} per phase, {} in flight, {rounds} rounds (medians)",
        common::workload::CONCURRENCY
    );
    let base = (median(results[0].0.clone()), median(results[0].1.clone()));
    for ((name, _), (rates, cpus)) in phases.iter().zip(&results) {
        let (rate, cpu) = (median(rates.clone()), median(cpus.clone()));
        println!(
            "{name:<40} {rate:>7.0} creates/s ({:.2}x)   {cpu:>6.1} us server CPU per create ({:.2}x)",
            rate / base.0,
            cpu / base.1
        );
    }
    println!("{memory}");
}
