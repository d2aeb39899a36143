//! Reads at a resourceVersion and watch timeouts, compared with kube-apiserver itself: the same requests go to
//! ConfigMaps (kube-apiserver 1.20's watch cache over etcd) and to PodSets (ours, through the aggregator, in each
//! version), and the answers must agree in code and reason.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{in_namespace, runtime};
use futures::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};

struct Kind {
    collection: &'static str,
    body: fn(&str) -> Value,
    /// The names of the objects the reads make (both PodSet versions share one collection).
    probe: &'static str,
}

const CONFIGMAPS: Kind = Kind {
    collection: "/api/v1/namespaces/default/configmaps",
    body: |name| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}),
    probe: "rv-probe",
};
const PODSETS: Kind = Kind { collection: common::PODSETS, body: |name| common::podset(name, 0), probe: "rv-probe" };
const PODSETS_BETA: Kind = Kind {
    collection: "/apis/demo.k8s.io/v1beta1/namespaces/default/podsets",
    body: |name| {
        let mut ps = common::podset(name, 0);
        ps["apiVersion"] = json!("demo.k8s.io/v1beta1");
        ps["spec"]["selector"] = json!({"matchLabels": {"app": name}});
        ps
    },
    probe: "beta-probe",
};

/// What an answer is, without what differs between kinds and stores: the code, and for a Status its reason and
/// causes (numbers left out), else "object" or "list".
fn outcome(code: u16, body: &Value) -> Outcome {
    let what = match body["kind"].as_str() {
        Some("Status") => {
            let causes = body["details"]["causes"].to_string();
            let causes: String = causes.chars().filter(|c| !c.is_ascii_digit()).collect();
            format!("{} {causes}", body["reason"].as_str().unwrap_or(""))
        }
        Some(k) if k.ends_with("List") => "list".to_owned(),
        Some(_) => "object".to_owned(),
        None => format!("not an object: {body}"),
    };
    (code, what)
}

type Outcome = (u16, String);

/// Where we answer otherwise, on purpose: kube-apiserver 1.20 answers a resourceVersion that is not a number with
/// a 500 (an internal error, for the client's mistake); we answer 400 BadRequest.
const NOT_A_NUMBER: [&str; 4] = [
    "{one}?resourceVersion=abc",
    "{all}?resourceVersion=abc",
    "{one}?resourceVersion=-1",
    "{all}?watch=1&resourceVersion=abc",
];

async fn send(client: &kube::Client, method: &str, uri: &str, body: Option<&Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = Request::builder().method(method).uri(uri).header("content-type", "application/json").body(bytes);
    let (code, _, bytes) = common::raw(client, req.unwrap()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The reads, each with its outcome.
async fn reads(client: &kube::Client, k: &Kind) -> Vec<(&'static str, Outcome)> {
    let name = k.probe;
    let (code, made) = send(client, "POST", k.collection, Some(&(k.body)(name))).await;
    assert_eq!(code, 201, "{made}");
    let rv: u64 = made["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    let (code, _) = send(client, "POST", k.collection, Some(&(k.body)(&format!("{name}-2")))).await;
    assert_eq!(code, 201);
    let (_, page) = send(client, "GET", &format!("{}?limit=1", k.collection), None).await;
    let token = page["metadata"]["continue"].as_str().expect("a continue token").to_owned();
    let (one, all) = (format!("{}/{name}", k.collection), k.collection.to_owned());
    let future = rv + 1_000_000;
    let asks = [
        NOT_A_NUMBER[0],
        NOT_A_NUMBER[1],
        NOT_A_NUMBER[2],
        NOT_A_NUMBER[3],
        "{one}?resourceVersion=0",
        "{all}?resourceVersion=0",
        "{one}?resourceVersion={rv}",
        "{all}?resourceVersion={rv}&resourceVersionMatch=NotOlderThan",
        "{all}?resourceVersion={rv}&resourceVersionMatch=Exact",
        "{all}?resourceVersionMatch=Exact",
        "{all}?resourceVersionMatch=Sometimes&resourceVersion={rv}",
        "{all}?resourceVersionMatch=Exact&resourceVersion=0",
        "{all}?resourceVersionMatch=Sometimes",
        "{all}?limit=1&resourceVersion=0&continue={token}",
        "{all}?limit=1&resourceVersion={rv}&continue={token}",
        "{all}?limit=1&resourceVersion=0&resourceVersionMatch=NotOlderThan&continue={token}",
        "{one}?resourceVersion={future}",
        "{all}?resourceVersion={future}",
        "{all}?resourceVersion={future}&resourceVersionMatch=NotOlderThan",
    ];
    let mut out = Vec::new();
    for ask in asks {
        let uri = ask
            .replace("{one}", &one)
            .replace("{all}", &all)
            .replace("{rv}", &rv.to_string())
            .replace("{future}", &future.to_string())
            .replace("{token}", &token);
        let (code, body) = send(client, "GET", &uri, None).await;
        out.push((ask, outcome(code, &body)));
    }
    out
}

/// How long a watch with `timeoutSeconds` stays open, up to `longest`.
async fn watch_open_for(client: &kube::Client, k: &Kind, timeout_seconds: u64, longest: Duration) -> Duration {
    let uri = format!("{}?watch=1&timeoutSeconds={timeout_seconds}", k.collection);
    let req = Request::get(uri).body(kube::client::Body::empty()).unwrap();
    let started = Instant::now();
    let resp = client.send(req).await.expect("watch");
    assert_eq!(resp.status(), 200);
    let mut frames = resp.into_body().into_data_stream();
    let ended = tokio::time::timeout(longest, async { while frames.next().await.is_some() {} }).await;
    match ended {
        Ok(()) => started.elapsed(),
        Err(_) => longest,
    }
}

#[test]
fn reads_at_a_resource_version_match_kube_apiserver() {
    in_namespace("reads_at_a_resource_version_match_kube_apiserver", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            // kube's client retries 504s for minutes: one plain request each.
            let mut config = c.config().await;
            config.default_retry = false;
            let client = kube::Client::try_from(config).unwrap();
            let theirs = reads(&client, &CONFIGMAPS).await;
            for k in [&PODSETS, &PODSETS_BETA] {
                let ours = reads(&client, k).await;
                for ((ask, t), (_, o)) in theirs.iter().zip(&ours) {
                    if NOT_A_NUMBER.contains(ask) {
                        assert_eq!((t.0, o.0, o.1.as_str()), (500, 400, "BadRequest null"), "{ask}");
                    } else {
                        assert_eq!(t, o, "{}{ask}: kube-apiserver answered {t:?}, we answered {o:?}", k.collection);
                    }
                }
            }

            for k in [&CONFIGMAPS, &PODSETS, &PODSETS_BETA] {
                let zero = watch_open_for(&client, k, 0, Duration::from_secs(3)).await;
                assert!(zero >= Duration::from_secs(3), "{}: timeoutSeconds=0 ended after {zero:?}", k.collection);
                let one = watch_open_for(&client, k, 1, Duration::from_secs(10)).await;
                assert!(one < Duration::from_secs(5), "{}: timeoutSeconds=1 ended after {one:?}", k.collection);
            }
        });
    });
}
