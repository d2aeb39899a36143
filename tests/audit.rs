//! Auditing as k8s.io/apiserver audits: nothing without `--audit-policy-file`; with one, each request at the level
//! and stages its first matching rule gives, its objects from the `Request` level, its answer at
//! `RequestResponse`, authorization's decision as annotations, one audit ID per request (kube-apiserver's
//! `Audit-ID` when it sends one), echoed in every answer's `Audit-Id` header.

mod common;
#[path = "common/webhook.rs"]
mod webhook;

use common::*;
use http::Request;
use serde_json::{json, Value};

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  nonResourceURLs: ["/readyz", "/healthz*"]
- level: Request
  resources: [{group: demo.k8s.io, resources: ["podsets/status"]}]
  omitStages: [RequestReceived]
- level: RequestResponse
  verbs: [create, get, delete]
  resources: [{group: demo.k8s.io, resources: [podsets]}]
- level: Metadata
"#;

const ID: &str = "6b1d1a0e-9a51-4b0c-8a8e-0d6c3b0f4e21";

fn of<'a>(all: &'a [Value], id: &str) -> Vec<&'a Value> {
    all.iter().filter(|e| e["auditID"] == id).collect()
}

fn stages(events: &[&Value]) -> Vec<String> {
    events.iter().map(|e| e["stage"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_policy_nothing_is_audited_and_every_answer_names_its_audit_id() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let server = TestServer::start(&[&format!("--audit-log-path={}", log.display())]);
    let client = server.client();
    let sent = Request::get(PODSETS).header("Audit-ID", ID).body(vec![]).unwrap();
    let (code, headers, _) = raw(&client, sent).await;
    assert_eq!((code, headers["audit-id"].to_str().unwrap()), (200, ID), "the proxy's ID echoed");
    let (_, a, _) = raw(&client, Request::get("/version").body(vec![]).unwrap()).await;
    let (_, b, _) = raw(&client, Request::get(format!("{PODSETS}/missing")).body(vec![]).unwrap()).await;
    assert_ne!(a["audit-id"], b["audit-id"], "a new one for each request");
    assert!(uuid_like(a["audit-id"].to_str().unwrap()));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "", "k8s.io/apiserver logs nothing without a policy");
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_audited_at_its_rules_level_and_stages() {
    let dir = tempfile::tempdir().unwrap();
    let (flags, log) = audit_flags(dir.path(), POLICY);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = TestServer::start(&args);
    let client = server.client();
    let send = |req: http::request::Builder, id: &str, body: Vec<u8>| {
        let client = client.clone();
        let req = req.header("Audit-ID", id).header("user-agent", "audit-test/1").body(body).unwrap();
        async move { raw(&client, req).await }
    };
    let json_body = |v: &Value| serde_json::to_vec(v).unwrap();

    let created = send(
        Request::post(PODSETS).header("content-type", "application/json"),
        "create-1",
        json_body(&podset("web", 0)),
    )
    .await;
    assert_eq!(created.0, 201);
    assert_eq!(created.1["audit-id"], "create-1");
    assert_eq!(send(Request::get(format!("{PODSETS}/missing")), "get-404", vec![]).await.0, 404);
    let patch = json!({"status": {"replicas": 0}});
    let patched = send(
        Request::patch(format!("{PODSETS}/web/status")).header("content-type", "application/merge-patch+json"),
        "patch-status",
        json_body(&patch),
    )
    .await;
    assert_eq!(patched.0, 200);
    assert_eq!(send(Request::get(format!("{PODSETS}?watch=1&timeoutSeconds=1")), "watch", vec![]).await.0, 200);
    assert_eq!(send(Request::get(PODSETS), "list", vec![]).await.0, 200);
    assert_eq!(send(Request::get("/readyz"), "readyz", vec![]).await.0, 200);
    let deleted = send(Request::delete(format!("{PODSETS}/web")), "delete", vec![]).await;
    assert_eq!(deleted.0, 200);
    let answer = json(&deleted.2);
    assert_eq!((answer["status"].as_str(), answer.get("code")), (Some("Success"), None), "as kube's store: {answer}");
    assert_eq!(send(Request::get(format!("{PODSETS}?timeout=soon")), "bad-timeout", vec![]).await.0, 400);

    let all = audit_events(&log, |all| of(all, "delete").len() == 2 && of(all, "watch").len() == 3);
    // Refused before authentication, as kube's WithRequestDeadline refuses it: one event, no user.
    let bad_timeout = of(&all, "bad-timeout");
    assert_eq!(stages(&bad_timeout), ["ResponseStarted"]);
    assert_eq!((&bad_timeout[0]["user"], &bad_timeout[0]["responseStatus"]["code"]), (&json!({}), &json!(400)));
    for e in all.iter().filter(|e| e["auditID"] != "bad-timeout") {
        assert_eq!((e["apiVersion"].as_str(), e["kind"].as_str()), (Some("audit.k8s.io/v1"), Some("Event")), "{e}");
        assert_eq!(e["user"]["username"], "system:admin", "{e}");
        assert_eq!(e["userAgent"], "audit-test/1", "{e}");
        assert_eq!(e["sourceIPs"][0], "127.0.0.1", "{e}");
        assert!(e["requestReceivedTimestamp"].as_str() <= e["stageTimestamp"].as_str(), "{e}");
    }

    // RequestResponse: the object sent (its name completes objectRef) and the one answered.
    let create = of(&all, "create-1");
    assert_eq!(stages(&create), ["RequestReceived", "ResponseComplete"], "{create:#?}");
    let done = create[1];
    assert_eq!(done["level"], "RequestResponse");
    assert_eq!(done["objectRef"]["name"], "web", "from the request's object, as kube's LogRequestObject");
    assert_eq!(done["requestObject"]["metadata"]["name"], "web");
    assert_eq!(done["requestObject"]["apiVersion"], "demo.k8s.io/v1alpha1");
    assert_eq!(done["responseObject"]["metadata"]["uid"], json(&created.2)["metadata"]["uid"]);
    assert_eq!(done["responseStatus"], json!({"metadata": {}, "code": 201}));
    assert_eq!(done["annotations"]["authorization.k8s.io/decision"], "allow");
    assert_eq!(done["annotations"]["authorization.k8s.io/reason"], "");
    assert!(create[0].get("responseStatus").is_none() && create[0].get("responseObject").is_none());
    assert_eq!(create[0]["stageTimestamp"], create[0]["requestReceivedTimestamp"]);

    // A Status answer: its bounded fields, and at RequestResponse the Status itself.
    let missing = of(&all, "get-404");
    let status = &missing[1]["responseStatus"];
    assert_eq!(
        (status["code"].as_u64(), status["status"].as_str(), status["reason"].as_str()),
        (Some(404), Some("Failure"), Some("NotFound"))
    );
    assert_eq!(status["details"]["name"], "missing");
    assert_eq!(missing[1]["responseObject"]["kind"], "Status");

    // Request: the patch as sent, no answer; RequestReceived left out by the rule.
    let status_patch = of(&all, "patch-status");
    assert_eq!(stages(&status_patch), ["ResponseComplete"]);
    assert_eq!((status_patch[0]["level"].as_str(), &status_patch[0]["requestObject"]), (Some("Request"), &patch));
    assert!(status_patch[0].get("responseObject").is_none());

    // Metadata: a watch's three stages, a list with no objects.
    let watch = of(&all, "watch");
    assert_eq!(stages(&watch), ["RequestReceived", "ResponseStarted", "ResponseComplete"]);
    assert_eq!(watch[1]["responseStatus"], json!({"metadata": {}, "code": 200}));
    let list = of(&all, "list");
    assert_eq!(list[1]["level"], "Metadata");
    assert!(list[1].get("requestObject").is_none() && list[1].get("responseObject").is_none());

    assert!(of(&all, "readyz").is_empty(), "level None");
    let delete = of(&all, "delete");
    assert_eq!(delete[1]["responseStatus"]["status"], "Success");
    assert_eq!(delete[1]["responseStatus"]["details"]["name"], "web");

    // Counted as kube counts: events written, and every request's level.
    let (_, _, body) = raw(&client, Request::get("/metrics").body(vec![]).unwrap()).await;
    let text = String::from_utf8_lossy(&body);
    assert!(metric(&text, "apiserver_audit_event_total ") >= all.len() as f64);
    assert!(metric(&text, "apiserver_audit_level_total{level=\"None\"} ") >= 1.0);
    assert!(metric(&text, "apiserver_audit_level_total{level=\"RequestResponse\"} ") >= 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_format_writes_kubes_line_of_text() {
    let dir = tempfile::tempdir().unwrap();
    let (mut flags, log) = audit_flags(dir.path(), common::AUDIT_METADATA);
    flags.push("--audit-log-format=legacy".into());
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = TestServer::start(&args);
    let req = Request::get(PODSETS).header("Audit-ID", ID).body(vec![]).unwrap();
    assert_eq!(raw(&server.client(), req).await.0, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 2 || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let done = text.lines().find(|l| l.contains("stage=\"ResponseComplete\"")).unwrap_or_else(|| panic!("{text}"));
    let expected = format!(
        "AUDIT: id=\"{ID}\" stage=\"ResponseComplete\" ip=\"127.0.0.1\" method=\"list\" user=\"system:admin\" groups=\"\\\"system:masters\\\",\\\"system:authenticated\\\"\" as=\"<self>\" asgroups=\"<lookup>\""
    );
    assert!(done.contains(&expected), "{done}");
    assert!(done.ends_with(&format!("namespace=\"default\" uri=\"{PODSETS}\" response=\"200\"")), "{done}");
}

#[test]
fn a_bad_policy_stops_the_start_with_its_file_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (flags, _) = audit_flags(
        dir.path(),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n- level: Metadata\n  namespaces: [a]\n  nonResourceURLs: [/x]\n",
    );
    let out = std::process::Command::new(BIN)
        .args(["--insecure-allow-all", "--secure-port=0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(&flags)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let policy = dir.path().join("audit-policy.yaml");
    assert!(err.contains(&format!("{} line 5: rules[1].nonResourceURLs", policy.display())), "{err}");
    assert!(err.contains("rules cannot apply to both regular resources and non-resource URLs"), "{err}");
}

/// A recorded object's kind, the compared types' own kinds named alike.
fn own_kind(kind: &Value) -> Value {
    match kind.as_str() {
        Some("ConfigMap" | "PodSet") => "<object>".into(),
        Some("ConfigMapList" | "PodSetList") => "<list>".into(),
        _ => kind.clone(),
    }
}

/// The same policy and the same requests for ConfigMaps on kube-apiserver 1.20 and for PodSets through it on us:
/// the events agree field by field but for the differences named here.
#[test]
fn kube_apiserver_and_we_audit_the_same_requests_alike() {
    use common::cluster::{in_namespace, runtime};
    in_namespace("kube_apiserver_and_we_audit_the_same_requests_alike", || {
        let mut c = common::cluster::start();
        c.kubectl(&["create", "namespace", "audited"]);
        let resources = r#"[{group: "", resources: [configmaps]}, {group: demo.k8s.io, resources: [podsets]}]"#;
        let policy = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n\
             - level: RequestResponse\n  users: [admin]\n  verbs: [create, get, delete]\n  resources: {resources}\n\
             - level: Request\n  users: [admin]\n  verbs: [update, patch]\n  resources: {resources}\n\
             - level: Metadata\n  users: [admin]\n  resources: {resources}\n"
        );
        let (flags, ours) = audit_flags(c.dir.path(), &policy);
        c.restart_podset_apiserver_with(&flags);
        let kube_log = c.dir.path().join("kube-audit.log");
        c.restart_apiserver_with(&[
            format!("--audit-policy-file={}", c.dir.path().join("audit-policy.yaml").display()),
            format!("--audit-log-path={}", kube_log.display()),
        ]);
        runtime().block_on(async {
            let client = c.client().await;
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}, "data": {"a": "1"}});
            let mut ps = podset("web", 0);
            ps["metadata"]["namespace"] = "audited".into();
            let types = [
                ("cm", "/api/v1/namespaces/audited/configmaps".to_owned(), cm),
                ("ps", "/apis/demo.k8s.io/v1alpha1/namespaces/audited/podsets".to_owned(), ps),
            ];
            for (t, path, body) in &types {
                let send = |req: http::request::Builder, op: &str, body: Vec<u8>| {
                    let req = req.header("Audit-ID", format!("{t}-{op}")).body(body).unwrap();
                    let client = client.clone();
                    async move { raw(&client, req).await }
                };
                let one = format!("{path}/web");
                let created = send(
                    Request::post(path).header("content-type", "application/json"),
                    "create",
                    serde_json::to_vec(body).unwrap(),
                )
                .await;
                assert_eq!(created.0, 201, "{t}: {}", String::from_utf8_lossy(&created.2));
                assert_eq!(created.1["audit-id"], format!("{t}-create"), "{t}: the client's ID answered");
                assert_eq!(send(Request::get(&one), "get", vec![]).await.0, 200);
                assert_eq!(send(Request::get(format!("{path}/missing")), "get-missing", vec![]).await.0, 404);
                assert_eq!(send(Request::get(path), "list", vec![]).await.0, 200);
                let table = Request::get(&one).header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io");
                assert_eq!(send(table, "table", vec![]).await.0, 200);
                let merge = Request::patch(&one).header("content-type", "application/merge-patch+json");
                assert_eq!(send(merge, "patch", br#"{"metadata":{"labels":{"a":"b"}}}"#.to_vec()).await.0, 200);
                let mut current = json(&send(Request::get(&one), "read", vec![]).await.2);
                current["metadata"]["labels"]["a"] = "c".into();
                let put = Request::put(&one).header("content-type", "application/json");
                assert_eq!(send(put, "update", serde_json::to_vec(&current).unwrap()).await.0, 200);
                assert_eq!(
                    send(Request::get(format!("{path}?watch=1&timeoutSeconds=1")), "watch", vec![]).await.0,
                    200
                );
                assert_eq!(send(Request::delete(&one), "delete", vec![]).await.0, 200);
            }
        });
        let ops = ["create", "get", "get-missing", "list", "table", "patch", "update", "watch", "delete"];
        let complete = |all: &[Value], t: &str| {
            ops.iter().all(|op| of(all, &format!("{t}-{op}")).iter().any(|e| e["stage"] == "ResponseComplete"))
        };
        let kube = audit_events(&kube_log, |all| complete(all, "cm") && complete(all, "ps"));
        let ours = audit_events(&ours, |all| complete(all, "ps"));
        for op in ops {
            let (k, o) = (of(&kube, &format!("cm-{op}")), of(&ours, &format!("ps-{op}")));
            assert_eq!(stages(&k), stages(&o), "{op}: stages\nkube: {k:#?}\nours: {o:#?}");
            assert_eq!(stages(&o).last().map(String::as_str), Some("ResponseComplete"), "{op}: {o:#?}");
            for (k, o) in k.iter().zip(&o) {
                let same = |f: &dyn Fn(&Value) -> Value, what: &str| {
                    assert_eq!(f(k), f(o), "{op} {}: {what}\nkube: {k:#}\nours: {o:#}", k["stage"]);
                };
                same(&|e| e["level"].clone(), "level");
                same(&|e| e["verb"].clone(), "verb");
                same(&|e| e["user"]["username"].clone(), "user");
                same(&|e| e["objectRef"]["namespace"].clone(), "objectRef.namespace");
                same(&|e| e["objectRef"]["name"].clone(), "objectRef.name");
                same(&|e| e["objectRef"]["resourceVersion"].is_null().into(), "objectRef.resourceVersion present");
                same(&|e| e["objectRef"]["uid"].is_null().into(), "objectRef.uid present");
                same(&|e| e["requestObject"].is_null().into(), "requestObject present");
                same(&|e| e["responseObject"].is_null().into(), "responseObject present");
                same(&|e| own_kind(&e["responseObject"]["kind"]), "responseObject's kind");
                same(&|e| e["responseStatus"]["code"].clone(), "responseStatus.code");
                if op == "watch" && k["stage"] != "RequestReceived" {
                    // Named: kube-apiserver 1.20 starts a watch's answer at its first event, so an idle watch's
                    // ResponseStarted is faked at its end ("Connection closed early"); later releases start it at
                    // once (handlers/watch.go, BeginStream), as we do, with the code alone.
                    assert_eq!(k["responseStatus"]["message"], "Connection closed early", "{k:#}");
                    assert_eq!(o["responseStatus"], json!({"metadata": {}, "code": 200}), "{o:#}");
                    continue;
                }
                same(&|e| e["responseStatus"]["status"].clone(), "responseStatus.status");
                if op == "get-missing" && k["stage"] == "ResponseComplete" {
                    // Named: 1.20 copies a Status' status, reason and code; 1.24 and later (kubernetes#105415) its
                    // message and details too, as we do.
                    assert!(k["responseStatus"].get("message").is_none(), "{k:#}");
                    assert_eq!(o["responseStatus"]["details"]["name"], "missing", "{o:#}");
                    assert!(o["responseStatus"]["message"].as_str().is_some_and(|m| m.contains("not found")), "{o:#}");
                }
                same(&|e| e["responseStatus"]["reason"].clone(), "responseStatus.reason");
                same(&|e| e["annotations"]["authorization.k8s.io/decision"].clone(), "the authorization decision");
                same(
                    &|e| e["annotations"].as_object().map(|a| a.keys().cloned().collect::<Vec<_>>()).into(),
                    "annotation keys",
                );
            }
        }
        // Through the aggregator: kube-apiserver's own event of each PodSet request carries our audit ID.
        for op in ops {
            assert!(!of(&kube, &format!("ps-{op}")).is_empty(), "kube-apiserver's event of ps-{op}");
        }
    });
}

/// A server auditing every request at Metadata to the webhook at `server` (trusting `ca_pem`), named by a
/// kubeconfig as kube-apiserver's is, with `flags` added.
fn audited_by_webhook(dir: &std::path::Path, server: &str, ca_pem: &str, flags: &[&str]) -> TestServer {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: audit\n  user: {{}}\ncontexts:\n- name: audit\n  context: {{cluster: audit, user: audit}}\ncurrent-context: audit\n"
    );
    let (kubeconfig, policy) = (dir.join("audit-webhook.kubeconfig"), dir.join("policy.yaml"));
    std::fs::write(&kubeconfig, text).unwrap();
    std::fs::write(&policy, common::AUDIT_METADATA).unwrap();
    let (policy_flag, hook_flag) = (
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-webhook-config-file={}", kubeconfig.display()),
    );
    let mut all = vec![policy_flag.as_str(), hook_flag.as_str()];
    all.extend_from_slice(flags);
    TestServer::start(&all)
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)).map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_webhook_as_event_lists_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = webhook::WebhookServer::start("127.0.0.1".parse().unwrap()).await;
    let server = audited_by_webhook(
        dir.path(),
        &receiver.url("/audit"),
        &receiver.ca_pem,
        &["--audit-webhook-batch-max-wait=100ms"],
    );
    let client = server.client();
    for i in 0..3 {
        let req = Request::get(PODSETS).header("Audit-ID", format!("hook-{i}")).body(vec![]).unwrap();
        assert_eq!(raw(&client, req).await.0, 200);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let items = loop {
        let lists = receiver.received_all("/audit");
        let items: Vec<Value> =
            lists.iter().flat_map(|r| r.review["items"].as_array().cloned().unwrap_or_default()).collect();
        let ours = items.iter().filter(|e| e["auditID"].as_str().is_some_and(|id| id.starts_with("hook-"))).count();
        if ours >= 6 || std::time::Instant::now() > deadline {
            for r in &lists {
                assert_eq!(
                    (r.review["kind"].as_str(), r.review["apiVersion"].as_str()),
                    (Some("EventList"), Some("audit.k8s.io/v1"))
                );
            }
            break items;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for i in 0..3 {
        let stages: Vec<&str> =
            items.iter().filter(|e| e["auditID"] == format!("hook-{i}")).filter_map(|e| e["stage"].as_str()).collect();
        assert_eq!(stages, ["RequestReceived", "ResponseComplete"], "hook-{i}: {items:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_is_down_never_fails_requests_and_what_it_loses_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (ca_pem, _, _) = webhook::certificates("127.0.0.1".parse().unwrap(), "nobody");
    let flags = [
        "--audit-webhook-initial-backoff=20ms",
        "--audit-webhook-batch-buffer-size=20",
        "--audit-webhook-batch-max-size=10",
        "--audit-webhook-batch-max-wait=20ms",
    ];
    let server = audited_by_webhook(dir.path(), &format!("https://{closed}/audit"), &ca_pem, &flags);
    let client = server.client();
    for _ in 0..100 {
        assert_eq!(raw(&client, Request::get(PODSETS).body(vec![]).unwrap()).await.0, 200);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, _, body) = raw(&client, Request::get("/metrics").body(vec![]).unwrap()).await;
        let text = String::from_utf8_lossy(&body).into_owned();
        let failed = metric(&text, "apiserver_audit_error_total{plugin=\"webhook\"} ");
        let dropped = metric(&text, "apiserver_audit_error_total{plugin=\"buffered\"} ");
        let written = metric(&text, "apiserver_audit_event_total ");
        // Every event was either given up after its retries, or dropped from a full queue, or is still queued or
        // being retried; some have been given up by now.
        if failed >= 10.0 && failed + dropped <= written {
            assert!(server.log_contains("audit plugin error"), "the failures are logged");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "failed {failed}, dropped {dropped}, written {written}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The policy docs/security.md shows, as written there.
fn security_guide_policy() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let audit = &doc[doc.find("## Audit").expect("the Audit section")..];
    let block = &audit[audit.find("```yaml\n").expect("its policy") + 8..];
    block[..block.find("```").unwrap()].to_owned()
}

/// docs/security.md's policy on the local cluster, with kubectl: a template change recorded with its request and
/// answer, a status update and the health checks left out, a read at Metadata.
#[test]
fn the_security_guides_policy_does_what_it_says() {
    use common::cluster::in_namespace;
    in_namespace("the_security_guides_policy_does_what_it_says", || {
        let mut c = common::cluster::start();
        let (flags, log) = audit_flags(c.dir.path(), &security_guide_policy());
        c.restart_podset_apiserver_with(&flags);
        let manifest = c.dir.path().join("web.json");
        std::fs::write(&manifest, serde_json::to_vec(&podset("web", 0)).unwrap()).unwrap();
        c.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
        c.kubectl(&[
            "patch",
            "podset",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"metadata":{"labels":{"tier":"web"}}}}}"#,
        ]);
        c.kubectl(&[
            "patch",
            "podset",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":0}}"#,
        ]);
        c.kubectl(&["get", "podset", "web"]);
        c.kubectl(&["get", "--raw", "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets/web/status"]);
        let all = audit_events(&log, |all| all.iter().any(|e| e["verb"] == "get" && e["objectRef"]["name"] == "web"));
        let podsets: Vec<&Value> = all.iter().filter(|e| e["objectRef"]["resource"] == "podsets").collect();
        assert!(all.iter().all(|e| e["stage"] != "RequestReceived"), "omitStages: {all:#?}");
        assert!(podsets.iter().all(|e| e["objectRef"].get("subresource").is_none()), "status left out: {podsets:#?}");
        assert!(
            all.iter().all(|e| !e["requestURI"].as_str().unwrap().starts_with("/readyz")),
            "health checks left out"
        );
        let template =
            podsets.iter().find(|e| e["verb"] == "patch").unwrap_or_else(|| panic!("the template patch: {podsets:#?}"));
        assert_eq!(template["level"], "RequestResponse");
        assert_eq!(template["requestObject"]["spec"]["template"]["metadata"]["labels"]["tier"], "web");
        assert_eq!(template["responseObject"]["spec"]["template"]["metadata"]["labels"]["tier"], "web");
        assert!(template["responseObject"]["metadata"].get("managedFields").is_none(), "omitManagedFields");
        assert_eq!(template["user"]["username"], "admin");
        let create = podsets.iter().find(|e| e["verb"] == "create").expect("kubectl apply's create");
        assert_eq!(create["requestObject"]["metadata"]["name"], "web");
        let read = podsets.iter().find(|e| e["verb"] == "get").unwrap();
        assert_eq!(read["level"], "Metadata");
        assert!(read.get("responseObject").is_none());
    });
}
