//! Delegated authentication and authorization against the real control plane: through kube-apiserver's aggregator,
//! and straight at our Service address, where our own checks are all that stand.

mod common;

use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use http::Request;
use podset_envtest::Credential;
use serde_json::Value;

/// (status, body as JSON or Null) of a request with extra headers.
async fn call(client: &kube::Client, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, _, body) = common::raw(client, req.body(vec![]).unwrap()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A new CA (PEM) and a `front-proxy-client` certificate it signed (PEM certificate, key).
fn proxy_cert_from_new_ca(name: &str) -> (String, (String, String)) {
    let (ca, key, params) = podset_apiserver::apiserver::tls::make_ca(name).unwrap();
    let issuer = rcgen::Issuer::new(params, &key);
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name.push(rcgen::DnType::CommonName, "front-proxy-client");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    (ca, (p.signed_by(&leaf_key, &issuer).unwrap().pem(), leaf_key.serialize_pem()))
}

const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";

fn as_user(name: &str) -> Vec<(&str, &str)> {
    vec![("X-Remote-User", name), ("X-Remote-Group", "system:authenticated")]
}

#[test]
fn delegated_authentication_and_authorization() {
    in_namespace("delegated_authentication_and_authorization", || {
        let mut c = common::cluster::start();
        runtime().block_on(async {
            // Through the aggregator: the admin may, bob may not until a RoleBinding grants view.
            c.apply_text("web.yaml", &serde_json::to_string(&common::podset("web", 0)).unwrap());
            assert!(c.kubectl(&["get", "ps"]).contains("web"));
            let denied = c.kubectl_try(&["--as=bob", "get", "ps"]).unwrap_err();
            assert!(denied.contains("Forbidden") || denied.contains("forbidden"), "{denied}");

            // Straight at us, the front proxy's certificate naming bob: our SubjectAccessReview says no.
            let proxy = c.client_cert("front-proxy-ca", "front-proxy-client", None);
            let via_proxy = c.podset_client(Credential::Cert(&proxy));
            let (code, body) = call(&via_proxy, "GET", PODSETS, &as_user("bob")).await;
            assert_eq!(code, 403, "{body}");
            assert_eq!(body["reason"], "Forbidden");
            assert_eq!(
                body["message"],
                r#"podsets.demo.k8s.io is forbidden: User "bob" cannot list resource "podsets" in API group "demo.k8s.io" in the namespace "default""#
            );
            assert_eq!(body["details"]["kind"], "podsets");

            c.kubectl(&["create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", "default"]);
            // `view` holds podsets through the aggregation label of deploy/base/rbac.yaml's podsets-view.
            wait(
                Duration::from_secs(90),
                || async { c.kubectl_try(&["--as=bob", "get", "ps"]).is_ok_and(|o| o.contains("web")) },
                "bob to be allowed to list through the aggregator",
            )
            .await;
            let no_delete = c.kubectl_try(&["--as=bob", "delete", "ps", "web"]).unwrap_err();
            assert!(no_delete.contains("forbidden"), "{no_delete}");
            wait(
                Duration::from_secs(30),
                || async { call(&via_proxy, "GET", PODSETS, &as_user("bob")).await.0 == 200 },
                "bob to be allowed directly once the denial's cache entry expires",
            )
            .await;
            let (code, body) = call(&via_proxy, "DELETE", &format!("{PODSETS}/web"), &as_user("bob")).await;
            assert_eq!(code, 403, "{body}");
            assert_eq!(
                body["message"],
                r#"podsets.demo.k8s.io "web" is forbidden: User "bob" cannot delete resource "podsets" in API group "demo.k8s.io" in the namespace "default""#
            );
            assert_eq!(body["details"]["name"], "web");
            assert!(c.kubectl(&["get", "ps", "web"]).contains("web"), "the denied delete deleted");

            // /metrics is a non-resource URL: bob may read it once bound to deploy/metrics-reader.yaml's ClusterRole.
            let (code, body) = call(&via_proxy, "GET", "/metrics", &as_user("bob")).await;
            assert_eq!(code, 403, "{body}");
            assert_eq!(body["message"], r#"forbidden: User "bob" cannot get path "/metrics""#);
            c.apply_text("metrics-reader.yaml", include_str!("../deploy/metrics-reader.yaml"));
            c.kubectl(&[
                "create",
                "clusterrolebinding",
                "bob-metrics",
                "--clusterrole=podset-apiserver-metrics-reader",
                "--user=bob",
            ]);
            wait(
                Duration::from_secs(30),
                || async { call(&via_proxy, "GET", "/metrics", &as_user("bob")).await.0 == 200 },
                "bob to read /metrics once bound to the metrics-reader ClusterRole",
            )
            .await;

            // A ServiceAccount token, used directly: TokenReview, then SubjectAccessReview.
            c.kubectl(&["create", "serviceaccount", "reader", "-n", "default"]);
            c.kubectl(&["create", "rolebinding", "reader", "--clusterrole=podsets-view", "--serviceaccount=default:reader"]);
            let token = c.kubectl(&["create", "token", "reader", "-n", "default"]).trim().to_owned();
            let sa = c.podset_client(Credential::Token(&token));
            wait(
                Duration::from_secs(30),
                || async { call(&sa, "GET", PODSETS, &[]).await.0 == 200 },
                "the ServiceAccount to list PodSets",
            )
            .await;
            let (code, body) = call(&sa, "DELETE", &format!("{PODSETS}/web"), &[]).await;
            assert_eq!(code, 403, "{body}");
            assert!(
                body["message"].as_str().unwrap().contains(r#"User "system:serviceaccount:default:reader" cannot delete"#),
                "{body}"
            );
            let (code, body) = call(&c.podset_client(Credential::Token("garbage")), "GET", PODSETS, &[]).await;
            assert_eq!((code, body["reason"].as_str()), (401, Some("Unauthorized")), "{body}");

            // A client certificate from the cluster CA: CN is the user, O the group RBAC binds.
            c.kubectl(&["create", "clusterrolebinding", "editors", "--clusterrole=podsets-edit", "--group=podset-editors"]);
            let carol = c.client_cert("ca", "carol", Some("podset-editors"));
            let (code, body) = call(&c.podset_client(Credential::Cert(&carol)), "DELETE", &format!("{PODSETS}/web"), &[]).await;
            assert_eq!(code, 200, "{body}");
            // Impersonation is kube-apiserver's to do; straight at us it is refused, not silently ignored.
            let (code, body) =
                call(&c.podset_client(Credential::Cert(&carol)), "GET", PODSETS, &[("Impersonate-User", "bob")]).await;
            assert_eq!(code, 403, "{body}");
            let dave = c.client_cert("ca", "dave", None);
            let (code, body) = call(&c.podset_client(Credential::Cert(&dave)), "GET", PODSETS, &[]).await;
            assert_eq!(code, 403, "{body}");
            assert!(body["message"].as_str().unwrap().contains(r#"User "dave""#), "{body}");

            // Forged identity: headers without a certificate, or with one from a CA we do not trust, count for
            // nothing; an anonymous caller gets 401 for the API and may still read /healthz.
            let admin = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")];
            let (code, _) = call(&c.podset_client(Credential::None), "GET", PODSETS, &admin).await;
            assert_eq!(code, 401);
            let (_, evil) = proxy_cert_from_new_ca("evil-ca");
            let (code, _) = call(&c.podset_client(Credential::Cert(&evil)), "GET", PODSETS, &admin).await;
            assert_eq!(code, 401);
            let (code, _) = call(&c.podset_client(Credential::None), "GET", "/healthz", &[]).await;
            assert_eq!(code, 200);

            // The allowed names come from kube-system/extension-apiserver-authentication and are followed live.
            let other = c.client_cert("front-proxy-ca", "other-proxy", None);
            let via_other = c.podset_client(Credential::Cert(&other));
            assert_eq!(call(&via_other, "GET", PODSETS, &admin).await.0, 401, "a CN that is not allowed");
            let names = r#"["front-proxy-client","other-proxy"]"#;
            let patch = serde_json::json!({"data": {"requestheader-allowed-names": names}}).to_string();
            c.kubectl(&["-n", "kube-system", "patch", "configmap", "extension-apiserver-authentication", "--type=merge", "-p", &patch]);
            wait(
                Duration::from_secs(30),
                || async { call(&via_other, "GET", PODSETS, &admin).await.0 == 200 },
                "the new allowed name to take effect without a restart",
            )
            .await;

            // So is a CA rotation: a proxy certificate from a new CA counts once the bundle holds that CA.
            let (new_ca, rotated) = proxy_cert_from_new_ca("front-proxy-ca-2");
            let via_rotated = c.podset_client(Credential::Cert(&rotated));
            assert_eq!(call(&via_rotated, "GET", PODSETS, &admin).await.0, 401, "a CA not yet in the bundle");
            let bundle = c.kubectl(&[
                "-n",
                "kube-system",
                "get",
                "configmap",
                "extension-apiserver-authentication",
                "-o",
                "jsonpath={.data.requestheader-client-ca-file}",
            ]);
            let patch = serde_json::json!({"data": {"requestheader-client-ca-file": format!("{bundle}\n{new_ca}")}});
            let patch_file = c.dir.path().join("rotate.json");
            std::fs::write(&patch_file, patch.to_string()).unwrap();
            c.kubectl(&[
                "-n",
                "kube-system",
                "patch",
                "configmap",
                "extension-apiserver-authentication",
                "--type=merge",
                "--patch-file",
                patch_file.to_str().unwrap(),
            ]);
            wait(
                Duration::from_secs(30),
                || async { call(&via_rotated, "GET", PODSETS, &admin).await.0 == 200 },
                "the rotated CA to take effect without a restart",
            )
            .await;

            // With the main API server gone, nothing new is allowed: 500 for a SubjectAccessReview, 503 for a
            // TokenReview.
            c.stop_apiserver();
            let (code, body) = call(&via_proxy, "GET", PODSETS, &as_user("zed-not-cached")).await;
            assert_eq!((code, body["reason"].as_str()), (500, Some("InternalError")), "{body}");
            // (kube's client would retry a 503 for minutes: one plain request shows the answer.)
            let req = Request::get(PODSETS).header("Authorization", "Bearer never-seen").body(vec![]).unwrap();
            let (code, body) = common::request_once(c.podset_addr, &c.podset_ca(), req).await;
            let body = common::json(&body);
            assert_eq!((code, body["reason"].as_str()), (503, Some("ServiceUnavailable")), "{body}");
        });
    });
}
