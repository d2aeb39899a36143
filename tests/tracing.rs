//! `--tracing-config-file`: spans exported over OTLP/gRPC to a collector (envtest's receiver), named as
//! k8s.io/apiserver names them; a trusted caller's `traceparent` is the request span's parent; a slow collector
//! never holds a request; a bad file stops the start.

mod common;
#[path = "common/webhook.rs"]
mod webhook;

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

/// Every span received once the request `id`'s span is in (up to 20 s), and that span.
fn request_span(collector: &OtlpReceiver, id: &str) -> (Vec<Span>, Span) {
    let spans = collector.wait_for(Duration::from_secs(20), |s| with_audit_id(s, id).is_some());
    let span = with_audit_id(&spans, id).unwrap_or_else(|| panic!("no span for {id}: {spans:#?}")).clone();
    (spans, span)
}

/// Asserts that `request`'s trace holds the SubjectAccessReview it made, as a client span under it.
fn assert_reviewed_in_trace(spans: &[Span], request: &Span) {
    let calls: Vec<String> = descendants(spans, request)
        .iter()
        .map(|s| format!("{} {}", s.name, s.attribute("url.full").unwrap_or("")))
        .collect();
    assert!(calls.iter().any(|c| c.starts_with("HTTP POST") && c.contains("subjectaccessreviews")), "{calls:?}");
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

/// `root` and what is under it, indented (what docs/operate.md shows).
fn tree(spans: &[Span], root: &Span, depth: usize) -> String {
    let mut out = format!("{}{}\n", "  ".repeat(depth), root.name);
    let mut children: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == root.span_id).collect();
    children.sort_by_key(|s| s.start_unix_nanos);
    for c in children {
        out.push_str(&tree(spans, c, depth + 1));
    }
    out
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
    eprintln!("{}", tree(&spans, request, 0));
    let below: Vec<&str> = descendants(&spans, request).iter().map(|s| s.name.as_str()).collect();
    for want in ["Create", "sled.commit"] {
        assert!(below.contains(&want), "{want} under the request: {below:?}");
    }
    assert!(descendants(&spans, request).iter().all(|s| s.trace_id == request.trace_id));

    // The server's user here (--insecure-allow-all) is in system:masters: its traceparent is the parent.
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    create(&client, "child", "trace-child", Some(&format!("00-{trace}-{parent}-01"))).await;
    let (_, child) = request_span(&collector, "trace-child");
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
async fn a_rate_samples_that_share_of_new_traces_each_whole() {
    let dir = tempfile::tempdir().unwrap();
    let collector = OtlpReceiver::start();
    let server = traced_server(dir.path(), &collector.endpoint(), 500_000);
    let client = server.client();
    create(&client, "half", "half-create", None).await;
    for i in 0..400 {
        let req = Request::get(format!("{PODSETS}/half")).header("Audit-ID", format!("half-{i}")).body(vec![]).unwrap();
        assert_eq!(raw(&client, req).await.0, 200);
    }
    // Batches go out every 5 s: everything is in once nothing new came for longer than that.
    let (mut seen, mut since) = (0, std::time::Instant::now());
    let spans = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let spans = collector.spans();
        if spans.len() != seen {
            (seen, since) = (spans.len(), std::time::Instant::now());
        } else if seen > 0 && since.elapsed() > Duration::from_secs(6) {
            break spans;
        }
    };
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.attribute("audit-id").is_some_and(|id| id.starts_with("half-") && id != "half-create"))
        .collect();
    // 200 expected (sd 10); sampled twice over (a ratio applied again by the SDK) it would be 100.
    assert!((150..=250).contains(&roots.len()), "{} of 400 sampled", roots.len());
    for root in roots {
        let below: Vec<&str> = descendants(&spans, root).iter().map(|s| s.name.as_str()).collect();
        assert_eq!(below, ["cacher.Get"], "a sampled trace is whole");
    }
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

