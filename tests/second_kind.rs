//! A second kind, cluster-scoped with `/status` and `/scale`, defined here (`second_kind/widget.rs`) and served
//! beside PodSets through kube-apiserver's aggregator by this test binary itself (`cmd::run_with`): discovery v1
//! and aggregated v2, OpenAPI and `kubectl explain`, CRUD and its subresources, watch with resume, server-side
//! apply, Table output, admission webhooks, on sled and on etcd, encrypted at rest by an
//! `EncryptionConfiguration` entry for widgets alone — while PodSets keep working beside them.

mod common;
#[path = "common/webhook.rs"]
mod webhook;
#[path = "second_kind/widget.rs"]
mod widget;

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use common::cluster::{in_namespace, runtime, wait};
use futures::TryStreamExt;
use http::Request;
use kube::api::{Api, ApiResource, DynamicObject, PostParams, WatchEvent, WatchParams};
use podset_apiserver::cmd::{run_with, telemetry, Extra, Options};
use podset_envtest::{Cluster, Credential, ServerCommand};
use serde_json::{json, Value};
use webhook::WebhookServer;
use widget::{WidgetStrategy, API_VERSION, GROUP};

/// A value that must never be found at rest in plain text: a widget's label carries it.
const MARKER: &str = "w1dg3t-s3cr3t-7c2e";

/// The server the clusters below run: this binary, serving widgets beside PodSets with the flags after `--`.
#[test]
#[ignore = "the server the other tests start"]
fn serve() {
    let flags = std::env::args().skip_while(|a| a != "--").skip(1);
    let opts = Options::parse_from(std::iter::once("podset-apiserver".to_owned()).chain(flags));
    let _logs = telemetry::init(opts.log_format, None, "info").expect("logs");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run_with(opts, vec![Extra::of::<WidgetStrategy>()])).expect("served until stopped");
}

fn server(flags: &[String]) -> ServerCommand {
    let mut args: Vec<OsString> = ["serve", "--exact", "--ignored", "--nocapture", "--"].map(OsString::from).to_vec();
    args.extend(flags.iter().map(OsString::from));
    ServerCommand { program: std::env::current_exe().unwrap(), args }
}

/// Widgets encrypted by aescbc; nothing said of PodSets, which are stored plainly.
fn encryption_flag(dir: &Path) -> String {
    let file = dir.join("encryption.yaml");
    let config = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                  - resources: [widgets.test.podset.example]\n  providers:\n  - aescbc:\n      keys:\n      \
                  - name: k1\n        secret: MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=\n  - identity: {}\n";
    std::fs::write(&file, config).unwrap();
    format!("--encryption-provider-config={}", file.display())
}

#[test]
fn widgets_are_served_beside_podsets_on_sled() {
    in_namespace("widgets_are_served_beside_podsets_on_sled", || {
        let dir = tempfile::tempdir().unwrap();
        let c = Cluster::start(server(&[encryption_flag(dir.path())]));
        exercise(&c, 1);
        // What sled keeps: widgets in their group's own database, encrypted; PodSets in theirs, plain.
        let data = c.dir.path().join("podset-data");
        let (widgets, podsets) = (data.join("db-test.podset.example"), data.join("db"));
        assert!(!files_contain(&widgets, b"k8s:enc:aescbc:v1:k1:").is_empty(), "widgets are encrypted");
        assert!(files_contain(&data, MARKER.as_bytes()).is_empty(), "no widget in plain text");
        assert!(!files_contain(&podsets, b"\"kind\":\"PodSet\"").is_empty(), "PodSets are stored plainly");
        assert!(files_contain(&podsets, b"k8s:enc:").is_empty(), "nothing said of PodSets, nothing encrypted");
    });
}

