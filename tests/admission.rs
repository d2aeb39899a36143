//! Admission compared with kube-apiserver's own, on the real control plane: the same namespaces and the same
//! webhook configurations (rules naming both `configmaps` and `demo.k8s.io` `podsets`, calling one real HTTPS
//! webhook in this process) must give ConfigMaps on kube-apiserver and PodSets through the aggregator the same
//! answers (code, reason, message), and the webhook must get AdmissionReviews carrying the same fields.
//!
//! `kube_apiserver_answers` runs the ConfigMap half, prints what kube-apiserver 1.20 answers, and compares it
//! with what `admission::Chain` (in this process, watching the same control plane as our server's identity)
//! answers for the same PodSet writes.
//! `podsets_are_admitted_as_configmaps_are` sends the same writes to PodSets through the aggregator, where our
//! registry runs the chain in its write path.

mod common;
#[path = "common/webhook.rs"]
mod webhook;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use common::cluster::{in_namespace, runtime, Cluster};
use http::Request;
use podset_apiserver::admission::{recommended, Admission, Chain, Outcome, PluginConfig, RequestOptions, WriteKind};
use podset_apiserver::api::{Operation, Subresource, UserInfo};
use podset_apiserver::apiserver::error::ApiError;
use podset_apiserver::controller::CONTROLLER_USER;
use podset_apiserver::resources::podset::admission_attributes;
use serde_json::{json, Value};
use webhook::WebhookServer;

struct Kind {
    /// The collection in namespace `ns`.
    collection: fn(&str) -> String,
    body: fn(&str, &str, Value) -> Value,
    resource: &'static str,
}

const CONFIGMAPS: Kind = Kind {
    collection: |ns| format!("/api/v1/namespaces/{ns}/configmaps"),
    body: |ns, name, labels| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"a": "b"}}),
    resource: "configmaps",
};

const PODSETS: Kind = Kind {
    collection: |ns| format!("/apis/demo.k8s.io/v1alpha1/namespaces/{ns}/podsets"),
    body: |ns, name, labels| {
        json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"replicas": 0}})
    },
    resource: "podsets",
};

/// Namespaces the cases write into: one labelled for namespaceSelectors, one without, one being deleted, and
/// one that does not exist.
const LABELLED: &str = "adm-labelled";
const PLAIN: &str = "adm-plain";
const DYING: &str = "adm-dying";
const MISSING: &str = "adm-missing";
/// Where the `status` and `scale` writes go.
const SUBRESOURCES: &str = "adm-subresources";
/// Where the delete cases run: only the delete webhooks select it.
const DELETES: &str = "adm-deletes";

/// The object whose `status` and `scale` are written, at `path` in [`SUBRESOURCES`]: a Deployment on
/// kube-apiserver (ConfigMaps have neither), a PodSet here.
struct WithSubresources {
    path: &'static str,
    resource: &'static str,
    body: fn() -> Value,
}

const DEPLOYMENT: WithSubresources = WithSubresources {
    path: "/apis/apps/v1/namespaces/adm-subresources/deployments",
    resource: "deployments",
    body: || {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "adm-sub"},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "adm-sub"}},
                        "template": {"metadata": {"labels": {"app": "adm-sub"}},
                                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    },
};

const PODSET: WithSubresources = WithSubresources {
    path: "/apis/demo.k8s.io/v1alpha1/namespaces/adm-subresources/podsets",
    resource: "podsets",
    body: || json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "adm-sub"}, "spec": {"replicas": 0}}),
};

/// The review on `/allow` of the case's own `sub` write to `resource`: controllers write status meanwhile (a
/// Deployment controller's reach the same webhook through kube-apiserver), so a status case is told by the
/// `observedGeneration: 1` the test writes (the controller writes 2 once the scale case bumped the generation).
fn case_review(s: &WebhookServer, resource: &str, sub: &str) -> Value {
    let ours = |r: &&webhook::Received| {
        let q = &r.review["request"];
        q["resource"]["resource"] == resource
            && q["subResource"] == sub
            && (sub != "status" || q["object"]["status"]["observedGeneration"] == 1)
    };
    s.received("/allow").iter().find(ours).map(|r| r.review.clone()).unwrap_or(Value::Null)
}

