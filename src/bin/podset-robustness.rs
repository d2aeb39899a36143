//! The robustness harness's long form: seeded runs of a three-member etcd, podset-apiserver replicas behind the
//! aggregator, clients, watches and faults, each run's history checked. Every run gets a network namespace of its
//! own; a failing run prints its seed and the smallest failing piece of history.
//!
//! ```sh
//! cargo build --release --features envtest --bins
//! KUBEBUILDER_ASSETS=$(hack/install-test-assets.sh) target/release/podset-robustness --runs 100 --seed 1
//! ```

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use clap::Parser;
use podset_apiserver::envtest::{assets_dir, inside_namespace, namespace_command, ServerCommand};
use podset_apiserver::robustness::{self, harness};

#[derive(Parser)]
#[command(about = "Seeded robustness runs of podset-apiserver on a three-member etcd, each history checked")]
struct Args {
    /// The first run's seed; run n has seed + n.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 100)]
    runs: u64,
    /// The CI form (2 replicas, 3 faults) instead of the long one (3 replicas, 5 faults).
    #[arg(long)]
    short: bool,
    /// The podset-apiserver binary; by default the one beside this program.
    #[arg(long)]
    server: Option<PathBuf>,
    /// Keep each run's history as JSON in this directory (seed-<n>.json).
    #[arg(long)]
    save: Option<PathBuf>,
    /// Check a saved history instead of running anything.
    #[arg(long)]
    check: Option<PathBuf>,
}

const SUMMARY: &str = "robustness-summary";

fn main() {
    let args = Args::parse();
    if let Some(file) = &args.check {
        let history = serde_json::from_slice(&std::fs::read(file).expect("history file")).expect("history JSON");
        let report = robustness::check(&history);
        print!("{report}");
        std::process::exit(if report.ok() { 0 } else { 1 });
    }
    let server = args
        .server
        .clone()
        .unwrap_or_else(|| std::env::current_exe().expect("current executable").with_file_name("podset-apiserver"));
    if inside_namespace() {
        one_run(&args, server);
        return;
    }
    let exe = std::env::current_exe().expect("current executable");
    let (mut calls, mut faults, mut violations, mut failed) = (0u64, 0u64, 0u64, Vec::new());
    let started = Instant::now();
    for n in 0..args.runs {
        let seed = args.seed + n;
        let mut inner = vec!["--seed".to_owned(), seed.to_string(), "--server".into(), server.display().to_string()];
        if args.short {
            inner.push("--short".into());
        }
        if let Some(dir) = &args.save {
            inner.extend(["--save".to_owned(), dir.display().to_string()]);
        }
        let out = namespace_command(&exe, &inner)
            .env("KUBEBUILDER_ASSETS", assets_dir())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("unshare");
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        let summary = text.lines().find_map(|l| l.strip_prefix(SUMMARY)).map(|s| {
            s.split_whitespace().filter_map(|kv| kv.split_once('=')?.1.parse::<u64>().ok()).collect::<Vec<_>>()
        });
        match summary.as_deref() {
            Some(&[c, f, v]) if out.status.success() => {
                calls += c;
                faults += f;
                violations += v;
            }
            Some(&[c, f, v]) => {
                (calls, faults, violations) = (calls + c, faults + f, violations + v);
                failed.push(seed);
            }
            _ => failed.push(seed),
        }
    }
    println!(
        "{} runs in {:.0} min: {calls} calls checked, {faults} faults injected, {violations} violations; failed seeds: {failed:?}",
        args.runs,
        started.elapsed().as_secs_f64() / 60.0
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

fn one_run(args: &Args, server: PathBuf) {
    let command = ServerCommand { program: server, args: Vec::new() };
    let opts = if args.short {
        harness::Options::short(args.seed, command)
    } else {
        harness::Options::long(args.seed, command)
    };
    let run = harness::run(&opts);
    if let Some(dir) = &args.save {
        let file = dir.join(format!("seed-{}.json", args.seed));
        std::fs::write(&file, serde_json::to_vec(&run.history).unwrap()).expect("saving the history");
    }
    let report = robustness::check(&run.history);
    println!("seed {} took {:.0} s; faults:", args.seed, run.took.as_secs_f64());
    for f in &run.faults {
        println!("  {f}");
    }
    print!("{report}");
    println!("{SUMMARY} calls={} faults={} violations={}", report.calls, run.faults.len(), report.violations.len());
    if !report.ok() {
        std::process::exit(1);
    }
}
