//! The robustness harness's long form: seeded runs of a three-member etcd, podset-apiserver replicas behind the
//! aggregator, clients, watches and faults, each run's history checked. Every run gets a network namespace of its
//! own; a failing run prints its seed and the smallest failing piece of history.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! KUBEBUILDER_ASSETS=$(hack/install-test-assets.sh) target/release/podset-robustness --runs 100 --seed 1 --jobs 2
//! ```

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;
use podset_envtest::{assets_dir, inside_namespace, namespace_command, ServerCommand};
use podset_robustness::{self as robustness, harness};

#[derive(Parser)]
#[command(about = "Seeded robustness runs of podset-apiserver on a three-member etcd, each history checked")]
struct Args {
    /// The first run's seed; run n has seed + n.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 100)]
    runs: u64,
    /// Runs at once (each uses about two thirds of a core).
    #[arg(long, default_value_t = 1)]
    jobs: u64,
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
    /// Print the faults each seed draws instead of running anything.
    #[arg(long)]
    plan: bool,
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
    if args.plan {
        for seed in args.seed..args.seed + args.runs {
            let command = ServerCommand { program: PathBuf::new(), args: Vec::new() };
            let opts =
                if args.short { harness::Options::short(seed, command) } else { harness::Options::long(seed, command) };
            let faults: Vec<String> = robustness::failpoint::plan(&opts)
                .iter()
                .map(|p| match p.with {
                    Some((with, _)) => format!("{:?} with {with:?}@{:?}", p.fault, p.at),
                    None => format!("{:?}@{:?}", p.fault, p.at),
                })
                .collect();
            println!("seed {seed}: {}", faults.join(", "));
        }
        return;
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
    let totals = Mutex::new(Totals::default());
    let next = AtomicU64::new(0);
    let started = Instant::now();
    // Each run has its own network namespace, so `--jobs` runs go side by side without sharing a port.
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= args.runs {
                    return;
                }
                let seed = args.seed + n;
                let (output, passed) = run_in_namespace(&exe, &args, &server, seed);
                let mut t = totals.lock().unwrap();
                // A run's whole output at once, so parallel runs do not interleave.
                print!("{output}");
                t.add(seed, &output, passed);
            });
        }
    });
    let Totals { sums, failed } = totals.into_inner().unwrap();
    let figures: Vec<String> = sums.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "{} runs in {:.0} min; failed seeds: {failed:?}\ntotals: {}",
        args.runs,
        started.elapsed().as_secs_f64() / 60.0,
        figures.join(" ")
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// The sums of the summary lines' named figures.
#[derive(Default)]
struct Totals {
    sums: std::collections::BTreeMap<String, u64>,
    failed: Vec<u64>,
}

impl Totals {
    /// Adds one run's summary line; a run that failed or printed none is a failed seed.
    fn add(&mut self, seed: u64, output: &str, success: bool) {
        let Some(summary) = output.lines().find_map(|l| l.strip_prefix(SUMMARY)) else {
            self.failed.push(seed);
            return;
        };
        for (k, v) in summary.split_whitespace().filter_map(|kv| kv.split_once('=')) {
            *self.sums.entry(k.to_owned()).or_default() += v.parse::<u64>().unwrap_or(0);
        }
        if !success {
            self.failed.push(seed);
        }
    }
}

/// One seeded run in a network namespace of its own: its output, and whether it passed.
fn run_in_namespace(exe: &Path, args: &Args, server: &Path, seed: u64) -> (String, bool) {
    let mut inner = vec!["--seed".to_owned(), seed.to_string(), "--server".into(), server.display().to_string()];
    if args.short {
        inner.push("--short".into());
    }
    if let Some(dir) = &args.save {
        inner.extend(["--save".to_owned(), dir.display().to_string()]);
    }
    let out = namespace_command(exe, &inner)
        .env("KUBEBUILDER_ASSETS", assets_dir())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("unshare");
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.success())
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
        // A history that cannot be kept must not cost the run's report.
        if let Err(e) =
            std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, serde_json::to_vec(&run.history).unwrap()))
        {
            eprintln!("seed {}: cannot keep the history in {}: {e}", args.seed, file.display());
        }
    }
    let report = robustness::check(&run.history);
    println!("seed {} took {:.0} s; faults:", args.seed, run.took.as_secs_f64());
    for (_, f) in &run.faults {
        println!("  {f}");
    }
    print!("{report}");
    let r = &report;
    let mut figures = vec![
        ("calls", r.calls),
        ("lost", r.calls_lost),
        ("refused", r.calls_refused),
        ("placed", r.calls_checked),
        ("undecided", r.undecided.len()),
        ("watch_items", r.watch_events),
        ("watches", r.watches),
        ("watches_with_state", r.watches_with_state),
        ("resumes", r.resumes),
        ("relists", r.relists),
        ("told_410", r.told_410),
        ("told_410_judged", r.told_410_judged),
        ("lists_told_410", r.reads_told_410),
        ("compactions", r.compactions),
        ("defragmentations", r.defragmentations),
        ("cache_reloads", r.cache_reloads),
        ("faults", run.faults.len()),
        ("violations", r.violations.len()),
    ]
    .into_iter()
    .map(|(k, v)| format!("{k}={v}"))
    .collect::<Vec<_>>();
    figures.extend(run.faults.iter().map(|(kind, _)| format!("fault:{kind}=1")));
    println!("{SUMMARY} {}", figures.join(" "));
    if !report.ok() {
        std::process::exit(1);
    }
}