/// Writes `scale` then `status`: each answer's code, and the review the webhook got for it.
async fn subresources(
    client: &kube::Client,
    w: &WithSubresources,
    s: &WebhookServer,
) -> Vec<(&'static str, u16, Value)> {
    let (code, made) = send(client, "POST", w.path, "application/json", &(w.body)()).await;
    assert_eq!(code, 201, "{made}");
    let one = format!("{}/adm-sub", w.path);
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                       "metadata": {"name": "adm-sub", "namespace": SUBRESOURCES}, "spec": {"replicas": 2}});
    let mut out = Vec::new();
    s.clear();
    let (code, body) = send(client, "PUT", &format!("{one}/scale"), "application/json", &scale).await;
    assert!(code < 300, "scale: {body}");
    out.push(("scale", code, case_review(s, w.resource, "scale")));
    s.clear();
    let (_, mut current) = send(client, "GET", &one, "application/json", &Value::Null).await;
    current["status"] = json!({"observedGeneration": 1});
    // Unconditional: the Deployment controller may write status meanwhile.
    current["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    let (code, body) = send(client, "PUT", &format!("{one}/status"), "application/json", &current).await;
    assert!(code < 300, "status: {body}");
    out.push(("status", code, case_review(s, w.resource, "status")));
    out
}

/// One request of a case.
#[derive(Clone, Copy)]
enum Write {
    Create,
    DryRunCreate,
    Apply,
}

/// (case, namespace, how): the object is named `adm-<case>` and labelled `case: <case>`, which is what each
/// webhook's objectSelector picks.
const CASES: &[(&str, &str, Write)] = &[
    ("missing-namespace", MISSING, Write::Create),
    ("terminating-namespace", DYING, Write::Create),
    ("allow", PLAIN, Write::Create),
    ("deny", PLAIN, Write::Create),
    ("deny-apply", PLAIN, Write::Apply),
    ("allow-apply", PLAIN, Write::Apply),
    ("mutate", PLAIN, Write::Create),
    ("reinvoke", PLAIN, Write::Create),
    ("down-fail", PLAIN, Write::Create),
    ("down-ignore", PLAIN, Write::Create),
    ("timeout", PLAIN, Write::Create),
    ("ns-selected", LABELLED, Write::Create),
    ("ns-not-selected", PLAIN, Write::Create),
    ("object-not-selected", PLAIN, Write::Create),
    ("dry-run-side-effects", PLAIN, Write::DryRunCreate),
    ("dry-run-no-side-effects", PLAIN, Write::DryRunCreate),
];

