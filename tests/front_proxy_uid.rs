//! The front proxy's user UID, as kube-apiserver 1.33+ sends it (`X-Remote-Uid`, with the aggregator's own
//! `front-proxy-client` certificate) to a server run with `--requestheader-uid-headers=X-Remote-Uid`: the UID
//! reaches the AdmissionReview a webhook gets and the audit log, and the request is authorized for the user by a
//! SubjectAccessReview carrying it (the review's body is checked in `auth::authz`'s unit tests; kube-apiserver
//! 1.20's RBAC answers by name). kube-apiserver 1.20 sends no UID, so the test sends exactly what 1.33 does.

mod common;
#[path = "common/webhook.rs"]
mod webhook;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use http::Request;
use podset_envtest::Credential;
use serde_json::{json, Value};
use webhook::WebhookServer;

const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
const UID: &str = "5f0c1e6a-93b4-4c55-a3f1-2b0d9c7e4a10";

async fn post(client: &kube::Client, body: &Value, headers: &[(&str, &str)], dry_run: bool) -> (u16, Value) {
    let uri = if dry_run { format!("{PODSETS}?dryRun=All") } else { PODSETS.to_owned() };
    let mut req = Request::post(uri).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (code, _, bytes) = common::raw(client, req.body(body.to_string().into_bytes()).unwrap()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[test]
fn the_front_proxys_uid_reaches_webhooks_and_the_audit_log() {
    in_namespace("the_front_proxys_uid_reaches_webhooks_and_the_audit_log", || {
        let mut c = common::cluster::start();
        let (audit_flags, audit) = common::audit_flags(c.dir.path(), common::AUDIT_METADATA);
        let mut flags: Vec<String> = vec![
            format!("--requestheader-client-ca-file={}", c.pki_file("front-proxy-ca.crt").display()),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-uid-headers=X-Remote-Uid".into(),
        ];
        flags.extend(audit_flags);
        c.restart_podset_apiserver_with(&flags);
        runtime().block_on(async {
            c.kubectl(&["create", "clusterrolebinding", "alice-edit", "--clusterrole=podsets-edit", "--user=alice"]);
            let hook = WebhookServer::start(podset_envtest::NODE_IP.parse().unwrap()).await;
            let config = json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "uid-test"},
                "webhooks": [{"name": "uid.test.io", "clientConfig": {"url": hook.url("/allow"),
                    "caBundle": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &hook.ca_pem)},
                    "rules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"], "resources": ["podsets"]}],
                    "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"]}],
            });
            c.apply_text("uid-webhook.json", &config.to_string());

            // What kube-apiserver 1.33's aggregator sends us for alice.
            let proxy = c.podset_client(Credential::Cert(&c.front_proxy_cert()));
            let alice = [("X-Remote-User", "alice"), ("X-Remote-Uid", UID), ("X-Remote-Group", "system:authenticated")];
            let probe = common::podset("probe", 0);
            wait(
                Duration::from_secs(60),
                || async { post(&proxy, &probe, &alice, true).await.0 == 201 && !hook.received("/allow").is_empty() },
                "alice to be allowed and the webhook to be called",
            )
            .await;
            hook.clear();
            let (code, body) = post(&proxy, &common::podset("by-alice", 0), &alice, false).await;
            assert_eq!(code, 201, "{body}");
            let reviews = hook.received("/allow");
            assert_eq!(reviews.len(), 1);
            let user = &reviews[0].review["request"]["userInfo"];
            assert_eq!((user["username"].as_str(), user["uid"].as_str()), (Some("alice"), Some(UID)), "{user}");

            // Without a UID header the user has none; a UID without the proxy's certificate counts for nothing.
            hook.clear();
            let no_uid = [("X-Remote-User", "alice"), ("X-Remote-Group", "system:authenticated")];
            assert_eq!(post(&proxy, &common::podset("no-uid", 0), &no_uid, false).await.0, 201);
            assert_eq!(hook.received("/allow")[0].review["request"]["userInfo"].get("uid"), None);
            let (code, _) = post(&c.podset_client(Credential::None), &common::podset("forged", 0), &alice, false).await;
            assert_eq!(code, 401);

            // Both of alice's creates are audited, the first with her UID, the second without one.
            let creates = || -> Vec<Value> {
                std::fs::read_to_string(&audit)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|e| {
                        e["verb"] == "create"
                            && e["stage"] == "ResponseComplete"
                            && e["requestURI"] == PODSETS
                            && e["user"]["username"] == "alice"
                    })
                    .collect()
            };
            wait(Duration::from_secs(10), || std::future::ready(creates().len() == 2), "alice's creates audited").await;
            let events = creates();
            assert_eq!(events[0]["user"]["uid"], UID, "{}", events[0]);
            assert_eq!(events[0]["responseStatus"]["code"], 201);
            assert!(events[1]["user"].get("uid").is_none_or(|u| u == ""), "{}", events[1]);
        });
    });
}