#[test]
fn widgets_are_served_beside_podsets_on_etcd() {
    in_namespace("widgets_are_served_beside_podsets_on_etcd", || {
        let dir = tempfile::tempdir().unwrap();
        let c = Cluster::start_replicated(server(&[encryption_flag(dir.path())]), 2);
        exercise(&c, 2);
        // What etcd keeps, under kube-apiserver's layout: <prefix>/<group>/<resource>/...
        runtime().block_on(async {
            let mut etcd = etcd_client::Client::connect([c.etcd_url()], None).await.unwrap();
            let options = || Some(etcd_client::GetOptions::new().with_prefix());
            let pairs = |got: etcd_client::GetResponse| -> Vec<(String, Vec<u8>)> {
                got.kvs().iter().map(|kv| (kv.key_str().unwrap().to_owned(), kv.value().to_vec())).collect()
            };
            let widgets = pairs(etcd.get("/registry/test.podset.example/widgets/", options()).await.unwrap());
            assert!(widgets.iter().any(|(k, _)| k == "/registry/test.podset.example/widgets/blue"), "{widgets:?}");
            for (key, value) in &widgets {
                assert!(value.starts_with(b"k8s:enc:aescbc:v1:k1:"), "{key} is encrypted");
            }
            let podsets = pairs(etcd.get("/registry/demo.k8s.io/podsets/", options()).await.unwrap());
            assert!(podsets.iter().any(|(k, _)| k == "/registry/demo.k8s.io/podsets/default/web"), "{podsets:?}");
            for (key, value) in &podsets {
                assert!(value.starts_with(b"{"), "{key} is plain JSON");
            }
        });
    });
}

/// Everything a user does with widgets through kube-apiserver, and PodSets beside them.
fn exercise(c: &Cluster, replicas: usize) {
    c.register_group_version(GROUP, "v1");
    discovery_and_openapi(c);
    kubectl_crud(c);
    runtime().block_on(async {
        let client = c.client().await;
        watch_with_resume(&client).await;
        webhooks(c, &client).await;
        metrics(c, replicas).await;
    });
    podsets_beside(c);
}

/// The request metrics name widgets as they name PodSets: objects stored (every replica's cache holds them all),
/// and watch events sent (by whichever replica served the watch).
async fn metrics(c: &Cluster, replicas: usize) {
    let proxy = c.front_proxy_cert();
    let mut scrapes = Vec::new();
    for i in 0..replicas {
        let client = c.replica_client(i, Credential::Cert(&proxy));
        let req = Request::get("/metrics").header("X-Remote-User", "admin").header("X-Remote-Group", "system:masters");
        let (code, _, body) = common::raw(&client, req.body(Vec::new()).unwrap()).await;
        assert_eq!(code, 200);
        scrapes.push(String::from_utf8(body.to_vec()).unwrap());
    }
    let value = |text: &str, series: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
    };
    // blue, w2, w3 and green (w1 deleted, red refused).
    let stored = r#"apiserver_storage_objects{resource="widgets.test.podset.example"}"#;
    assert_eq!(value(&scrapes[0], stored), 4.0, "{}", scrapes[0]);
    let sent = r#"apiserver_watch_events_total{group="test.podset.example",version="v1",resource="widgets"}"#;
    let total: f64 = scrapes.iter().map(|s| value(s, sent)).sum();
    assert_eq!(total, 4.0, "the two watches' events: w1, w2, then w3 and w1's deletion");
}

