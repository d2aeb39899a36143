//! `--audit-log-path`: an `audit.k8s.io/v1` Event line at the Metadata level for every request, with who, what, on
//! which object, the answer and when; a watch at its start and its end.

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::Request;
use serde_json::Value;

/// The audit log's events, once there are at least `n` (lines are written by their own thread).
fn events(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let events: Vec<Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("one JSON event per line")).collect();
        if events.len() >= n || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_audited_at_the_metadata_level() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit/audit.log");
    let server = TestServer::start(&[&format!("--audit-log-path={}", log.display())]);
    let client = server.client();

    let create = Request::post(PODSETS).header("content-type", "application/json").header("user-agent", "audit-test/1");
    assert_eq!(raw(&client, create.body(serde_json::to_vec(&podset("web", 0)).unwrap()).unwrap()).await.0, 201);
    assert_eq!(raw(&client, Request::get(format!("{PODSETS}/missing")).body(vec![]).unwrap()).await.0, 404);
    let watch = Request::get(format!("{PODSETS}?watch=1&timeoutSeconds=1")).body(vec![]).unwrap();
    assert_eq!(raw(&client, watch).await.0, 200);
    assert_eq!(raw(&client, Request::get("/readyz").body(vec![]).unwrap()).await.0, 200);

    let all = events(&log, 5);
    let of = |verb: &str, stage: &str| -> Vec<&Value> {
        all.iter().filter(|e| e["verb"] == verb && e["stage"] == stage).collect()
    };
    for e in &all {
        assert_eq!((e["apiVersion"].as_str(), e["kind"].as_str()), (Some("audit.k8s.io/v1"), Some("Event")), "{e}");
        assert_eq!(e["level"], "Metadata", "{e}");
        assert_eq!(e["user"]["username"], "system:admin", "{e}");
        assert_eq!(e["sourceIPs"][0], "127.0.0.1", "{e}");
        let received = chrono::DateTime::parse_from_rfc3339(e["requestReceivedTimestamp"].as_str().unwrap()).unwrap();
        let stage = chrono::DateTime::parse_from_rfc3339(e["stageTimestamp"].as_str().unwrap()).unwrap();
        assert!(received <= stage, "{e}");
    }

    let created = of("create", "ResponseComplete");
    assert_eq!(created.len(), 1, "{all:#?}");
    let c = created[0];
    assert_eq!(c["requestURI"], PODSETS);
    assert_eq!(c["userAgent"], "audit-test/1");
    assert_eq!(
        c["objectRef"],
        serde_json::json!({"resource": "podsets", "namespace": "default", "apiGroup": "demo.k8s.io", "apiVersion": "v1alpha1"})
    );
    assert_eq!(c["responseStatus"], serde_json::json!({"metadata": {}, "code": 201}));
    assert!(c["user"]["groups"].as_array().unwrap().contains(&"system:masters".into()));

    let missing =
        of("get", "ResponseComplete").into_iter().find(|e| e["objectRef"]["name"] == "missing").expect("the 404");
    assert_eq!(missing["responseStatus"]["code"], 404);
    assert_eq!(missing["responseStatus"]["reason"], "NotFound");
    assert_eq!(missing["responseStatus"]["status"], "Failure");

    let (started, ended) = (of("watch", "ResponseStarted"), of("watch", "ResponseComplete"));
    assert_eq!((started.len(), ended.len()), (1, 1), "{all:#?}");
    assert_eq!(started[0]["auditID"], ended[0]["auditID"], "one request, two stages");
    assert!(
        started[0]["stageTimestamp"].as_str().unwrap() <= ended[0]["stageTimestamp"].as_str().unwrap(),
        "the watch ends after it starts"
    );

    let health = of("get", "ResponseComplete").into_iter().find(|e| e["requestURI"] == "/readyz").expect("/readyz");
    assert!(health.get("objectRef").is_none(), "a non-resource request: {health}");

    let ids: std::collections::HashSet<&str> =
        all.iter().filter(|e| e["stage"] == "ResponseComplete").map(|e| e["auditID"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), all.iter().filter(|e| e["stage"] == "ResponseComplete").count(), "unique audit IDs");

    // Counted in /metrics too.
    let (_, _, body) = raw(&client, Request::get("/metrics").body(vec![]).unwrap()).await;
    let text = String::from_utf8_lossy(&body);
    let written: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("apiserver_audit_event_total "))
        .expect("apiserver_audit_event_total")
        .parse()
        .unwrap();
    assert!(written >= 5.0, "{written}");
}
