//! `--tracing-config-file`: spans exported over OTLP/gRPC to a collector (envtest's receiver), named as
//! k8s.io/apiserver names them; a trusted caller's `traceparent` is the request span's parent; a slow collector
//! never holds a request; a bad file stops the start.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use http::Request;
use podset_envtest::otlp::{OtlpReceiver, Span};

const CREATE_SPAN: &str = "POST /apis/demo.k8s.io/v1alpha1/namespaces/{:namespace}/podsets";
/// kube's span kinds as OTLP numbers them.
const SERVER: i32 = 2;

fn tracing_config(dir: &Path, endpoint: &str, rate: u32) -> PathBuf {
    let path = dir.join("tracing.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {endpoint}\n\
             samplingRatePerMillion: {rate}\n"
        ),
    )
    .unwrap();
    path
}

fn traced_server(dir: &Path, endpoint: &str, rate: u32) -> TestServer {
    let flag = format!("--tracing-config-file={}", tracing_config(dir, endpoint, rate).display());
    TestServer::start(&[&flag])
}

async fn create(client: &kube::Client, name: &str, audit_id: &str, traceparent: Option<&str>) {
    let mut req = Request::post(PODSETS).header("Audit-ID", audit_id).header("content-type", "application/json");
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let (code, _, body) = raw(client, req.body(podset(name, 1).to_string().into_bytes()).unwrap()).await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
}

fn with_audit_id<'a>(spans: &'a [Span], id: &str) -> Option<&'a Span> {
    spans.iter().find(|s| s.attribute("audit-id") == Some(id))
}

/// The spans under `root` (children, their children, ...), by name.
fn descendants<'a>(spans: &'a [Span], root: &Span) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = Vec::new();
    let mut parents = vec![root.span_id.clone()];
    while let Some(parent) = parents.pop() {
        for s in spans.iter().filter(|s| s.parent_span_id == parent) {
            parents.push(s.span_id.clone());
            found.push(s);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_is_a_request_span_with_its_storage_children_and_a_trusted_traceparent_is_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let collector = OtlpReceiver::start();
    let server = traced_server(dir.path(), &collector.endpoint(), 1_000_000);
    let client = server.client();

    create(&client, "traced", "trace-create", None).await;
    let spans = collector.wait_for(Duration::from_secs(20), |s| {
        with_audit_id(s, "trace-create").is_some_and(|r| descendants(s, r).iter().any(|c| c.name == "sled.commit"))
    });
    let request = with_audit_id(&spans, "trace-create").unwrap_or_else(|| panic!("no request span: {spans:#?}"));
    assert_eq!((request.name.as_str(), request.kind), (CREATE_SPAN, SERVER));
    assert_eq!(request.service, "podset-apiserver");
    assert_eq!(request.parent_span_id, "", "no traceparent: a root");
    for (key, want) in [("http.response.status_code", "201"), ("verb", "create"), ("resource", "podsets")] {
        assert_eq!(request.attribute(key), Some(want), "{key}: {request:#?}");
    }
    let below: Vec<&str> = descendants(&spans, request).iter().map(|s| s.name.as_str()).collect();
    for want in ["Create", "sled.commit"] {
        assert!(below.contains(&want), "{want} under the request: {below:?}");
    }
    assert!(descendants(&spans, request).iter().all(|s| s.trace_id == request.trace_id));

    // The server's user here (--insecure-allow-all) is in system:masters: its traceparent is the parent.
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    create(&client, "child", "trace-child", Some(&format!("00-{trace}-{parent}-01"))).await;
    let spans = collector.wait_for(Duration::from_secs(20), |s| with_audit_id(s, "trace-child").is_some());
    let child = with_audit_id(&spans, "trace-child").unwrap_or_else(|| panic!("no span: {spans:#?}"));
    assert_eq!((child.trace_id.as_str(), child.parent_span_id.as_str()), (trace, parent));
    assert!(child.links.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rate_zero_only_a_trusted_sampled_parent_makes_spans() {
    let dir = tempfile::tempdir().unwrap();
    let collector = OtlpReceiver::start();
    let server = traced_server(dir.path(), &collector.endpoint(), 0);
    let client = server.client();
    create(&client, "unsampled", "rate-zero", None).await;
    create(
        &client,
        "unsampled-parent",
        "rate-zero-parent",
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
    )
    .await;
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    create(&client, "sampled", "rate-zero-sampled", Some(sampled)).await;
    let spans = collector.wait_for(Duration::from_secs(20), |s| with_audit_id(s, "rate-zero-sampled").is_some());
    assert!(with_audit_id(&spans, "rate-zero-sampled").is_some(), "{spans:#?}");
    // The batch that carried the sampled one would carry the others: they were made before it.
    let unsampled: Vec<_> = spans.iter().filter(|s| s.trace_id != "0af7651916cd43dd8448eb211c80319c").collect();
    assert!(unsampled.is_empty(), "{unsampled:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_holds_exports_or_is_gone_holds_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let collector = OtlpReceiver::start();
    // Each export held far longer than the exporter waits (10 s).
    collector.set_delay(Duration::from_secs(600));
    let server = traced_server(dir.path(), &collector.endpoint(), 1_000_000);
    let client = server.client();
    for i in 0..200 {
        create(&client, &format!("held-{i}"), &format!("held-{i}"), None).await;
    }
    assert!(collector.spans().is_empty(), "every export is still held, and every request was answered");

    // Nothing listening at all.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = traced_server(dir.path(), &gone.to_string(), 1_000_000);
    let client = server.client();
    for i in 0..50 {
        create(&client, &format!("gone-{i}"), &format!("gone-{i}"), None).await;
    }
}

#[test]
fn a_bad_tracing_configuration_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tracing.yaml");
    for (content, want) in [
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: 2000000\n",
            "samplingRatePerMillion: Invalid value: 2000000: sampling rate per million must be less than or equal to one million",
        ),
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: https://collector:4318\n",
            "unsupported scheme: https",
        ),
        ("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingrate: 1\n", "unknown field \"samplingrate\""),
    ] {
        std::fs::write(&path, content).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
            .args(["--insecure-allow-all", "--secure-port=0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg(format!("--tracing-config-file={}", path.display()))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && err.contains(&path.display().to_string()), "{content}: {err}");
    }
}
