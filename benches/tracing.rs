//! What tracing costs a request: creates (32 in flight, `TRACING_CREATES`, 3000) and then gets (32 in flight, for
//! `TRACING_GET_SECONDS`, 20) on the embedded store, with
//! - no `--tracing-config-file`;
//! - tracing on at `samplingRatePerMillion: 0` (spans made, none sampled);
//! - tracing on at 1000000 (every request's spans exported to envtest's OTLP receiver).
//!
//! The servers take turns, `TRACING_ROUNDS` (2) times, so a busy moment on a shared machine falls on all alike.
//! `cargo bench --bench tracing` prints each target's median rates and server CPU per request, and the ratios to
//! the untraced server's.

mod common;

use std::time::Duration;

use common::workload::{creates, env, gets, median};
use common::Server;
use podset_envtest::otlp::OtlpReceiver;

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (n, get_for, rounds) = (
        env("TRACING_CREATES", 3000) as usize,
        Duration::from_secs(env("TRACING_GET_SECONDS", 20)),
        env("TRACING_ROUNDS", 2) as usize,
    );
    let dir = tempfile::tempdir().unwrap();
    let collector = OtlpReceiver::start();
    let targets: [(&str, Option<u32>); 3] = [("off", None), ("rate 0", Some(0)), ("rate 1e6", Some(1_000_000))];
    let mut servers = Vec::new();
    for (name, rate) in &targets {
        let mut args = Vec::new();
        if let Some(rate) = rate {
            let file = dir.path().join(format!("{}.yaml", name.replace(' ', "-")));
            let text = format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {}\n\
                 samplingRatePerMillion: {rate}\n",
                collector.endpoint()
            );
            std::fs::write(&file, text).unwrap();
            args.push(format!("--tracing-config-file={}", file.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(Server::start(&dir.path().join(name.replace(' ', "-")), &args));
    }
    let mut results = vec![(Vec::new(), Vec::new(), Vec::new(), Vec::new()); targets.len()];
    for round in 0..rounds {
        for (i, server) in servers.iter().enumerate() {
            let (c, c_cpu) = creates(server, round, n).await;
            let (g, g_cpu) = gets(server, round, n, get_for).await;
            results[i].0.push(c);
            results[i].1.push(c_cpu);
            results[i].2.push(g);
            results[i].3.push(g_cpu);
        }
    }
    println!("{n} creates then {}s of gets, 32 in flight, {rounds} rounds (medians)", get_for.as_secs());
    let medians: Vec<[f64; 4]> =
        results.into_iter().map(|(a, b, c, d)| [median(a), median(b), median(c), median(d)]).collect();
    let off = medians[0];
    for ((name, _), m) in targets.iter().zip(&medians) {
        println!(
            "{name:<9} create {:>7.0}/s {:>6.1} us CPU ({:.2}x off's rate)   get {:>7.0}/s {:>6.1} us CPU ({:.2}x off's rate)",
            m[0],
            m[1],
            m[0] / off[0],
            m[2],
            m[3],
            m[2] / off[2]
        );
    }
    println!("spans received by the collector: {}", collector.spans().len());
}
