//! The admission chain against a real HTTPS webhook server in this process (rustls, its own CA, 127.0.0.1):
//! allow, deny, JSONPatch, reinvocation, timeouts and failurePolicy, v1beta1, dry runs, bad answers, TLS failures,
//! credentials from the AdmissionConfiguration's kubeconfig, and connection reuse. Namespaces and webhook
//! configurations are given directly (no main API server); tests/admission.rs has them from a real one.

#[path = "common/webhook.rs"]
mod webhook;

use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::Status;
use podset_apiserver::admission::{
    recommended, Admission, Attributes, Chain, Error, Namespaces, Outcome, PluginConfig, RequestOptions, Sources,
    WebhookClients, WebhookConfigurations, WebhookPluginConfig, WriteKind,
};
use podset_apiserver::api::{Operation, Subresource, UserInfo};
use podset_apiserver::apiserver::error::ApiError;
use podset_apiserver::resources::podset::admission_attributes;
use serde_json::{json, Value};
use webhook::WebhookServer;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn namespaces() -> Namespaces {
    let ns = |name: &str, labels: Value, phase: &str| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "status": {"phase": phase}}))
            .unwrap()
    };
    Namespaces::fixed(vec![
        ns("default", json!({"env": "test"}), "Active"),
        ns("other", json!({}), "Active"),
        ns("leaving", json!({}), "Terminating"),
    ])
}

/// A webhook entry calling `path` on `server`, trusting its CA; `extra` overrides fields.
fn hook(server: &WebhookServer, name: &str, path: &str, extra: Value) -> Value {
    use base64::Engine as _;
    let mut h = json!({
        "name": name,
        "clientConfig": {"url": server.url(path), "caBundle": base64::engine::general_purpose::STANDARD.encode(&server.ca_pem)},
        "rules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets", "podsets/status", "podsets/scale"],
                   "operations": ["CREATE", "UPDATE", "DELETE"], "scope": "*"}],
        "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None", "timeoutSeconds": 1,
        "admissionReviewVersions": ["v1", "v1beta1"], "namespaceSelector": {}, "objectSelector": {},
    });
    for (k, v) in extra.as_object().unwrap() {
        h[k] = v.clone();
    }
    h
}

fn validating(name: &str, hooks: Vec<Value>) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": hooks})).unwrap()
}

fn mutating(name: &str, hooks: Vec<Value>) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": hooks})).unwrap()
}

fn chain(m: Vec<MutatingWebhookConfiguration>, v: Vec<ValidatingWebhookConfiguration>) -> Chain {
    chain_with(m, v, WebhookPluginConfig::default())
}

fn chain_with(
    m: Vec<MutatingWebhookConfiguration>,
    v: Vec<ValidatingWebhookConfiguration>,
    clients: WebhookPluginConfig,
) -> Chain {
    let sources = Sources {
        namespaces: namespaces(),
        configurations: Some(WebhookConfigurations::fixed(&m, &v)),
        quotas: None,
        policies: None,
        mutating_policies: None,
    };
    recommended().with_sources(sources, PluginConfig { webhooks: clients, ..Default::default() }).unwrap()
}

fn jane() -> UserInfo {
    UserInfo {
        name: "jane".into(),
        uid: "u-42".into(),
        groups: vec!["dev".into(), "system:authenticated".into()],
        extra: [("scopes".to_owned(), vec!["podsets".to_owned()])].into(),
    }
}

fn create(namespace: &str) -> Attributes {
    let options = RequestOptions::write(WriteKind::Create, false, Some("kubectl"));
    admission_attributes(Operation::Create, Subresource::Main, namespace, "web", jane(), options)
}

fn update_options() -> RequestOptions {
    RequestOptions::write(WriteKind::Update, false, None)
}

fn delete_options() -> RequestOptions {
    RequestOptions::delete(Default::default(), false)
}

fn podset() -> Value {
    json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"replicas": 2}})
}

