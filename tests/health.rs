//! Named health checks over HTTP; SIGTERM failing `/readyz` while the server still serves for
//! `--shutdown-delay-duration`; and a store on a disk that fills up: `/readyz` says it cannot write, and once space
//! is freed the same process writes again, with nothing acknowledged lost; an etcd that is not up yet when the
//! server starts is waited for.

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::Request;
use serde_json::json;

const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";

async fn get(client: &kube::Client, path: &str) -> (u16, String) {
    let (status, _, body) = raw(client, Request::get(path).body(vec![]).unwrap()).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn create(client: &kube::Client, name: &str, pad: &str) -> (u16, serde_json::Value) {
    let mut ps = podset(name, 0);
    ps["metadata"]["annotations"] = json!({ "pad": pad });
    let req = Request::post(PODSETS).header("content-type", "application/json");
    let (status, _, body) = raw(client, req.body(serde_json::to_vec(&ps).unwrap()).unwrap()).await;
    (status, json(&body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_checks_verbose_and_single() {
    let server = TestServer::start(&[]);
    let client = server.client();
    assert_eq!(
        get(&client, "/readyz?verbose").await,
        (
            200,
            "[+]ping ok\n[+]storage ok\n[+]informer-sync ok\n[+]delegation ok\n[+]shutdown ok\nreadyz check passed\n"
                .into()
        )
    );
    assert_eq!(get(&client, "/livez?verbose").await, (200, "[+]ping ok\n[+]storage ok\nlivez check passed\n".into()));
    assert_eq!(
        get(&client, "/healthz?verbose").await,
        (200, "[+]ping ok\n[+]storage ok\nhealthz check passed\n".into())
    );
    for check in ["/readyz/ping", "/readyz/storage", "/readyz/informer-sync", "/readyz/delegation", "/readyz/shutdown"]
    {
        assert_eq!(get(&client, check).await, (200, "ok".into()), "{check}");
    }
    assert_eq!(get(&client, "/livez/storage").await, (200, "ok".into()));
    assert_eq!(get(&client, "/livez/shutdown").await.0, 404, "shutdown is a readiness check only");
    assert_eq!(
        get(&client, "/readyz?verbose&exclude=shutdown&exclude=ping").await,
        (
            200,
            "[+]ping excluded: ok\n[+]storage ok\n[+]informer-sync ok\n[+]delegation ok\n[+]shutdown excluded: ok\n\
             readyz check passed\n"
                .into()
        )
    );
    let (status, body) = get(&client, "/readyz/nope").await;
    assert_eq!((status, json(&body.into())["kind"].as_str()), (404, Some("Status")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_fails_readyz_at_once_and_serves_through_the_shutdown_delay() {
    let mut server = TestServer::start(&["--shutdown-delay-duration=10s"]);
    let client = server.client();
    assert_eq!(get(&client, "/readyz/shutdown").await, (200, "ok".into()));
    let mut child = server.child.take().expect("running");
    let term = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(term.success());

    // The signal is handled asynchronously: wait for /readyz to turn, then check everything else still works.
    let deadline = Instant::now() + Duration::from_secs(8);
    let body = loop {
        let (status, body) = get(&client, "/readyz").await;
        if status == 500 {
            break body;
        }
        assert!(Instant::now() < deadline, "/readyz still {status} after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(body.contains("[-]shutdown failed: reason withheld\n"), "{body}");
    assert!(body.contains("[+]storage ok\n"), "only the shutdown check fails: {body}");
    assert_eq!(
        get(&client, "/readyz/shutdown").await,
        (500, "internal server error: process is shutting down\n".into())
    );
    assert_eq!(get(&client, "/livez").await, (200, "ok".into()), "alive: only readiness reflects the shutdown");
    assert_eq!(create(&client, "during-the-delay", "").await.0, 201, "requests are still served during the delay");
    assert_eq!(get(&client, &format!("{PODSETS}/during-the-delay")).await.0, 200);

    drop(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not stop after the shutdown delay");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "clean exit: {status:?}\n{}", server.logs());
    assert!(server.log_contains("signal received"), "{}", server.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_fails_readyz_and_recovers_in_place() {
    let disk = Tmpfs::mount("16m");
    let server = TestServer::start_in(disk.path.clone(), None, vec!["--insecure-allow-all".into()]);
    let client = server.client();
    let pad = "x".repeat(32 * 1024);
    let mut acked = Vec::new();
    for i in 0..5 {
        let (status, _) = create(&client, &format!("before-{i}"), &pad).await;
        assert_eq!(status, 201);
        acked.push(format!("before-{i}"));
    }
    let filler = disk.fill();

    let mut refused = None;
    for i in 0..500 {
        let name = format!("full-{i}");
        match create(&client, &name, &pad).await {
            (201, _) => acked.push(name),
            (status, body) => {
                refused = Some((status, body));
                break;
            }
        }
    }
    let (status, body) = refused.expect("the disk never filled");
    assert_eq!((status, body["kind"].as_str(), body["code"].as_u64()), (500, Some("Status"), Some(500)), "{body}");
    assert!(body["message"].as_str().unwrap().contains("no space left"), "{body}");

    let (status, body) = get(&client, "/readyz?verbose").await;
    assert_eq!(
        (status, body.as_str()),
        (
            500,
            "[+]ping ok\n[-]storage failed: reason withheld\n[+]informer-sync ok\n[+]delegation ok\n[+]shutdown ok\n\
             readyz check failed\n"
        )
    );
    let (status, body) = get(&client, "/readyz/storage").await;
    assert!(status == 500 && body.starts_with("internal server error: "), "{status} {body}");
    assert_eq!(get(&client, "/livez").await, (200, "ok".into()), "recoverable in place: no restart wanted");
    assert_eq!(get(&client, "/readyz").await.0, 500);

    std::fs::remove_file(filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&client, "/readyz/storage").await.0 != 200 {
        assert!(Instant::now() < deadline, "the store did not recover after space was freed\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get(&client, "/readyz").await, (200, "ok".into()));
    let (status, _) = create(&client, "after", "").await;
    assert_eq!(status, 201, "writes succeed again without a restart");
    acked.push("after".into());

    let (_, body) = get(&client, PODSETS).await;
    let list = json(&body.into());
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
    for name in &acked {
        assert!(names.contains(&name.as_str()), "acknowledged {name} is served");
    }
    drop(server);
}

/// etcd unreachable when the server starts (starting too, electing a leader, cut off): the server waits for it and
/// then serves, as kube-apiserver does, rather than exit. The fault harness found a replica restarted during an
/// etcd election that had exited this way and stayed down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_before_its_etcd_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = podset_envtest::etcd::Etcd::start(&dir.path().join("etcd"));
    etcd.stop();
    let args =
        vec!["--insecure-allow-all".into(), "--storage-backend=etcd".into(), format!("--etcd-servers={}", etcd.url())];
    let data_dir = dir.path().join("replica");
    let starting = std::thread::spawn(move || TestServer::start_in(data_dir, None, args));
    std::thread::sleep(Duration::from_secs(3));
    assert!(!starting.is_finished(), "the server neither waited for etcd nor could have served");
    etcd.resume();
    let server = starting.join().expect("the server started once etcd was back");
    let logs = server.logs();
    assert!(logs.contains("trying again") && logs.contains("storage unavailable"), "{logs}");
    let (status, body) = create(&server.client(), "after", "").await;
    assert_eq!(status, 201, "{body}");
}
