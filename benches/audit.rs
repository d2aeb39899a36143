//! What auditing costs a request, and what an audit webhook that goes away costs: gets with 32 in flight, each
//! phase `AUDIT_PHASE_SECONDS` (30) long, on
//! - a server without an audit policy;
//! - one auditing every request at `Metadata` to a log file (`blocking`, kube-apiserver's default);
//! - one auditing every request at `Metadata` to a webhook (`batch`), its receiver up, then down, then up again.
//!
//! `cargo bench --bench audit` prints each phase's rate and server CPU per request, the ratios to the phase it
//! compares with, and the events the webhook backend lost (`apiserver_audit_error_total`).

mod common;
#[path = "../tests/common/webhook.rs"]
mod webhook;

use std::time::Duration;

use http::Request;

use common::workload::{podset, throughput_for};
use common::{send, Server, PATH};

const OBJECTS: usize = 1000;

fn phase_seconds() -> Duration {
    Duration::from_secs(std::env::var("AUDIT_PHASE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30))
}

/// Gets for `how_long`, 32 in flight: (requests a second, server CPU µs per request).
async fn gets_for(server: &Server, how_long: Duration) -> (f64, f64) {
    let get = |i: usize| Request::get(format!("{PATH}/b{:05}", i % OBJECTS)).body(vec![]).unwrap();
    throughput_for(&[server.client()], &[server.pid()], how_long, get).await
}

async fn fill(server: &Server) {
    let client = server.client();
    for i in 0..OBJECTS {
        let req = Request::post(PATH).header("content-type", "application/json");
        let (code, _) = send(&client, req.body(podset("demo.k8s.io/v1alpha1", &format!("b{i:05}"))).unwrap()).await;
        assert_eq!(code, 201);
    }
}

fn report(name: &str, (rate, cpu): (f64, f64), against: Option<(&str, (f64, f64))>) {
    let ratio = against.map(|(what, (r, c))| format!("  {:.2}x the rate, {:.2}x the CPU of {what}", rate / r, cpu / c));
    println!("{name:<34} {rate:>9.0} /s {cpu:>8.1} us CPU/request{}", ratio.unwrap_or_default());
}

async fn metric(server: &Server, name: &str) -> f64 {
    let (_, body) = send(&server.client(), Request::get("/metrics").body(vec![]).unwrap()).await;
    String::from_utf8_lossy(&body).lines().find_map(|l| l.strip_prefix(name)).map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let phase = phase_seconds();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n").unwrap();
    let policy_flag = format!("--audit-policy-file={}", policy.display());

    let plain = {
        let server = Server::start(&dir.path().join("plain"), &[]);
        fill(&server).await;
        gets_for(&server, phase).await
    };
    report("no audit policy", plain, None);

    let log = {
        let log_flag = format!("--audit-log-path={}", dir.path().join("audit.log").display());
        let server = Server::start(&dir.path().join("log"), &[&policy_flag, &log_flag]);
        fill(&server).await;
        gets_for(&server, phase).await
    };
    report("Metadata to a log file", log, Some(("no audit policy", plain)));

    // The webhook: a receiver on loopback, taken away for a phase and brought back at the same address.
    let ip = "127.0.0.1".parse().unwrap();
    let (ca, cert, key) = webhook::certificates(ip, "audit receiver CA");
    let receiver = webhook::WebhookServer::serve(ip, &cert, &key, ca.clone()).await;
    let addr = receiver.addr;
    let kubeconfig = dir.path().join("audit-webhook.kubeconfig");
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(&ca);
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n    server: https://{addr}/audit\n    certificate-authority-data: {ca_data}\n\
             users:\n- name: audit\n  user: {{}}\ncontexts:\n- name: audit\n  context: {{cluster: audit, user: audit}}\ncurrent-context: audit\n"
        ),
    )
    .unwrap();
    let hook_flag = format!("--audit-webhook-config-file={}", kubeconfig.display());
    let server = Server::start(&dir.path().join("webhook"), &[&policy_flag, &hook_flag]);
    fill(&server).await;
    let up = gets_for(&server, phase).await;
    report("Metadata to a webhook, up", up, Some(("no audit policy", plain)));
    let lost_before = metric(&server, "apiserver_audit_error_total{plugin=\"webhook\"} ").await;
    let received_up = receiver.received_all("/audit").len();
    drop(receiver);
    let down = gets_for(&server, phase).await;
    report("  the webhook down", down, Some(("it up", up)));
    let receiver = webhook::WebhookServer::serve_at(addr, &cert, &key, ca).await;
    let again = gets_for(&server, phase).await;
    report("  the webhook up again", again, Some(("it up", up)));
    // Batches still being retried when the receiver came back are delivered then; the rest are counted.
    let lost = metric(&server, "apiserver_audit_error_total{plugin=\"webhook\"} ").await - lost_before;
    let dropped = metric(&server, "apiserver_audit_error_total{plugin=\"buffered\"} ").await;
    let events = metric(&server, "apiserver_audit_event_total ").await;
    let received: usize = receiver.received_all("/audit").len();
    println!(
        "{:<34} {events:.0} events, {dropped:.0} dropped from a full queue, {lost:.0} given up after their retries, \
         {received_up} batches received while it was up, {received} since it came back",
        "  audit events"
    );
}