/// The mutating then the validating phase, as the registry runs them.
async fn admit(c: &Chain, a: &Attributes, object: &mut Value) -> (Result<(), Error>, Outcome) {
    let mut out = Outcome::default();
    let result = match c.admit(a, Some(object), None, &mut out).await {
        Ok(()) => c.validate(a, Some(object), None, &mut out).await,
        e => e,
    };
    (result, out)
}

#[tokio::test]
async fn an_allowing_webhook_gets_the_whole_review_and_its_warnings_and_annotations_come_back() {
    let s = WebhookServer::start(LOCALHOST).await;
    let c = chain(vec![], vec![validating("check", vec![hook(&s, "allow.test.io", "/allow", json!({}))])]);
    let mut ps = podset();
    let (result, out) = admit(&c, &create("default"), &mut ps).await;
    result.unwrap();
    assert_eq!(out.warnings, ["seen by the test webhook"]);
    assert_eq!(out.audit_annotations.get("allow.test.io/seen").map(String::as_str), Some("yes"));

    let got = s.received("/allow");
    assert_eq!(got.len(), 1);
    let r = &got[0].review;
    assert_eq!((r["apiVersion"].as_str(), r["kind"].as_str()), (Some("admission.k8s.io/v1"), Some("AdmissionReview")));
    let req = &r["request"];
    assert!(req["uid"].as_str().is_some_and(|u| u.len() == 36), "{req}");
    assert_eq!(req["kind"], json!({"group": "demo.k8s.io", "version": "v1alpha1", "kind": "PodSet"}));
    assert_eq!(req["resource"], json!({"group": "demo.k8s.io", "version": "v1alpha1", "resource": "podsets"}));
    assert_eq!((&req["requestKind"], &req["requestResource"]), (&req["kind"], &req["resource"]));
    assert_eq!(
        (req["name"].as_str(), req["namespace"].as_str(), req["operation"].as_str()),
        (Some("web"), Some("default"), Some("CREATE"))
    );
    assert_eq!(
        req["userInfo"],
        json!({"username": "jane", "uid": "u-42", "groups": ["dev", "system:authenticated"], "extra": {"scopes": ["podsets"]}})
    );
    assert_eq!((&req["object"], &req["oldObject"], &req["dryRun"]), (&ps, &Value::Null, &json!(false)));
    assert_eq!(
        req["options"],
        json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl"})
    );
    assert!(got[0].authorization.is_none(), "no kubeconfig: anonymous");
}

