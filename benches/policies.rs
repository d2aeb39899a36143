//! What admission policies cost a create, and what loaded policies cost in memory: PodSets created through
//! kube-apiserver's aggregator on the local control plane, our server reading its policies from the
//! `staticManifestsDir`s of ValidatingAdmissionPolicy and MutatingAdmissionPolicy, which the bench rewrites between
//! phases (the server reloads them while serving):
//! - no policy;
//! - 10 validating policies bound, none matching PodSets (they select ConfigMaps);
//! - the same 10, one of them matching PodSets with three validations that pass;
//! - one mutating policy matching PodSets: an ApplyConfiguration adding a label and a sidecar to the template;
//! - no policy, the PodSets sent as that policy makes them (what the policy itself costs, apart from the larger
//!   PodSets and Pods it makes);
//! - 500 policies and 500 bindings, none matching PodSets: the server's resident memory against no policy, in
//!   cycles of both.
//!
//! The embedded controller is off: its Pods for the PodSets (the same in every phase, measured by
//! benches/controller.rs) would cost each phase what the phases before it left to do, at its write rate limit and
//! with a pass over the namespace's Pods per PodSet. A phase's server CPU per create counts from its first create
//! until the server is idle again after its last.
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
use common::{cpu_us, rss_mb, send};

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

/// A mutating policy adding a label and a sidecar to every PodSet's template, and its binding.
const MUTATING: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: sidecar.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >-
        Object{
          metadata: Object.metadata{labels: {"policy.example.com/injected": "true"}},
          spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{
            containers: [Object.spec.template.spec.containers{name: "sidecar", image: "registry.example.com/proxy:2"}]}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: sidecar-binding.static.k8s.io}
spec: {policyName: sidecar.static.k8s.io}
"#;

/// A PodSet's body as [`MUTATING`] leaves it: with its label and sidecar.
fn as_mutated(body: &[u8]) -> Vec<u8> {
    let mut o: serde_json::Value = serde_json::from_slice(body).unwrap();
    o["metadata"]["labels"]["policy.example.com/injected"] = "true".into();
    let containers = o["spec"]["template"]["spec"]["containers"].as_array_mut().unwrap();
    containers.push(serde_json::json!({"name": "sidecar", "image": "registry.example.com/proxy:2"}));
    serde_json::to_vec(&o).unwrap()
}

/// Waits until the server is idle (under 5 % of a core over 300 ms; at most two minutes), and returns its CPU time
/// (µs) when it last worked.
async fn settle(pid: u32) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = cpu_us(pid);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = cpu_us(pid);
        if now - last < 15_000.0 || Instant::now() > deadline {
            return last;
        }
        last = now;
    }
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
    let (manifests, mutating) = (dir.path().join("policies"), dir.path().join("mutating"));
    for d in [&manifests, &mutating] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("policies.yaml"), "").unwrap();
    }
    let config = dir.path().join("admission.yaml");
    let plugin = |name: &str, dir: &Path| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: {name}Configuration\n    \
             staticManifestsDir: {}\n",
            dir.display()
        )
    };
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("ValidatingAdmissionPolicy", &manifests),
            plugin("MutatingAdmissionPolicy", &mutating)
        ),
    )
    .unwrap();
    let args = vec![
        format!("--admission-control-config-file={}", config.display()).into(),
        "--enable-controller=false".into(),
    ];
    let c = Cluster::start(ServerCommand { program: BIN.into(), args });
    let pid = c.pid("podset-apiserver").expect("our server's pid");
    let none = String::new();
    let ten_none: String = (0..10).map(|i| policy(i, false)).collect();
    let ten_one: String = (0..9).map(|i| policy(i, false)).chain([policy(9, true)]).collect();
    let mutating_one = MUTATING.to_owned();
    // (name, validating policies, mutating policies, PodSets sent with the label and sidecar)
    let phases = [
        ("no policy", &none, &none, false),
        ("10 bound, none matching", &ten_none, &none, false),
        ("10 bound, 1 matching (3 validations)", &ten_one, &none, false),
        ("1 mutating matching (label + sidecar)", &none, &mutating_one, false),
        ("no policy, sent with label + sidecar", &none, &none, true),
    ];
    let mut reloads = 0;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut results = vec![(Vec::new(), Vec::new()); phases.len()];
    let client = rt.block_on(c.client());
    // Memory first, while the server holds no PodSet: cycles of no policy, then the 500, each settled (after reads
    // and past the allocator's decay of freed pages); the median of the cycles' differences is the figure.
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
        let run = |tag: String, n: usize, injected: bool| {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let make = move |i: usize| {
                    let req = Request::post(path.clone()).header("content-type", "application/json");
                    let body = podset("demo.k8s.io/v1alpha1", &format!("{tag}-{i:05}"));
                    req.body(if injected { as_mutated(&body) } else { body }).unwrap()
                };
                throughput(&[client], &[pid], n, make).await
            }
        };
        run("warm".into(), 300, false).await;
        for round in 0..rounds {
            // Each round starts at another phase: the objects made so far weigh on no phase more than another.
            for p in (0..phases.len()).map(|i| (i + round) % phases.len()) {
                let (_, validating, mutating_policies, injected) = phases[p];
                set_policies(&c, &manifests, validating, &mut reloads);
                set_policies(&c, &mutating, mutating_policies, &mut reloads);
                run(format!("w{round}-{p}"), 100, injected).await;
                settle(pid).await;
                let before = cpu_us(pid);
                let (rate, _) = run(format!("r{round}-{p}"), creates, injected).await;
                results[p].0.push(rate);
                results[p].1.push((settle(pid).await - before) / creates as f64);
            }
        }
    });
    println!(
        "PodSet creates through kube-apiserver 1.20's aggregator, {creates} per phase, {} in flight, {rounds} rounds (medians)",
        common::workload::CONCURRENCY
    );
    let base = (median(results[0].0.clone()), median(results[0].1.clone()));
    for ((name, _, _, _), (rates, cpus)) in phases.iter().zip(&results) {
        let (rate, cpu) = (median(rates.clone()), median(cpus.clone()));
        println!(
            "{name:<40} {rate:>7.0} creates/s ({:.2}x)   {cpu:>6.1} us server CPU per create ({:.2}x)",
            rate / base.0,
            cpu / base.1
        );
    }
    println!("{memory}");
}