/// Through kube-apiserver's aggregator (which passes `traceparent` on, as 1.31+ sends its own): the admin's
/// context is the parent of our request span, admission's spans are its children and the webhook is called with
/// the same trace; a user outside system:masters and system:monitoring gets a trace of its own, linked to theirs.
#[test]
fn through_the_aggregator_a_trusted_trace_goes_on_to_the_webhook_and_another_user_s_is_a_link() {
    common::cluster::in_namespace(
        "through_the_aggregator_a_trusted_trace_goes_on_to_the_webhook_and_another_user_s_is_a_link",
        || {
            use podset_envtest::{Cluster, Credential, ServerCommand};
            let collector = OtlpReceiver::start();
            let dir = tempfile::tempdir().unwrap();
            let flag = format!(
                "--tracing-config-file={}",
                tracing_config(dir.path(), &collector.endpoint(), 1_000_000).display()
            );
            let mut c = Cluster::start(ServerCommand {
                program: env!("CARGO_BIN_EXE_podset-apiserver").into(),
                args: vec![flag.into()],
            });
            common::cluster::runtime().block_on(async {
                let hook = webhook::WebhookServer::start(podset_envtest::NODE_IP.parse().unwrap()).await;
                let admin = c.client().await;
                let config: k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration =
                    serde_json::from_value(serde_json::json!({
                        "metadata": {"name": "traced"},
                        "webhooks": [{
                            "name": "traced.demo.k8s.io",
                            "clientConfig": {"url": hook.url("/allow"), "caBundle": base64_of(&hook.ca_pem)},
                            "rules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"], "resources": ["podsets"],
                                       "operations": ["CREATE"]}],
                            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
                        }],
                    }))
                    .unwrap();
                kube::Api::all(admin.clone()).create(&Default::default(), &config).await.unwrap();

                // Creates until the webhook sees one (our admission chain picks the configuration up by watch).
                let trace = "5bf92f3577b34da6a3ce929d0e0e4736";
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                let mut n = 0;
                while hook.received("/allow").is_empty() {
                    assert!(std::time::Instant::now() < deadline, "the webhook was never called");
                    n += 1;
                    let tp = format!("00-{trace}-{:016x}-01", n);
                    create(&admin, &format!("traced-{n}"), &format!("agg-{n}"), Some(&tp)).await;
                }
                let parent = format!("{n:016x}");
                let id = format!("agg-{n}");
                let spans = collector.wait_for(Duration::from_secs(20), |s| {
                    with_audit_id(s, &id)
                        .is_some_and(|r| descendants(s, r).iter().any(|c| c.name == "Call validating webhook"))
                });
                let request = with_audit_id(&spans, &id).unwrap_or_else(|| panic!("no span for {id}: {spans:#?}"));
                assert_eq!((request.trace_id.as_str(), request.parent_span_id.as_str()), (trace, parent.as_str()));
                eprintln!("{}", tree(&spans, request, 0));
                let below = descendants(&spans, request);
                let names: Vec<&str> = below.iter().map(|s| s.name.as_str()).collect();
                for want in ["Admit", "Validate", "Call validating webhook", "Create"] {
                    assert!(names.contains(&want), "{want} under the request: {names:?}");
                }
                let call = below.iter().find(|s| s.name == "Call validating webhook").unwrap();
                assert_eq!(call.attribute("webhook"), Some("traced.demo.k8s.io"));
                assert_eq!(call.attribute("operation"), Some("CREATE"));
                let sent =
                    hook.received("/allow").last().unwrap().traceparent.clone().expect("a traceparent to the webhook");
                assert!(sent.starts_with(&format!("00-{trace}-{}-", call.span_id)), "{sent} names the call's span");

                // Jane (not trusted) straight at our server: 403 from authorization, but traced, and linked.
                let jane = c.client_cert("ca", "jane", Some("dev"));
                let jane = c.podset_client(Credential::Cert(&jane));
                let theirs = "6bf92f3577b34da6a3ce929d0e0e4736";
                let req = Request::get(PODSETS)
                    .header("Audit-ID", "jane-1")
                    .header("traceparent", format!("00-{theirs}-00f067aa0ba902b7-01"))
                    .body(vec![])
                    .unwrap();
                assert_eq!(raw(&jane, req).await.0, 403);
                let (spans, span) = request_span(&collector, "jane-1");
                assert_ne!(span.trace_id, theirs, "not in her trace");
                assert_eq!(span.parent_span_id, "");
                assert_eq!(span.links, vec![(theirs.to_owned(), "00f067aa0ba902b7".to_owned())]);
                assert_eq!(span.attribute("http.response.status_code"), Some("403"));
                // Her SubjectAccessReview is a client span of her request's, carrying its context.
                assert_reviewed_in_trace(&spans, &span);

                // The controller's pass over a PodSet is a trace of its own, its calls to kube-apiserver in it.
                let spans = collector.wait_for(Duration::from_secs(20), |s| {
                    s.iter()
                        .any(|r| r.name == "reconcile" && descendants(s, r).iter().any(|c| c.name.starts_with("HTTP ")))
                });
                let reconciles: Vec<&Span> = spans.iter().filter(|s| s.name == "reconcile").collect();
                let calls = reconciles
                    .iter()
                    .flat_map(|r| descendants(&spans, r))
                    .filter(|c| c.name.starts_with("HTTP "))
                    .count();
                assert!(calls > 0, "no call under {} reconciles", reconciles.len());
                assert!(reconciles.iter().all(|r| r.parent_span_id.is_empty()));
            });

            // At rate 0 only a trusted caller's sampled context makes a trace: system:monitoring's does, and the
            // SubjectAccessReview its request needs is in it (kube's client calls it from its own task); the same
            // request again, untraced, makes nothing (its review is cached by then).
            std::fs::write(
                dir.path().join("tracing.yaml"),
                std::fs::read_to_string(dir.path().join("tracing.yaml")).unwrap().replace("1000000", "0"),
            )
            .unwrap();
            c.restart_podset_apiserver();
            collector.clear();
            common::cluster::runtime().block_on(async {
                let watcher = c.client_cert("ca", "watcher", Some("system:monitoring"));
                let watcher = c.podset_client(Credential::Cert(&watcher));
                let theirs = "7bf92f3577b34da6a3ce929d0e0e4736";
                for (id, tp) in
                    [("mon-traced", Some(format!("00-{theirs}-00f067aa0ba902b7-01"))), ("mon-untraced", None)]
                {
                    let mut req = Request::get(PODSETS).header("Audit-ID", id);
                    if let Some(tp) = tp {
                        req = req.header("traceparent", tp);
                    }
                    raw(&watcher, req.body(vec![]).unwrap()).await;
                }
                let (spans, span) = request_span(&collector, "mon-traced");
                assert_eq!((span.trace_id.as_str(), span.parent_span_id.as_str()), (theirs, "00f067aa0ba902b7"));
                assert_reviewed_in_trace(&spans, &span);
                assert!(with_audit_id(&spans, "mon-untraced").is_none(), "rate 0 and no context: no trace");
            });
        },
    );
}

fn base64_of(pem: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(pem)
}