fn discovery_and_openapi(c: &Cluster) {
    let groups: Value = serde_json::from_str(&c.kubectl(&["get", "--raw", "/apis"])).unwrap();
    let group = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == GROUP).expect("listed");
    assert_eq!(group["preferredVersion"]["groupVersion"], API_VERSION);
    let out = c.kubectl(&["api-resources", "--api-group", GROUP, "--no-headers"]);
    let cols: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(cols, ["widgets", "wd", API_VERSION, "false", "Widget"], "cluster-scoped, short name wd: {out}");
    let list: Value = serde_json::from_str(&c.kubectl(&["get", "--raw", "/apis/test.podset.example/v1"])).unwrap();
    let names: Vec<&str> = list["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["widgets", "widgets/status", "widgets/scale"]);

    // The aggregated discovery a 1.30+ aggregator fetches from an APIService's server: both groups.
    runtime().block_on(async {
        let proxy = c.front_proxy_cert();
        let client = c.podset_client(Credential::Cert(&proxy));
        let req = Request::get("/apis")
            .header("accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
            .body(Vec::new())
            .unwrap();
        let (code, _, body) = common::raw(&client, req).await;
        assert_eq!(code, 200);
        let v2: Value = serde_json::from_slice(&body).unwrap();
        let items = v2["items"].as_array().unwrap();
        let names: Vec<&str> = items.iter().map(|g| g["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["demo.k8s.io", GROUP]);
        let widgets = &items[1]["versions"][0]["resources"][0];
        assert_eq!((widgets["resource"].as_str(), widgets["scope"].as_str()), (Some("widgets"), Some("Cluster")));
        let subs: Vec<&str> =
            widgets["subresources"].as_array().unwrap().iter().map(|s| s["subresource"].as_str().unwrap()).collect();
        assert_eq!(subs, ["status", "scale"]);

        // The OpenAPI v3 a 1.27+ aggregator serves from an APIService's server: the root names the group version,
        // whose document has the widget's cluster-scoped paths and its definitions.
        let get = |path: String| {
            let req = Request::get(path).header("X-Remote-User", "admin").header("X-Remote-Group", "system:masters");
            common::raw(&client, req.body(Vec::new()).unwrap())
        };
        let (code, _, body) = get("/openapi/v3".into()).await;
        assert_eq!(code, 200);
        let root: Value = serde_json::from_slice(&body).unwrap();
        let url = root["paths"]["apis/test.podset.example/v1"]["serverRelativeURL"].as_str().unwrap().to_owned();
        let (code, _, body) = get(url).await;
        assert_eq!(code, 200);
        let v3: Value = serde_json::from_slice(&body).unwrap();
        assert!(v3["paths"]["/apis/test.podset.example/v1/widgets/{name}/scale"].is_object(), "{v3}");
        let spec = &v3["components"]["schemas"]["io.example.podset.test.v1.WidgetSpec"]["properties"];
        assert_eq!(spec["size"]["type"], "integer");
    });

    let v2 = c.kubectl(&["get", "--raw", "/openapi/v2"]);
    assert!(v2.contains("io.example.podset.test.v1.Widget") && v2.contains("io.k8s.demo.v1beta1.PodSet"));
    let out = c.kubectl(&["explain", "widgets.spec", "--api-version", API_VERSION]);
    assert!(out.contains("KIND:") && out.contains("Widget"), "{out}");
    assert!(out.contains("Size of the widget") && out.contains("Defaults to blue"), "{out}");
}

const BLUE: &str = "apiVersion: test.podset.example/v1\nkind: Widget\nmetadata:\n  name: blue\n  labels:\n    secret: w1dg3t-s3cr3t-7c2e\nspec:\n  size: 3\n";

fn kubectl_crud(c: &Cluster) {
    let apply = |manager: &str, yaml: &str, extra: &[&str]| {
        let path = c.dir.path().join(format!("widget-{manager}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let mut args = vec!["apply", "--server-side", "--field-manager", manager, "-f", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        c.kubectl_try(&args)
    };
    let out = apply("alice", BLUE, &[]).unwrap();
    assert!(out.contains("widget.test.podset.example/blue serverside-applied"), "{out}");
    let blue: Value = serde_json::from_str(&c.kubectl(&["get", "widget", "blue", "-o", "json"])).unwrap();
    assert_eq!((blue["spec"]["color"].as_str(), blue["metadata"].get("namespace")), (Some("blue"), None));
    assert_eq!(blue["metadata"]["generation"], 1);

    // Table output, as kubectl prints it.
    let out = c.kubectl(&["get", "widgets"]);
    let mut lines = out.lines();
    assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>(), ["NAME", "SIZE", "COLOR", "AGE"]);
    assert_eq!(lines.next().unwrap().split_whitespace().take(3).collect::<Vec<_>>(), ["blue", "3", "blue"]);

    // Server-side apply by a second manager: a conflict, then forced.
    let bigger = BLUE.replace("size: 3", "size: 4");
    let e = apply("bob", &bigger, &[]).unwrap_err();
    assert!(e.contains("conflict") && e.contains(".spec.size"), "{e}");
    apply("bob", &bigger, &["--force-conflicts"]).unwrap();
    let shown = c.kubectl(&["get", "widget", "blue", "-o", "json", "--show-managed-fields"]);
    let blue: Value = serde_json::from_str(&shown).unwrap();
    let managers: Vec<&str> =
        blue["metadata"]["managedFields"].as_array().unwrap().iter().map(|m| m["manager"].as_str().unwrap()).collect();
    assert_eq!((blue["spec"]["size"].as_i64(), managers.contains(&"bob")), (Some(4), true), "{managers:?}");

    // /status takes only status; the main resource keeps it; /scale takes only the size.
    let status = r#"{"status":{"seen":4},"spec":{"size":99}}"#;
    c.kubectl(&["patch", "widget", "blue", "--subresource=status", "--type=merge", "-p", status]);
    c.kubectl(&["patch", "widget", "blue", "--type=merge", "-p", r#"{"status":{"seen":0}}"#]);
    c.kubectl(&["scale", "widget", "blue", "--replicas=6"]);
    let blue: Value = serde_json::from_str(&c.kubectl(&["get", "widget", "blue", "-o", "json"])).unwrap();
    assert_eq!((blue["spec"]["size"].as_i64(), blue["status"]["seen"].as_i64()), (Some(6), Some(4)));
    let scale: Value =
        serde_json::from_str(&c.kubectl(&["get", "--raw", "/apis/test.podset.example/v1/widgets/blue/scale"])).unwrap();
    assert_eq!((scale["spec"]["replicas"].as_i64(), scale["status"]["replicas"].as_i64()), (Some(6), Some(4)));

    // Invalid objects are refused with the resource's own words; a namespaced path is not one of its paths.
    let e =
        c.kubectl_try(&["patch", "widget", "blue", "--type=merge", "-p", r#"{"spec":{"color":"pink"}}"#]).unwrap_err();
    assert!(e.contains(r#"The Widget "blue" is invalid: spec.color: Unsupported value: "pink""#), "{e}");
    let e = c.kubectl_try(&["get", "--raw", "/apis/test.podset.example/v1/namespaces/default/widgets"]).unwrap_err();
    assert!(e.contains("NotFound") || e.contains("not found"), "{e}");

    // Delete, and the widget is gone.
    let out = c.kubectl(&["delete", "widget", "blue"]);
    assert!(out.contains("deleted"), "{out}");
    assert!(c.kubectl_try(&["get", "widget", "blue"]).unwrap_err().contains("NotFound"));
    // Back for the checks at rest.
    apply("alice", BLUE, &[]).unwrap();
}

fn widgets_api() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: API_VERSION.into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widget(name: &str, size: i32, labels: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": API_VERSION, "kind": "Widget",
        "metadata": {"name": name, "labels": labels}, "spec": {"size": size}}))
    .unwrap()
}

/// A watch from a list's resourceVersion sees what follows; after it times out, one resumed from the last event it
/// saw sees only what came after.
async fn watch_with_resume(client: &kube::Client) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &widgets_api());
    let listed = api.list(&Default::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
    let seen = |events: Vec<WatchEvent<DynamicObject>>| -> (Vec<String>, String) {
        let mut names = Vec::new();
        let mut last = String::new();
        for e in events {
            match e {
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                    last = o.metadata.resource_version.clone().unwrap();
                    names.push(o.metadata.name.unwrap());
                }
                WatchEvent::Bookmark(b) => last = b.metadata.resource_version,
                WatchEvent::Error(e) => panic!("{e:?}"),
            }
        }
        (names, last)
    };
    api.create(&PostParams::default(), &widget("w1", 1, json!({}))).await.unwrap();
    api.create(&PostParams::default(), &widget("w2", 2, json!({}))).await.unwrap();
    let events = api.watch(&WatchParams::default().timeout(3), &from).await.unwrap();
    let (names, last) = seen(events.try_collect::<Vec<_>>().await.unwrap());
    assert_eq!(names, ["w1", "w2"]);
    api.create(&PostParams::default(), &widget("w3", 3, json!({}))).await.unwrap();
    api.delete("w1", &Default::default()).await.unwrap();
    let events = api.watch(&WatchParams::default().timeout(3), &last).await.unwrap();
    let (names, _) = seen(events.try_collect::<Vec<_>>().await.unwrap());
    assert_eq!(names, ["w3", "w1"], "resumed after w2: w3 added, w1 deleted");
}

/// A mutating webhook labels widgets; a validating one refuses those labelled `deny`. Both are called by our
/// server for writes to a cluster-scoped resource of another group, with its own kind and resource.
async fn webhooks(c: &Cluster, client: &kube::Client) {
    let ip: IpAddr = podset_envtest::NODE_IP.parse().unwrap();
    let s = WebhookServer::start(ip).await;
    let ca = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&s.ca_pem)
    };
    let rules = json!([{"apiGroups": [GROUP], "apiVersions": ["v1"], "resources": ["widgets"],
                        "operations": ["CREATE"], "scope": "Cluster"}]);
    let hook = |name: &str, path: &str, selector: Value| {
        json!({"name": name, "clientConfig": {"url": s.url(path), "caBundle": ca}, "rules": rules,
               "objectSelector": selector, "sideEffects": "None", "admissionReviewVersions": ["v1"],
               "failurePolicy": "Fail", "timeoutSeconds": 5})
    };
    let configs = [
        (
            "mutatingwebhookconfigurations",
            json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": "widgets-label"},
            "webhooks": [hook("label.widgets.test", "/label", json!({}))]}),
        ),
        (
            "validatingwebhookconfigurations",
            json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "widgets-deny"},
            "webhooks": [hook("deny.widgets.test", "/deny", json!({"matchLabels": {"deny": "yes"}}))]}),
        ),
    ];
    for (plural, config) in configs {
        let uri = format!("/apis/admissionregistration.k8s.io/v1/{plural}");
        let req = Request::post(uri).header("content-type", "application/json").body(config.to_string().into_bytes());
        let (code, _, body) = common::raw(client, req.unwrap()).await;
        assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &widgets_api());
    // Our server's informer sees the configurations a moment later: wait until a dry run comes back labelled.
    let dry = PostParams { dry_run: true, ..Default::default() };
    wait(
        Duration::from_secs(60),
        || async {
            let made = api.create(&dry, &widget("probe", 1, json!({}))).await;
            made.is_ok_and(|w| w.metadata.labels.unwrap_or_default().get("mutated").is_some_and(|v| v == "yes"))
        },
        "the mutating webhook to label widgets",
    )
    .await;
    s.clear();
    let green = api.create(&PostParams::default(), &widget("green", 2, json!({}))).await.unwrap();
    assert_eq!(green.metadata.labels.unwrap()["mutated"], "yes");
    let review = &s.received("/label")[0].review["request"];
    assert_eq!(review["kind"], json!({"group": GROUP, "version": "v1", "kind": "Widget"}));
    assert_eq!(review["resource"], json!({"group": GROUP, "version": "v1", "resource": "widgets"}));
    assert_eq!((review["namespace"].as_str().unwrap_or(""), review["name"].as_str()), ("", Some("green")));
    wait(
        Duration::from_secs(60),
        || async {
            let e = api.create(&dry, &widget("probe", 1, json!({"deny": "yes"}))).await;
            matches!(e, Err(kube::Error::Api(s)) if s.code == 403)
        },
        "the validating webhook to refuse widgets labelled deny",
    )
    .await;
    let refused = api.create(&PostParams::default(), &widget("red", 1, json!({"deny": "yes"}))).await.unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403 && s.message.contains("deny.widgets.test")),
        "{refused:?}"
    );
    assert!(api.get_opt("red").await.unwrap().is_none(), "nothing stored");
    for (plural, name) in
        [("mutatingwebhookconfigurations", "widgets-label"), ("validatingwebhookconfigurations", "widgets-deny")]
    {
        c.kubectl(&["delete", plural, name]);
    }
}

fn podsets_beside(c: &Cluster) {
    let path = c.dir.path().join("podset-web.yaml");
    std::fs::write(&path, common::podset("web", 1).to_string()).unwrap();
    c.kubectl(&["apply", "-n", "default", "-f", path.to_str().unwrap()]);
    c.kubectl(&["scale", "-n", "default", "podset", "web", "--replicas=2"]);
    let out = c.kubectl(&["get", "podsets", "-n", "default"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..2], ["web", "2"], "{out}");
    let widgets = c.kubectl(&["get", "widgets", "-o", "name"]);
    assert!(widgets.lines().any(|l| l == "widget.test.podset.example/blue"), "{widgets}");
}

/// The files under `dir` whose bytes contain `needle`.
fn files_contain(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).unwrap_or_default().windows(needle.len()).any(|w| w == needle) {
                found.push(p.display().to_string());
            }
        }
    }
    found
}