fn rules() -> Value {
    json!([
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps", "configmaps/*"], "operations": ["*"]},
        {"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets", "podsets/*"], "operations": ["*"]},
    ])
}

/// The cluster's webhook configurations: each webhook sees only its case's objects.
fn configurations(s: &WebhookServer, down_port: u16) -> (Value, Value, Value, Value) {
    let ca = base64::engine::general_purpose::STANDARD.encode(&s.ca_pem);
    let hook = |name: &str, case: &str, url: String, extra: Value| {
        let mut h = json!({
            "name": format!("{name}.admission.test"),
            "clientConfig": {"url": url, "caBundle": ca},
            "rules": rules(),
            "objectSelector": {"matchLabels": {"case": case}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "failurePolicy": "Fail",
        });
        for (k, v) in extra.as_object().unwrap() {
            h[k] = v.clone();
        }
        h
    };
    let down = format!("https://{}:{down_port}/allow", s.addr.ip());
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "admission-test"},
        "webhooks": [
            hook("allow", "allow", s.url("/allow"), json!({})),
            hook("allow-apply", "allow-apply", s.url("/allow"), json!({})),
            hook("deny", "deny", s.url("/deny"), json!({})),
            hook("deny-apply", "deny-apply", s.url("/deny"), json!({})),
            hook("down-fail", "down-fail", down.clone(), json!({})),
            hook("down-ignore", "down-ignore", down, json!({"failurePolicy": "Ignore"})),
            hook("timeout", "timeout", s.url("/slow"), json!({"timeoutSeconds": 1})),
            hook("ns-selected", "ns-selected", s.url("/deny"), json!({"namespaceSelector": {"matchLabels": {"admission-test": "on"}}})),
            hook("ns-not-selected", "ns-not-selected", s.url("/deny"), json!({"namespaceSelector": {"matchLabels": {"admission-test": "on"}}})),
            hook("object-not-selected", "nobody", s.url("/deny"), json!({})),
            hook("dry-run-no-side-effects", "dry-run-no-side-effects", s.url("/allow"), json!({"sideEffects": "NoneOnDryRun"})),
        ],
    });
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "admission-test"},
        "webhooks": [
            hook("mutate", "mutate", s.url("/label"), json!({})),
            hook("reinvoke-first", "reinvoke", s.url("/allow"), json!({"reinvocationPolicy": "IfNeeded"})),
            hook("reinvoke-second", "reinvoke", s.url("/label"), json!({})),
        ],
    });
    // Scale objects carry no labels: this one selects by namespace, and names only subresources.
    let subresources = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "admission-test-subresources"},
        "webhooks": [{
            "name": "subresources.admission.test",
            "clientConfig": {"url": s.url("/allow"), "caBundle": ca},
            "rules": [
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/status", "deployments/scale"], "operations": ["*"]},
                {"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets/status", "podsets/scale"], "operations": ["*"]},
            ],
            "namespaceSelector": {"matchLabels": {"admission-test": "subresources"}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
        }],
    });
    // v1 refuses sideEffects other than None and NoneOnDryRun; v1beta1 still takes Unknown, and it reads back
    // through v1 as it was stored.
    let v1beta1 = json!({
        "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "admission-test-v1beta1"},
        "webhooks": [hook("dry-run-side-effects", "dry-run-side-effects", s.url("/allow"), json!({"sideEffects": "Unknown"}))],
    });
    (mutating, validating, v1beta1, subresources)
}

/// Webhooks on DELETE only, in [`DELETES`]: a mutating and a validating one that allow, and one that refuses
/// objects labelled `case: keep`.
fn delete_configurations(s: &WebhookServer) -> (Value, Value) {
    let ca = base64::engine::general_purpose::STANDARD.encode(&s.ca_pem);
    let hook = |name: &str, path: &str, object_selector: Value| {
        json!({
            "name": format!("{name}.admission.test"),
            "clientConfig": {"url": s.url(path), "caBundle": ca},
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["DELETE"]},
                {"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets"], "operations": ["DELETE"]},
            ],
            "namespaceSelector": {"matchLabels": {"admission-test": "deletes"}},
            "objectSelector": object_selector,
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
        })
    };
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "admission-test-deletes"},
        "webhooks": [hook("delete-mutating", "/allow", json!({}))],
    });
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "admission-test-deletes"},
        "webhooks": [
            hook("delete-validating", "/allow", json!({})),
            hook("delete-deny", "/deny", json!({"matchLabels": {"case": "keep"}})),
        ],
    });
    (mutating, validating)
}

/// A delete, a refused delete and a deletecollection in [`DELETES`]: each answer, and the DELETE reviews the
/// webhooks got for it, in a stable order (deletecollection's items are admitted concurrently by kube-apiserver).
async fn deletes(client: &kube::Client, kind: &Kind, s: &WebhookServer) -> Vec<(&'static str, Answer, Vec<Value>)> {
    let collection = (kind.collection)(DELETES);
    for (name, case) in [("del-one", "one"), ("del-keep", "keep"), ("del-a", "gone"), ("del-b", "gone")] {
        let (code, body) =
            send(client, "POST", &collection, "application/json", &(kind.body)(DELETES, name, json!({"case": case})))
                .await;
        assert_eq!(code, 201, "{body}");
    }
    let reviews = || {
        let mut r: Vec<Value> = ["/allow", "/deny"]
            .iter()
            .flat_map(|p| s.received(p).into_iter().map(move |r| (p, r.review)))
            .filter(|(_, r)| {
                r["request"]["resource"]["resource"] == kind.resource && r["request"]["operation"] == "DELETE"
            })
            .map(|(p, r)| json!({"path": p, "review": r}))
            .collect();
        r.sort_by_key(|r| (r["review"]["request"]["oldObject"]["metadata"]["name"].to_string(), r["path"].to_string()));
        r
    };
    let mut out = Vec::new();
    for (case, method, uri) in [
        ("delete", "DELETE", format!("{collection}/del-one")),
        ("delete-refused", "DELETE", format!("{collection}/del-keep")),
        ("deletecollection", "DELETE", format!("{collection}?labelSelector=case%3Dgone")),
    ] {
        s.clear();
        let (code, body) = send(client, method, &uri, "application/json", &Value::Null).await;
        out.push((case, answer(code, &body), reviews()));
    }
    let (code, _) = send(client, "GET", &format!("{collection}/del-keep"), "application/json", &Value::Null).await;
    assert_eq!(code, 200, "{}: a refused delete deleted nothing", kind.resource);
    out
}

async fn send(client: &kube::Client, method: &str, uri: &str, content_type: &str, body: &Value) -> (u16, Value) {
    let req = Request::builder().method(method).uri(uri).header("content-type", content_type);
    let (code, _, bytes) = common::raw(client, req.body(body.to_string().into_bytes()).unwrap()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// An answer without what differs between the two kinds: the resource's name in messages, the object's
/// fields, and the Go- or Rust-specific words after a webhook call's URL (save a deadline exceeded and a refused
/// connection, which we word as Go does).
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    code: u16,
    reason: String,
    message: String,
    /// For an object: its `mutated` and `round`-less labels.
    labels: Option<Value>,
}

fn answer(code: u16, body: &Value) -> Answer {
    let generic = |s: &str| s.replace("podsets.demo.k8s.io", "<resource>").replace("configmaps", "<resource>");
    let mut message = generic(body["message"].as_str().unwrap_or_default());
    if let Some(i) = message.find("?timeout=") {
        let tail = message[i..].split_once("\": ").map(|(_, t)| t.to_owned()).unwrap_or_default();
        if tail != "context deadline exceeded" && !tail.ends_with(": connect: connection refused") {
            message = format!("{}\": <transport error>", &message[..i + message[i..].find('"').unwrap_or(0)]);
        }
    }
    let labels = (body["kind"] != "Status").then(|| {
        let mut l = body["metadata"]["labels"].clone();
        if let Some(m) = l.as_object_mut() {
            m.remove("round");
        }
        l
    });
    Answer { code, reason: body["reason"].as_str().unwrap_or_default().to_owned(), message, labels }
}

/// Every case against one kind: its answer, the raw body, and the reviews the webhook got for it.
async fn run(client: &kube::Client, kind: &Kind, s: &WebhookServer) -> Vec<(&'static str, Answer, Value, Vec<Value>)> {
    let mut out = Vec::new();
    for &(case, ns, how) in CASES {
        let name = format!("adm-{case}");
        let body = (kind.body)(ns, &name, json!({"case": case}));
        let collection = (kind.collection)(ns);
        let (code, got) = match how {
            Write::Create => send(client, "POST", &collection, "application/json", &body).await,
            Write::DryRunCreate => {
                send(client, "POST", &format!("{collection}?dryRun=All"), "application/json", &body).await
            }
            Write::Apply => {
                let uri = format!("{collection}/{name}?fieldManager=admission-test");
                send(client, "PATCH", &uri, "application/apply-patch+yaml", &body).await
            }
        };
        let reviews: Vec<Value> = ["/allow", "/deny", "/label", "/slow"]
            .iter()
            .flat_map(|p| s.received(p))
            .map(|r| r.review)
            .filter(|r| {
                r["request"]["resource"]["resource"] == kind.resource
                    && (r["request"]["name"] == name.as_str()
                        || r["request"]["object"]["metadata"]["name"] == name.as_str())
            })
            .collect();
        out.push((case, answer(code, &got), got, reviews));
    }
    out
}

/// Namespaces, a namespace stuck terminating (a ConfigMap with a finalizer holds it), and the webhook
/// configurations; then waits until kube-apiserver calls the webhook.
async fn set_up(c: &Cluster, client: &kube::Client, s: &WebhookServer, down_port: u16) {
    let ns = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    for (name, labels) in [
        (LABELLED, json!({"admission-test": "on"})),
        (PLAIN, json!({})),
        (DYING, json!({})),
        (SUBRESOURCES, json!({"admission-test": "subresources"})),
        (DELETES, json!({"admission-test": "deletes"})),
    ] {
        let (code, body) = send(client, "POST", "/api/v1/namespaces", "application/json", &ns(name, labels)).await;
        assert_eq!(code, 201, "{body}");
    }
    let hold = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hold", "finalizers": ["admission.test/hold"]}});
    let (code, body) =
        send(client, "POST", &format!("/api/v1/namespaces/{DYING}/configmaps"), "application/json", &hold).await;
    assert_eq!(code, 201, "{body}");
    c.kubectl(&["delete", "namespace", DYING, "--wait=false"]);
    common::cluster::wait(
        Duration::from_secs(60),
        || async {
            let (_, ns) =
                send(client, "GET", &format!("/api/v1/namespaces/{DYING}"), "application/json", &Value::Null).await;
            ns["status"]["phase"] == "Terminating"
        },
        "the namespace to be terminating",
    )
    .await;

    let (mutating, validating, v1beta1, subresources) = configurations(s, down_port);
    let (delete_mutating, delete_validating) = delete_configurations(s);
    // The delete webhooks first: once kube-apiserver calls the later ones below, it has these too.
    for (path, config) in [
        ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", delete_mutating),
        ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", delete_validating),
        ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", subresources),
        ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", mutating),
        ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", validating),
        ("/apis/admissionregistration.k8s.io/v1beta1/validatingwebhookconfigurations", v1beta1),
    ] {
        let (code, body) = send(client, "POST", path, "application/json", &config).await;
        assert_eq!(code, 201, "{body}");
    }
    // kube-apiserver's informers see new configurations a moment later, each kind on its own: wait until a dry
    // run reaches the validating webhook, the mutating one, and the v1beta1 configuration's.
    let uri = format!("{}?dryRun=All", (CONFIGMAPS.collection)(PLAIN));
    for (case, ready) in [
        ("allow", (|code, _| code == 201) as fn(u16, &Value) -> bool),
        ("mutate", |_, made| made["metadata"]["labels"]["mutated"] == "yes"),
        ("dry-run-side-effects", |code, _| code == 400),
    ] {
        let probe = (CONFIGMAPS.body)(PLAIN, "adm-probe", json!({"case": case}));
        common::cluster::wait(
            Duration::from_secs(30),
            || async {
                let (code, made) = send(client, "POST", &uri, "application/json", &probe).await;
                ready(code, &made) && (case != "allow" || !s.received("/allow").is_empty())
            },
            &format!("kube-apiserver to call the {case} webhook"),
        )
        .await;
    }
    s.clear();
}

/// What kube-apiserver 1.20 answers, checked where we know it for sure.
fn check_kube_apiserver(theirs: &[(&'static str, Answer, Value, Vec<Value>)]) {
    let by: BTreeMap<&str, &Answer> = theirs.iter().map(|(c, a, _, _)| (*c, a)).collect();
    let code = |case: &str| by[case].code;
    assert_eq!(by["missing-namespace"].message, "namespaces \"adm-missing\" not found");
    assert_eq!((code("missing-namespace"), code("terminating-namespace")), (404, 403));
    assert_eq!(
        by["terminating-namespace"].message,
        "<resource> \"adm-terminating-namespace\" is forbidden: unable to create new content in namespace adm-dying because it is being terminated"
    );
    for ok in [
        "allow",
        "allow-apply",
        "mutate",
        "reinvoke",
        "down-ignore",
        "ns-not-selected",
        "object-not-selected",
        "dry-run-no-side-effects",
    ] {
        assert!([200, 201].contains(&code(ok)), "{ok}: {:?}", by[ok]);
    }
    for denied in ["deny", "deny-apply", "ns-selected"] {
        assert_eq!((code(denied), by[denied].reason.as_str()), (403, "Forbidden"), "{denied}");
        assert!(by[denied].message.ends_with("denied the request: no PodSets here"), "{denied}: {:?}", by[denied]);
    }
    assert_eq!((code("down-fail"), code("timeout")), (500, 500));
    assert_eq!(by["timeout"].reason, "InternalError");
    assert_eq!(code("dry-run-side-effects"), 400);
    assert_eq!(
        by["dry-run-side-effects"].message,
        "admission webhook \"dry-run-side-effects.admission.test\" does not support dry run"
    );
    assert_eq!(by["mutate"].labels, Some(json!({"case": "mutate", "mutated": "yes"})));
}

fn print(kind: &str, answers: &[(&'static str, Answer, Value, Vec<Value>)]) {
    for (case, _, body, reviews) in answers {
        let shown = if body["kind"] == "Status" {
            body.to_string()
        } else {
            format!("{} labels {}", body["kind"], body["metadata"]["labels"])
        };
        eprintln!("{kind} {case}: {shown}");
        for r in reviews {
            eprintln!("{kind} {case} review: {}", r["request"]);
        }
    }
}

/// The same cases through `admission::Chain` in this process, over its own watches of the real control plane:
/// what the registry will get for each PodSet write.
async fn run_chain(chain: &Chain, s: &WebhookServer) -> Vec<(&'static str, Answer, Value, Vec<Value>)> {
    let admin = UserInfo::named("admin", vec!["system:masters".into(), "system:authenticated".into()]);
    let mut out = Vec::new();
    for &(case, ns, how) in CASES {
        let name = format!("adm-{case}");
        let mut object = (PODSETS.body)(ns, &name, json!({"case": case}));
        let dry_run = matches!(how, Write::DryRunCreate);
        // An apply that creates is a create, with the apply's field manager (as kube-apiserver sent it).
        let manager = matches!(how, Write::Apply).then_some("admission-test");
        let options = RequestOptions::write(WriteKind::Create, dry_run, manager);
        let a = admission_attributes(Operation::Create, Subresource::Main, ns, &name, admin.clone(), options);
        let mut outcome = Outcome::default();
        let result = match chain.admit(&a, Some(&mut object), None, &mut outcome).await {
            Ok(()) => chain.validate(&a, Some(&object), None, &mut outcome).await,
            e => e,
        };
        let (code, body) = match result {
            Ok(()) => (201, object),
            Err(e) => {
                let e = ApiError::from(e);
                let mut status = serde_json::to_value(&*e.status).unwrap();
                status["kind"] = json!("Status");
                (e.code(), status)
            }
        };
        let reviews = ["/allow", "/deny", "/label", "/slow"]
            .iter()
            .flat_map(|p| s.received(p))
            .map(|r| r.review)
            .filter(|r| r["request"]["resource"]["resource"] == "podsets" && r["request"]["name"] == name.as_str())
            .collect();
        out.push((case, answer(code, &body), body, reviews));
    }
    out
}

/// Our answers and reviews against kube-apiserver's, case by case.
fn compare(theirs: &[(&'static str, Answer, Value, Vec<Value>)], ours: &[(&'static str, Answer, Value, Vec<Value>)]) {
    for ((case, t, _, t_reviews), (_, o, _, o_reviews)) in theirs.iter().zip(ours) {
        assert_eq!(t, o, "{case}: kube-apiserver answered {t:?}, we answered {o:?}");
        assert_eq!(t_reviews.len(), o_reviews.len(), "{case}: reviews {t_reviews:?} / {o_reviews:?}");
        for (t, o) in t_reviews.iter().zip(o_reviews) {
            let keys = |r: &Value| r["request"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(t), keys(o), "{case}: review fields");
            for field in ["operation", "namespace", "name", "userInfo", "dryRun", "subResource", "options", "oldObject"]
            {
                assert_eq!(t["request"][field], o["request"][field], "{case}: review {field}");
            }
        }
    }
}

fn webhook_ip() -> IpAddr {
    podset_envtest::NODE_IP.parse().unwrap()
}

/// The identity our server has in the main API server (deploy/base/rbac.yaml), for the chain's watches.
trait AdmissionClient {
    async fn podset_admission_client(&self) -> kube::Client;
}

impl AdmissionClient for Cluster {
    async fn podset_admission_client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.controller_kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

type Answers = Vec<(&'static str, Answer, Value, Vec<Value>)>;

/// The webhook, the namespaces and configurations set up, and every case sent to ConfigMaps on kube-apiserver:
/// its answers, printed and checked where we know them for sure.
async fn configmaps_on_kube_apiserver(c: &Cluster) -> (WebhookServer, kube::Client, Answers) {
    let s = WebhookServer::start(webhook_ip()).await;
    let down = std::net::TcpListener::bind((webhook_ip(), 0)).unwrap().local_addr().unwrap().port();
    let client = c.client().await;
    set_up(c, &client, &s, down).await;
    let theirs = run(&client, &CONFIGMAPS, &s).await;
    print("kube-apiserver configmaps", &theirs);
    check_kube_apiserver(&theirs);
    (s, client, theirs)
}

#[test]
fn kube_apiserver_answers() {
    in_namespace("kube_apiserver_answers", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let (s, client, theirs) = configmaps_on_kube_apiserver(&c).await;

            // The chain itself, in this process, over the same control plane.
            let stop = tokio_util::sync::CancellationToken::new();
            let plugins = recommended();
            let admission_client = c.podset_admission_client().await;
            let chain = plugins.start(&plugins.names(), admission_client, PluginConfig::default(), stop.clone()).unwrap();
            let ours = run_chain(&chain, &s).await;
            print("admission::Chain podsets", &ours);
            compare(&theirs, &ours);
            assert!(chain.has_synced());

            let subs = subresources(&client, &DEPLOYMENT, &s).await;
            for (sub, code, review) in &subs {
                eprintln!("kube-apiserver deployments {sub}: {code} review: {}", review["request"]);
                let r = &review["request"];
                assert_eq!((r["subResource"].as_str(), r["requestSubResource"].as_str()), (Some(*sub), Some(*sub)));
                assert_eq!(r["operation"], "UPDATE");
            }
            let scale = &subs[0].2["request"];
            assert_eq!(scale["kind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}));
            assert_eq!(scale["resource"], json!({"group": "apps", "version": "v1", "resource": "deployments"}));
            assert_eq!(scale["object"]["metadata"].get("labels"), None, "a Scale carries no labels");
            assert_eq!(subs[1].2["request"]["kind"]["kind"], "Deployment");

            // The same subresource writes through the chain, as the registry will make them.
            let admission_client = c.podset_admission_client().await;
            let chain = plugins.start(&plugins.names(), admission_client, PluginConfig::default(), stop.clone()).unwrap();
            let admin = UserInfo::named("admin", vec!["system:masters".into(), "system:authenticated".into()]);
            for (sub, _, theirs) in &subs {
                let (subresource, object, old) = match *sub {
                    "scale" => {
                        let scale = |spec: Value| json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                            "metadata": {"name": "adm-sub", "namespace": SUBRESOURCES}, "spec": spec, "status": {"replicas": 0}});
                        (Subresource::Scale, scale(json!({"replicas": 2})), scale(json!({})))
                    }
                    _ => {
                        let old = (PODSET.body)();
                        let mut ps = old.clone();
                        ps["status"] = json!({"observedGeneration": 1});
                        (Subresource::Status, ps, old)
                    }
                };
                let options = RequestOptions::write(WriteKind::Update, false, None);
                let a = admission_attributes(Operation::Update, subresource, SUBRESOURCES, "adm-sub", admin.clone(), options);
                s.clear();
                chain.validate(&a, Some(&object), Some(&old), &mut Outcome::default()).await.unwrap();
                let ours = case_review(&s, "podsets", sub);
                assert_ne!(ours, Value::Null, "the chain called the webhook");
                eprintln!("admission::Chain podsets {sub} review: {}", ours["request"]);
                for field in ["subResource", "requestSubResource", "operation", "userInfo", "dryRun", "options", "namespace", "name"] {
                    assert_eq!(theirs["request"][field], ours["request"][field], "{sub}: review {field}");
                }
                if *sub == "scale" {
                    assert_eq!(theirs["request"]["kind"], ours["request"]["kind"]);
                    assert_eq!(theirs["request"]["requestKind"], ours["request"]["requestKind"]);
                }
            }
            stop.cancel();
        });
    });
}

#[test]
fn podsets_are_admitted_as_configmaps_are() {
    in_namespace("podsets_are_admitted_as_configmaps_are", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let (s, client, theirs) = configmaps_on_kube_apiserver(&c).await;
            let ours = run(&client, &PODSETS, &s).await;
            print("podset-apiserver podsets", &ours);
            compare(&theirs, &ours);
            let theirs_sub = subresources(&client, &DEPLOYMENT, &s).await;
            let ours_sub = subresources(&client, &PODSET, &s).await;
            for ((sub, t_code, t), (_, o_code, o)) in theirs_sub.iter().zip(&ours_sub) {
                assert_eq!(t_code, o_code, "{sub}");
                let (t, o) = (&t["request"], &o["request"]);
                for field in ["subResource", "requestSubResource", "operation", "userInfo", "dryRun", "options"] {
                    assert_eq!(t[field], o[field], "{sub}: review {field}");
                }
                if *sub == "scale" {
                    assert_eq!(t["kind"], o["kind"], "scale: the kind is autoscaling/v1 Scale");
                    assert_eq!(t["object"]["metadata"].get("labels"), o["object"]["metadata"].get("labels"));
                }
            }

            // The embedded controller's status writes pass the same webhooks, as the controller.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let by_controller = || {
                s.received_all("/allow").iter().any(|r| {
                    let q = &r.review["request"];
                    q["userInfo"]["username"] == CONTROLLER_USER && q["subResource"] == "status"
                })
            };
            while !by_controller() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            assert!(by_controller(), "no status write of the controller reached the webhook");

            // Deletes: both phases see the object that goes as oldObject; a deletecollection's items carry no name.
            let theirs_del = deletes(&client, &CONFIGMAPS, &s).await;
            let ours_del = deletes(&client, &PODSETS, &s).await;
            for ((case, t, t_reviews), (_, o, o_reviews)) in theirs_del.iter().zip(&ours_del) {
                eprintln!("kube-apiserver configmaps {case}: {t:?}, reviews {t_reviews:?}");
                eprintln!("podset-apiserver podsets {case}: {o:?}, reviews {o_reviews:?}");
                assert_eq!((t.code, &t.reason, &t.message), (o.code, &o.reason, &o.message), "{case}");
                assert_eq!(t_reviews.len(), o_reviews.len(), "{case}: reviews");
                for (t, o) in t_reviews.iter().zip(o_reviews) {
                    assert_eq!(t["path"], o["path"], "{case}");
                    let (t, o) = (&t["review"]["request"], &o["review"]["request"]);
                    let keys = |r: &Value| r.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
                    assert_eq!(keys(t), keys(o), "{case}: review fields");
                    for field in
                        ["operation", "namespace", "name", "userInfo", "dryRun", "subResource", "options", "object"]
                    {
                        assert_eq!(t[field], o[field], "{case}: review {field}");
                    }
                    assert_eq!(
                        t["oldObject"]["metadata"]["name"], o["oldObject"]["metadata"]["name"],
                        "{case}: oldObject"
                    );
                }
            }
            let by: BTreeMap<_, _> = ours_del.iter().map(|(c, a, r)| (*c, (a, r))).collect();
            assert_eq!(by["delete"].1.len(), 2, "the mutating and the validating webhook: {:?}", by["delete"].1);
            assert_eq!(by["delete-refused"].0.code, 403);
            assert_eq!(by["deletecollection"].1.len(), 4, "two webhooks, two items");

            // Nothing refused was stored.
            for ((case, a, _, _), (_, ns, _)) in ours.iter().zip(CASES) {
                if a.code >= 400 && !case.ends_with("namespace") {
                    let uri = format!("{}/adm-{case}", (PODSETS.collection)(ns));
                    let (code, _) = send(&client, "GET", &uri, "application/json", &Value::Null).await;
                    assert_eq!(code, 404, "{case} was refused but stored");
                }
            }
        });
    });
}

/// NamespaceLifecycle under load: a namespace deleted while clients keep creating PodSets in it. The namespace
/// controller (kube-controller-manager) empties it through the aggregator and finalizes it; whatever was created
/// before we saw it terminating is deleted with it, and nothing created after is let in, so none is left behind.
#[test]
fn a_namespace_deleted_under_a_stream_of_creates_leaves_no_podset() {
    const NS: &str = "adm-stream";
    in_namespace("a_namespace_deleted_under_a_stream_of_creates_leaves_no_podset", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
            let (code, body) = send(&client, "POST", "/api/v1/namespaces", "application/json", &ns).await;
            assert_eq!(code, 201, "{body}");
            let stop = tokio_util::sync::CancellationToken::new();
            let writers: Vec<_> = (0..4)
                .map(|w| {
                    let (client, stop) = (client.clone(), stop.clone());
                    tokio::spawn(async move {
                        let mut answers = Vec::new();
                        for n in 0.. {
                            if stop.is_cancelled() {
                                break;
                            }
                            let body = (PODSETS.body)(NS, &format!("s-{w}-{n}"), json!({}));
                            answers.push(
                                send(&client, "POST", &(PODSETS.collection)(NS), "application/json", &body).await,
                            );
                        }
                        answers
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (code, body) =
                send(&client, "DELETE", &format!("/api/v1/namespaces/{NS}"), "application/json", &Value::Null).await;
            assert_eq!(code, 200, "{body}");
            common::cluster::wait(
                Duration::from_secs(180),
                || async {
                    let (code, _) =
                        send(&client, "GET", &format!("/api/v1/namespaces/{NS}"), "application/json", &Value::Null)
                            .await;
                    code == 404
                },
                "the namespace controller to empty and remove the namespace",
            )
            .await;
            // A moment more of refused creates, then nothing may be left.
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
            let mut by_code = BTreeMap::<u16, usize>::new();
            for w in writers {
                for (code, body) in w.await.unwrap() {
                    *by_code.entry(code).or_default() += 1;
                    match code {
                        201 => {}
                        403 => assert!(
                            body["message"].as_str().unwrap_or("").ends_with(&format!(
                                "unable to create new content in namespace {NS} because it is being terminated"
                            )),
                            "{body}"
                        ),
                        404 => assert_eq!(body["message"], format!("namespaces \"{NS}\" not found"), "{body}"),
                        _ => panic!("a create answered {code}: {body}"),
                    }
                }
            }
            eprintln!("creates while the namespace went, by answer: {by_code:?}");
            assert!(by_code.get(&201).is_some_and(|&n| n > 0), "some creates before the delete: {by_code:?}");
            assert!(by_code.get(&403).or(by_code.get(&404)).is_some(), "creates refused after it: {by_code:?}");
            let (code, list) = send(&client, "GET", &(PODSETS.collection)(NS), "application/json", &Value::Null).await;
            assert_eq!(code, 200, "{list}");
            let left: Vec<_> =
                list["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].clone()).collect();
            assert!(left.is_empty(), "PodSets left behind in the deleted namespace: {left:?}");
        });
    });
}
