//! The robustness harness's short form (CI): a three-member etcd, two podset-apiserver replicas behind the
//! aggregator with the controller on, clients and watches on every route, three faults from a seed, and the
//! history checked. The seed is 1 unless `ROBUSTNESS_SEED=<n>` names another, `ROBUSTNESS_HISTORY=<file>` keeps its history
//! (`podset-robustness --check <file>` checks it again); the long form is `podset-robustness`.

mod common;

use common::cluster::in_namespace;
use podset_envtest::ServerCommand;
use podset_robustness::{self as robustness, harness};

/// `ROBUSTNESS_SEED`, else 1.
fn seed() -> u64 {
    std::env::var("ROBUSTNESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

fn this_build() -> ServerCommand {
    ServerCommand { program: common::BIN.into(), args: Vec::new() }
}

/// Keeps the run's history if `ROBUSTNESS_HISTORY` names a file, prints the report with what the run did to the
/// replicas (`what`: its `moves`), and requires it to find nothing.
fn checked<'a>(run: &harness::Run, seed: u64, what: &str, moves: impl Iterator<Item = &'a str>) {
    if let Some(file) = std::env::var_os("ROBUSTNESS_HISTORY") {
        std::fs::write(file, serde_json::to_vec(&run.history).unwrap()).unwrap();
    }
    let report = robustness::check(&run.history);
    let moves = moves.collect::<Vec<_>>().join("\n  ");
    eprintln!("seed {seed} took {:.0} s; {what}:\n  {moves}\n{report}", run.took.as_secs_f64());
    assert!(report.ok(), "{report}");
}

#[test]
fn short_form_under_faults_keeps_every_guarantee() {
    in_namespace("short_form_under_faults_keeps_every_guarantee", || {
        // One seed for CI, so a red run replays (the long form, podset-robustness, draws many); its timings
        // still differ from run to run.
        let seed = seed();
        let opts = harness::Options::short(seed, this_build());
        let run = harness::run(&opts);
        checked(&run, seed, "faults", run.faults.iter().map(|f| f.1.as_str()));
        assert_eq!(run.faults.len(), opts.faults);
        // The run did work under its faults (the checker fails one with too few answers): watches saw events.
        assert!(run.history.watches.iter().any(|w| w.items.len() > 5), "no watch saw events");
        assert!(!run.history.pod_counts.is_empty(), "Pods were never counted");
    });
}

/// A rolling upgrade from the build before v1beta1 and back (docs/install.md): three replicas start on the old
/// build, are replaced one at a time by this build under the same traffic, watches and informers, and rolled back
/// one at a time once v1beta1 is unregistered. Beside every guarantee above: every v1alpha1 URL answered v1alpha1
/// objects, spec.minReadySeconds written through v1beta1 outlived the old build's writes, and the rollback left
/// no namespace deletion stalled and no APIService without a server.
#[test]
fn rolling_upgrade_from_the_v1alpha1_only_build_and_back_keeps_every_guarantee() {
    in_namespace("rolling_upgrade_from_the_v1alpha1_only_build_and_back_keeps_every_guarantee", || {
        let seed = seed();
        let old = ServerCommand { program: common::old_release_binary(), args: Vec::new() };
        let opts = harness::Options::upgrade(seed, this_build(), old);
        let run = harness::run(&opts);
        checked(&run, seed, "replacements", run.replacements.iter().map(String::as_str));
        assert_eq!(run.history.rollout.len(), 2 * opts.replicas);
        // spec.minReadySeconds went in through v1beta1 and was stored, so the old build's writes had one to keep.
        let beta_writes =
            run.history.version_answers.iter().filter(|a| a.asked == "v1beta1" && a.call.starts_with("patch"));
        assert!(beta_writes.count() > 0, "no write through v1beta1 was answered");
        assert!(run.history.stored.iter().any(|s| s.min_ready_seconds.is_some()), "spec.minReadySeconds never stored");
    });
}

/// Bugs planted in the server on purpose (src/planted.rs): each must be caught, and named, by the same checker
/// that passes the runs above. One cluster per bug, no faults (but a paused leader for a leader that outlives its
/// Lease); about a minute each.
fn planted_bug_is_caught(test: &str, bug: &str, named: &[&str]) {
    in_namespace(test, || {
        let opts = harness::Options::planted(1, this_build(), bug);
        let run = harness::run(&opts);
        let report = robustness::check(&run.history);
        eprintln!("planted {bug}: {report}");
        let found: Vec<&str> = report.violations.iter().map(|(what, _)| what.as_str()).collect();
        assert!(
            named.iter().any(|n| found.iter().any(|f| f.starts_with(n))),
            "planted {bug}: expected one of {named:?}, the checker found {found:?}\n{report}"
        );
    });
}

#[test]
fn planted_ack_before_commit_is_caught() {
    planted_bug_is_caught("planted_ack_before_commit_is_caught", "ack-before-commit", &["acknowledged write lost"]);
}

#[test]
fn planted_conflict_after_commit_is_caught() {
    planted_bug_is_caught(
        "planted_conflict_after_commit_is_caught",
        "conflict-after-commit",
        &["a refused write changed the store"],
    );
}

#[test]
fn planted_dropped_watch_event_is_caught() {
    planted_bug_is_caught(
        "planted_dropped_watch_event_is_caught",
        "drop-watch-event",
        &["gap: a change never delivered"],
    );
}

#[test]
fn planted_stale_list_is_caught() {
    planted_bug_is_caught("planted_stale_list_is_caught", "stale-list", &["stale list"]);
}

#[test]
fn planted_stale_leader_is_caught() {
    planted_bug_is_caught(
        "planted_stale_leader_is_caught",
        "stale-leader",
        &[
            "twice the Pods asked for",
            "more Pods than a spec the controller reported done",
            "more Pods than spec.replicas",
        ],
    );
}
