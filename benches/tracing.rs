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

use common::workload::{creates_and_gets_in_turn, env};
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
    let servers: Vec<(&str, Server)> = targets.iter().map(|(name, _)| *name).zip(servers).collect();
    creates_and_gets_in_turn(&servers, n, get_for, rounds).await;
    println!("spans received by the collector: {}", collector.spans().len());
}