#[tokio::test]
async fn a_denial_carries_the_webhooks_status() {
    let s = WebhookServer::start(LOCALHOST).await;
    let c = chain(
        vec![],
        vec![
            validating("a", vec![hook(&s, "deny.test.io", "/deny", json!({}))]),
            validating("b", vec![hook(&s, "bare.test.io", "/deny-bare", json!({}))]),
        ],
    );
    let (result, _) = admit(&c, &create("default"), &mut podset()).await;
    let status = status_of(&result.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(status.message, "admission webhook \"deny.test.io\" denied the request: no PodSets here");
    assert_eq!(s.received("/deny-bare").len(), 1, "validating webhooks are all called");

    let c = chain(vec![], vec![validating("b", vec![hook(&s, "bare.test.io", "/deny-bare", json!({}))])]);
    let status = status_of(&admit(&c, &create("default"), &mut podset()).await.0.unwrap_err());
    assert_eq!(
        (status.code, status.message.as_str()),
        (400, "admission webhook \"bare.test.io\" denied the request without explanation")
    );
}

#[tokio::test]
async fn a_mutating_webhooks_patch_is_applied_defaulted_and_audited() {
    let s = WebhookServer::start(LOCALHOST).await;
    let c = chain(vec![mutating("label", vec![hook(&s, "label.test.io", "/label", json!({}))])], vec![]);
    let mut ps = podset();
    let (result, out) = admit(&c, &create("default"), &mut ps).await;
    result.unwrap();
    assert_eq!(ps["metadata"]["labels"], json!({"mutated": "yes", "round": "1"}));
    assert!(ps["spec"]["template"].is_object(), "defaulted again after the patch: {ps}");
    assert_eq!(
        out.audit_annotations.get("mutation.webhook.admission.k8s.io/round_0_index_0").map(String::as_str),
        Some(r#"{"configuration":"label","webhook":"label.test.io","mutated":true}"#)
    );
    let patch: Value =
        serde_json::from_str(&out.audit_annotations["patch.webhook.admission.k8s.io/round_0_index_0"]).unwrap();
    assert_eq!((patch["patchType"].as_str(), patch["webhook"].as_str()), (Some("JSONPatch"), Some("label.test.io")));

    // On a delete there is no object to patch.
    let delete = admission_attributes(Operation::Delete, Subresource::Main, "default", "web", jane(), delete_options());
    let e = c.admit(&delete, None, Some(&podset()), &mut Outcome::default()).await.unwrap_err();
    assert_eq!(
        status_of(&e).message,
        "Internal error occurred: admission webhook \"label.test.io\" attempted to modify the object, which is not supported for this operation"
    );
}

#[tokio::test]
async fn an_ifneeded_webhook_is_called_again_once_a_later_one_changed_the_object() {
    let s = WebhookServer::start(LOCALHOST).await;
    let first = |policy: &str| {
        mutating("a-first", vec![hook(&s, "first.test.io", "/allow", json!({"reinvocationPolicy": policy}))])
    };
    let second = mutating("b-second", vec![hook(&s, "second.test.io", "/label", json!({}))]);

    let c = chain(vec![first("IfNeeded"), second.clone()], vec![]);
    let mut ps = podset();
    let (result, out) = admit(&c, &create("default"), &mut ps).await;
    result.unwrap();
    let calls = s.received("/allow");
    assert_eq!(calls.len(), 2, "called again after the second webhook's patch");
    assert_eq!(
        calls[1].review["request"]["object"]["metadata"]["labels"]["mutated"], "yes",
        "and saw the patched object"
    );
    assert_eq!(s.received("/label").len(), 1, "the patching webhook is not IfNeeded: not called again");
    assert!(out.audit_annotations.contains_key("mutation.webhook.admission.k8s.io/round_1_index_0"));

    s.clear();
    let c = chain(vec![first("Never"), second], vec![]);
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/allow").len(), 1);
}

#[tokio::test]
async fn failure_policy_decides_for_a_webhook_that_is_down_slow_or_talks_nonsense() {
    let s = WebhookServer::start(LOCALHOST).await;
    let closed = podset_envtest::free_port(); // nothing listens on it
    let down = json!({"clientConfig": {"url": format!("https://127.0.0.1:{closed}/allow")}});
    let refused = format!("failed calling webhook \"down.test.io\": Post \"https://127.0.0.1:{closed}/allow?timeout=1s\": dial tcp 127.0.0.1:{closed}: connect: connection refused");
    let cases = [
        ("down.test.io", "/allow", down.clone(), refused.as_str()),
        ("slow.test.io", "/slow", json!({}), "/slow?timeout=1s\": context deadline exceeded"),
        ("garbage.test.io", "/garbage", json!({}), "failed calling webhook \"garbage.test.io\": expected ident"),
        ("uid.test.io", "/wrong-uid", json!({}), "expected response.uid=\""),
        (
            "error.test.io",
            "/error",
            json!({}),
            "an error on the server (\"webhook exploded\") has prevented the request from succeeding",
        ),
        (
            "tls.test.io",
            "/allow",
            json!({"clientConfig": {"url": s.url("/allow"), "caBundle": other_ca()}}),
            "\": tls: failed to verify certificate: x509: certificate signed by unknown authority",
        ),
    ];
    for (name, path, extra, says) in cases {
        for phase in ["mutating", "validating"] {
            let h = hook(&s, name, path, extra.clone());
            let c = match phase {
                "mutating" => chain(vec![mutating("c", vec![h])], vec![]),
                _ => chain(vec![], vec![validating("c", vec![h])]),
            };
            let e = admit(&c, &create("default"), &mut podset()).await.0.unwrap_err();
            let status = status_of(&e);
            assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"), "{phase} {name}: {e}");
            assert!(
                status.message.starts_with(&format!("Internal error occurred: failed calling webhook \"{name}\": ")),
                "{}",
                status.message
            );
            eprintln!("{phase} {name}: {}", status.message);
            assert!(status.message.contains(says), "{phase} {name}: {}", status.message);

            let mut ignore = hook(&s, name, path, extra.clone());
            ignore["failurePolicy"] = json!("Ignore");
            let c = match phase {
                "mutating" => chain(vec![mutating("c", vec![ignore])], vec![]),
                _ => chain(vec![], vec![validating("c", vec![ignore])]),
            };
            admit(&c, &create("default"), &mut podset())
                .await
                .0
                .unwrap_or_else(|e| panic!("{phase} {name} Ignore: {e}"));
        }
    }

    // A denial is not a failure: Ignore does not let it through.
    let c = chain(
        vec![],
        vec![validating("c", vec![hook(&s, "deny.test.io", "/deny", json!({"failurePolicy": "Ignore"}))])],
    );
    assert!(admit(&c, &create("default"), &mut podset()).await.0.unwrap_err().is_denial());
}

fn other_ca() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(webhook::certificates(LOCALHOST, "another CA").0)
}

#[tokio::test]
async fn patches_that_do_not_apply_or_do_not_decode_fail_the_request() {
    let s = WebhookServer::start(LOCALHOST).await;
    for (path, says) in [
        ("/bad-patch", "returned a patch that does not apply"),
        ("/invalid-patch", "makes an object that does not decode"),
    ] {
        let c =
            chain(vec![mutating("m", vec![hook(&s, "p.test.io", path, json!({"failurePolicy": "Ignore"}))])], vec![]);
        let mut ps = podset();
        let e = admit(&c, &create("default"), &mut ps).await.0.unwrap_err();
        assert_eq!(status_of(&e).code, 500, "{e}");
        assert!(status_of(&e).message.starts_with("Internal error occurred: admission webhook \"p.test.io\""), "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert_eq!(ps, podset(), "the object is left as it was");
    }
}

#[tokio::test]
async fn a_v1beta1_only_webhook_gets_a_v1beta1_review() {
    let s = WebhookServer::start(LOCALHOST).await;
    let h = hook(&s, "old.test.io", "/label", json!({"admissionReviewVersions": ["v1beta1"]}));
    let c = chain(vec![mutating("m", vec![h])], vec![]);
    let mut ps = podset();
    admit(&c, &create("default"), &mut ps).await.0.unwrap();
    assert_eq!(s.received("/label")[0].review["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(ps["metadata"]["labels"]["mutated"], "yes", "a v1beta1 patch needs no patchType");

    let h = hook(&s, "future.test.io", "/allow", json!({"admissionReviewVersions": ["v2"]}));
    let e =
        admit(&chain(vec![], vec![validating("v", vec![h])]), &create("default"), &mut podset()).await.0.unwrap_err();
    assert!(e.to_string().ends_with("webhook does not accept known AdmissionReview versions (v1, v1beta1)"), "{e}");
}

#[tokio::test]
async fn a_dry_run_reaches_only_webhooks_without_side_effects() {
    let s = WebhookServer::start(LOCALHOST).await;
    let mut dry = create("default");
    dry.dry_run = true;
    for effects in ["None", "NoneOnDryRun"] {
        let c = chain(
            vec![],
            vec![validating("v", vec![hook(&s, "ok.test.io", "/allow", json!({"sideEffects": effects}))])],
        );
        admit(&c, &dry, &mut podset()).await.0.unwrap();
    }
    let seen = s.received("/allow");
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.review["request"]["dryRun"] == true));
    for effects in ["Some", "Unknown"] {
        let h = hook(&s, "effects.test.io", "/allow", json!({"sideEffects": effects, "failurePolicy": "Ignore"}));
        let e = admit(&chain(vec![mutating("m", vec![h])], vec![]), &dry, &mut podset()).await.0.unwrap_err();
        let status = status_of(&e);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (400, "BadRequest"),
            "{effects}: not subject to failurePolicy"
        );
        assert_eq!(status.message, "admission webhook \"effects.test.io\" does not support dry run");
    }
    assert_eq!(s.received("/allow").len(), 2, "and was not called");
    // Not a dry run: called whatever its side effects.
    let c = chain(
        vec![],
        vec![validating("v", vec![hook(&s, "effects.test.io", "/allow", json!({"sideEffects": "Some"}))])],
    );
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
}

#[tokio::test]
async fn selectors_pick_the_requests_a_webhook_sees() {
    let s = WebhookServer::start(LOCALHOST).await;
    let by_ns = hook(&s, "ns.test.io", "/deny", json!({"namespaceSelector": {"matchLabels": {"env": "test"}}}));
    let by_obj = hook(&s, "obj.test.io", "/deny", json!({"objectSelector": {"matchLabels": {"app": "web"}}}));
    let c = chain(vec![], vec![validating("ns", vec![by_ns]), validating("obj", vec![by_obj])]);

    let e = admit(&c, &create("default"), &mut podset()).await.0.unwrap_err();
    assert!(e.to_string().contains("ns.test.io"), "{e}");
    admit(&c, &create("other"), &mut podset()).await.0.unwrap();
    let mut labelled = podset();
    labelled["metadata"]["labels"] = json!({"app": "web"});
    let e = admit(&c, &create("other"), &mut labelled).await.0.unwrap_err();
    assert!(e.to_string().contains("obj.test.io"), "{e}");
    let update = admission_attributes(Operation::Update, Subresource::Main, "other", "web", jane(), update_options());
    let mut out = Outcome::default();
    let e = c.validate(&update, Some(&podset()), Some(&labelled), &mut out).await.unwrap_err();
    assert!(e.to_string().contains("obj.test.io"), "the old object's labels count: {e}");
}

#[tokio::test]
async fn namespace_lifecycle_runs_before_any_webhook() {
    let s = WebhookServer::start(LOCALHOST).await;
    let c = chain(vec![mutating("m", vec![hook(&s, "label.test.io", "/label", json!({}))])], vec![]);
    let e = admit(&c, &create("missing"), &mut podset()).await.0.unwrap_err();
    assert_eq!((status_of(&e).code, status_of(&e).message.as_str()), (404, "namespaces \"missing\" not found"));
    let e = admit(&c, &create("leaving"), &mut podset()).await.0.unwrap_err();
    assert_eq!(status_of(&e).code, 403);
    assert!(s.received("/label").is_empty());

    // Status writes in a terminating namespace pass, and reach the webhooks.
    let status =
        admission_attributes(Operation::Update, Subresource::Status, "leaving", "web", jane(), update_options());
    let mut ps = podset();
    c.admit(&status, Some(&mut ps), Some(&podset()), &mut Outcome::default()).await.unwrap();
    assert_eq!(s.received("/label")[0].review["request"]["subResource"], "status");
}

#[tokio::test]
async fn the_scale_subresource_is_reviewed_as_an_autoscaling_v1_scale() {
    let s = WebhookServer::start(LOCALHOST).await;
    let only_scale = json!({"rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["podsets/scale"], "operations": ["UPDATE"]}]});
    let c = chain(vec![], vec![validating("v", vec![hook(&s, "scale.test.io", "/allow", only_scale)])]);
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": 5}});
    let a = admission_attributes(Operation::Update, Subresource::Scale, "default", "web", jane(), update_options());
    c.validate(&a, Some(&scale), Some(&scale), &mut Outcome::default()).await.unwrap();
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    let got = s.received("/allow");
    assert_eq!(got.len(), 1, "the create did not match podsets/scale");
    let req = &got[0].review["request"];
    assert_eq!(req["kind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}));
    assert_eq!((req["subResource"].as_str(), req["requestSubResource"].as_str()), (Some("scale"), Some("scale")));
    assert_eq!(req["resource"]["resource"], "podsets");
}

#[tokio::test]
async fn webhooks_are_called_with_the_kubeconfigs_credentials_over_reused_connections() {
    let s = WebhookServer::start(LOCALHOST).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("webhooks.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nusers:\n- name: {}\n  user: {{token: secret-token}}\n", s.addr),
    )
    .unwrap();
    let clients = WebhookPluginConfig {
        validating: WebhookClients::from_kubeconfig(&kubeconfig).unwrap(),
        mutating: WebhookClients::anonymous(),
        ..Default::default()
    };
    let c = chain_with(vec![], vec![validating("v", vec![hook(&s, "auth.test.io", "/allow", json!({}))])], clients);
    for _ in 0..5 {
        admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    }
    let got = s.received("/allow");
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|r| r.authorization.as_deref() == Some("Bearer secret-token")));
    assert_eq!(s.connections(), 1, "one connection for five calls");
}

#[tokio::test]
async fn calls_and_refusals_are_counted_under_kube_apiservers_metric_names() {
    use podset_apiserver::admission::metrics::{metrics, AdmissionRejectionLabels};
    let s = WebhookServer::start(LOCALHOST).await;
    let closed = podset_envtest::free_port(); // nothing listens on it
    let down = json!({"clientConfig": {"url": format!("https://127.0.0.1:{closed}/allow")}});
    let c = chain(vec![], vec![validating("m", vec![hook(&s, "metrics-deny.test.io", "/deny", json!({}))])]);
    assert!(admit(&c, &create("default"), &mut podset()).await.0.is_err());
    let c = chain(vec![mutating("m", vec![hook(&s, "metrics-down.test.io", "/allow", down)])], vec![]);
    assert!(admit(&c, &create("default"), &mut podset()).await.0.is_err());

    let rejections = |name: &str, step: &str, error_type: &str, code: &str| {
        let labels = AdmissionRejectionLabels {
            name: name.into(),
            r#type: step.into(),
            operation: "CREATE".into(),
            error_type: error_type.into(),
            rejection_code: code.into(),
        };
        metrics().webhook_rejections.get_or_create(&labels).get()
    };
    assert_eq!(rejections("metrics-deny.test.io", "validating", "no_error", "403"), 1);
    assert_eq!(rejections("metrics-down.test.io", "admit", "calling_webhook_error", "0"), 1);
    let text = podset_apiserver::metrics::encode();
    assert!(
        text.contains(r#"apiserver_admission_webhook_admission_duration_seconds_count{name="metrics-deny.test.io",type="validating",operation="CREATE",rejected="true"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"apiserver_admission_step_admission_duration_seconds_count{type="validate",operation="CREATE",rejected="true"}"#));
}

/// The Status the server answers an admission error with.
fn status_of(e: &Error) -> Status {
    *ApiError::from(e).status
}

/// A v1beta1 request reaches webhooks whose rules name only v1alpha1 under `matchPolicy: Equivalent` (v1's
/// default), converted to v1alpha1 with `requestKind` and `requestResource` saying what was asked; a mutation
/// comes back converted to v1beta1. `Exact` webhooks are not called.
#[tokio::test]
async fn an_equivalent_webhook_gets_the_request_in_the_version_its_rules_name() {
    let s = WebhookServer::start(LOCALHOST).await;
    let mut a = create("default");
    a.kind.version = "v1beta1".into();
    a.resource.version = "v1beta1".into();
    let exact = hook(&s, "exact.test.io", "/allow", json!({"matchPolicy": "Exact"}));
    let c = chain(
        vec![mutating("label", vec![hook(&s, "label.test.io", "/label", json!({}))])],
        vec![validating("check", vec![exact])],
    );
    let mut ps = json!({"apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 2, "minReadySeconds": 30, "selector": {"matchLabels": {"app": "web"}}}});
    let (result, _) = admit(&c, &a, &mut ps).await;
    result.unwrap();
    assert!(s.received("/allow").is_empty(), "matchPolicy Exact: not called for v1beta1");

    let got = s.received("/label");
    let req = &got[0].review["request"];
    assert_eq!(req["kind"], json!({"group": "demo.k8s.io", "version": "v1alpha1", "kind": "PodSet"}));
    assert_eq!(req["resource"]["version"], "v1alpha1");
    assert_eq!(req["requestKind"], json!({"group": "demo.k8s.io", "version": "v1beta1", "kind": "PodSet"}));
    assert_eq!(req["requestResource"]["version"], "v1beta1");
    assert_eq!(req["object"]["apiVersion"], "demo.k8s.io/v1alpha1");
    assert_eq!(req["object"]["metadata"]["annotations"]["demo.k8s.io/v1beta1-min-ready-seconds"], "30");
    assert_eq!(req["object"]["spec"].get("minReadySeconds"), None);

    // The patch was to the v1alpha1 object; the request goes on in v1beta1 with it.
    assert_eq!(ps["apiVersion"], "demo.k8s.io/v1beta1");
    assert_eq!(ps["metadata"]["labels"]["mutated"], "yes");
    assert_eq!(ps["spec"]["minReadySeconds"], 30);
    assert!(ps["metadata"].get("annotations").is_none(), "{ps}");
}

fn bob() -> UserInfo {
    UserInfo::named("bob", vec!["system:authenticated".into()])
}

/// `matchConditions`, as k8s.io/apiserver's `ShouldCallHook` weighs them after rules and selectors: a webhook is
/// called only when all hold; a false one excludes it even where another failed; an error excludes it under
/// `failurePolicy: Ignore` and refuses the request (403, no validating webhook called) under `Fail`. Mutating
/// webhooks' conditions see the object as the webhooks before them left it.
#[tokio::test]
async fn match_conditions_decide_whether_a_webhook_is_called() {
    use podset_apiserver::admission::metrics::{metrics, MatchConditionLabels};
    let s = WebhookServer::start(LOCALHOST).await;
    let not_jane = json!({"matchConditions": [
        {"name": "not-jane", "expression": "request.userInfo.username != 'jane'"},
        {"name": "two-or-more", "expression": "object.spec.replicas >= 2"},
    ]});
    let c = chain(vec![], vec![validating("cond", vec![hook(&s, "cond.test.io", "/allow", not_jane)])]);
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/allow").len(), 0, "excluded for jane");
    let as_bob = admission_attributes(Operation::Create, Subresource::Main, "default", "web", bob(), update_options());
    admit(&c, &as_bob, &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/allow").len(), 1, "called for bob");
    let exclusions = MatchConditionLabels {
        name: "cond.test.io".into(),
        kind: "webhook".into(),
        r#type: "validate".into(),
        operation: "CREATE".into(),
    };
    assert_eq!(metrics().match_condition_exclusions.get_or_create(&exclusions).get(), 1);

    // A mutating webhook's conditions see what the webhook before it did.
    s.clear();
    let labelled = json!({"matchConditions": [{"name": "labelled", "expression": "has(object.metadata.labels) && object.metadata.labels.mutated == 'yes'"}]});
    let c = chain(
        vec![mutating(
            "m",
            vec![
                hook(&s, "first.test.io", "/allow", labelled.clone()),
                hook(&s, "label.test.io", "/label", json!({})),
                hook(&s, "after.test.io", "/allow", labelled),
            ],
        )],
        vec![],
    );
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/allow").len(), 1, "only the webhook after the labelling one");
    assert_eq!(s.received("/label").len(), 1);

    // An error: Fail refuses before any validating webhook is called, Ignore skips the webhook.
    s.clear();
    let broken = |policy: &str| json!({"failurePolicy": policy, "matchConditions": [{"name": "broken", "expression": "object.spec.nope == 1"}]});
    let c = chain(
        vec![],
        vec![
            validating("a", vec![hook(&s, "plain.test.io", "/allow", json!({}))]),
            validating("b", vec![hook(&s, "broken.test.io", "/allow", broken("Fail"))]),
        ],
    );
    let status = status_of(&admit(&c, &create("default"), &mut podset()).await.0.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "podsets.demo.k8s.io \"web\" is forbidden: expression 'object.spec.nope == 1' resulted in error: no such key: nope"
    );
    assert_eq!(s.received("/allow").len(), 0, "no validating webhook is called");
    let c = chain(vec![], vec![validating("b", vec![hook(&s, "broken.test.io", "/deny", broken("Ignore"))])]);
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/deny").len(), 0);
    let errors = MatchConditionLabels {
        name: "broken.test.io".into(),
        kind: "webhook".into(),
        r#type: "validating".into(),
        operation: "CREATE".into(),
    };
    assert_eq!(metrics().match_condition_errors.get_or_create(&errors).get(), 2);

    // Without an authorizer to ask, a check errs (and says so) rather than allowing.
    let asks = json!({"matchConditions": [{"name": "asks", "expression": "authorizer.requestResource.check('create').errored() && !authorizer.requestResource.check('create').allowed()"}]});
    let c = chain(vec![], vec![validating("authz", vec![hook(&s, "asks.test.io", "/allow", asks)])]);
    admit(&c, &create("default"), &mut podset()).await.0.unwrap();
    assert_eq!(s.received("/allow").len(), 1);
}

/// A webhook from `staticManifestsDir` is called before the cluster's, with its match conditions, and a
/// manifest that breaks the manifest rules is refused with the file and the reason.
#[tokio::test]
async fn manifest_webhooks_are_called_with_their_match_conditions() {
    use podset_apiserver::admission::webhook::manifests;
    use podset_apiserver::admission::StaticWebhooks;
    let s = WebhookServer::start(LOCALHOST).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = hook(
        &s,
        "static-deny.test.io",
        "/deny",
        json!({"matchConditions": [
        {"name": "not-bob", "expression": "request.userInfo.username != 'bob'"}]}),
    );
    h["clientConfig"]["caBundle"] =
        json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &s.ca_pem));
    let config = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "deny.static.k8s.io"}, "webhooks": [h]});
    std::fs::write(dir.path().join("deny.json"), config.to_string()).unwrap();
    let statics = StaticWebhooks::default();
    let stop = tokio_util::sync::CancellationToken::new();
    manifests::start((None, Some(dir.path().to_owned())), &statics, "test", &stop).unwrap();
    let configurations = WebhookConfigurations::fixed(&[], &[]).with_statics(statics);
    let sources = Sources {
        namespaces: namespaces(),
        configurations: Some(configurations),
        quotas: None,
        policies: None,
        mutating_policies: None,
    };
    let c = recommended().with_sources(sources, PluginConfig::default()).unwrap();
    let (result, out) = admit(&c, &create("default"), &mut podset()).await;
    let status = status_of(&result.unwrap_err());
    assert_eq!(status.message, "admission webhook \"static-deny.test.io\" denied the request: no PodSets here");
    assert_eq!(out.audit_annotations["source.admission.k8s.io/manifest-webhooks"], "static-deny.test.io");
    let as_bob = admission_attributes(Operation::Create, Subresource::Main, "default", "web", bob(), update_options());
    let (result, out) = admit(&c, &as_bob, &mut podset()).await;
    result.unwrap();
    assert!(!out.audit_annotations.contains_key("source.admission.k8s.io/manifest-webhooks"), "not called for bob");
    assert_eq!(s.received("/deny").len(), 1, "called for jane, not for bob");
    stop.cancel();

    let refused = |config: Value| {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("w.json"), config.to_string()).unwrap();
        manifests::load_validating(d.path()).map(|_| ()).unwrap_err()
    };
    let mut by_service = config.clone();
    by_service["webhooks"][0]["clientConfig"] = json!({"service": {"namespace": "x", "name": "y"}});
    assert!(refused(by_service).contains("clientConfig.service is not supported for static manifests"));
    let mut plain_name = config.clone();
    plain_name["metadata"]["name"] = json!("deny");
    assert!(refused(plain_name).contains("must have a name ending with \".static.k8s.io\""));
    let mut bad_condition = config;
    bad_condition["webhooks"][0]["matchConditions"][0]["expression"] = json!("params.x");
    assert!(refused(bad_condition).contains("undeclared reference to 'params'"));
}
