//! `deploy/monitoring`'s alert rules and dashboard ask only for metrics the server exports: every metric their
//! expressions name is in a scrape of a running server on the real control plane (after a create, the
//! controller's work, a TokenReview and a SubjectAccessReview), or, for the ones that appear only once their event happens (an
//! audit write that failed, a webhook's rejection), registered by the server under that name.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::{in_namespace, runtime, wait};
use http::Request;
use podset_envtest::Credential;

/// The metric names an expression uses: identifiers followed by `{`, `[` or `)`/space that look like a metric.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut word = String::new();
    let mut in_braces = 0;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        // A word outside label matchers, before this character is counted.
        let prefixes = ["apiserver_", "podset_", "workqueue_", "leader_election_", "authentication_", "process_"];
        if in_braces == 0 && prefixes.iter().any(|p| word.starts_with(p)) {
            out.insert(std::mem::take(&mut word));
        }
        word.clear();
        match c {
            '{' => in_braces += 1,
            '}' => in_braces -= 1,
            _ => {}
        }
    }
    out
}

fn referenced() -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring");
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("alerts.yaml")).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    // A PrometheusRule (deploy/components/monitoring applies it): the rule file is its spec.
    for group in alerts["spec"]["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            names.extend(metrics_in(rule["expr"].as_str().unwrap()));
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("dashboard.json")).unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            names.extend(metrics_in(target["expr"].as_str().unwrap()));
        }
    }
    names
}

/// The names a metric may be registered or listed under: itself, or without a sample suffix.
fn families(name: &str) -> Vec<String> {
    let mut out = vec![name.to_owned()];
    for suffix in ["_total", "_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            out.push(base.to_owned());
        }
    }
    out
}

#[test]
fn the_extracted_names_are_the_metrics() {
    let names = metrics_in(
        r#"sum by (le) (rate(apiserver_request_duration_seconds_bucket{job="x",verb!~"WATCH"}[5m])) / podset_storage_data_bytes"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["apiserver_request_duration_seconds_bucket", "podset_storage_data_bytes"]
    );
    assert!(referenced().len() > 15, "{:?}", referenced());
}

#[test]
fn alerts_and_dashboard_name_only_metrics_the_server_exports() {
    in_namespace("alerts_and_dashboard_name_only_metrics_the_server_exports", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            // A create, the controller's work on it, and a user that needs a SubjectAccessReview.
            c.apply_text("web.yaml", &serde_json::to_string(&common::podset("web", 1)).unwrap());
            c.kubectl_try(&["--as=bob", "get", "podsets"]).unwrap_err();
            c.kubectl(&["create", "serviceaccount", "reader", "-n", "default"]);
            let token = c.kubectl(&["create", "token", "reader", "-n", "default"]).trim().to_owned();
            let sa = c.podset_client(Credential::Token(&token));
            common::raw(&sa, Request::get("/apis/demo.k8s.io/v1alpha1/podsets").body(vec![]).unwrap()).await;
            let admin = c.client_cert("ca", "admin", Some("system:masters"));
            let direct = c.podset_client(Credential::Cert(&admin));
            let scrape_once = || {
                let direct = direct.clone();
                async move {
                    let (_, _, body) = common::raw(&direct, Request::get("/metrics").body(vec![]).unwrap()).await;
                    String::from_utf8_lossy(&body).into_owned()
                }
            };
            wait(
                Duration::from_secs(60),
                || async {
                    let text = scrape_once().await;
                    [
                        "workqueue_adds_total",
                        "apiserver_delegated_authz_request_total",
                        "apiserver_delegated_authn_request_total",
                    ]
                    .iter()
                    .all(|m| text.contains(m))
                },
                "the controller's and the delegated review's metrics",
            )
            .await;
            let scrape = scrape_once().await;
            let exported: BTreeSet<String> = scrape
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split(['{', ' ']).next())
                .map(str::to_owned)
                .collect();
            let source: String = ["src/admission/metrics.rs", "src/apiserver/audit/metrics.rs"]
                .iter()
                .map(|f| {
                    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(f))
                        .unwrap_or_default()
                })
                .collect();
            let mut missing = Vec::new();
            for name in referenced() {
                if exported.contains(&name) {
                    continue;
                }
                // Only once their event happens: registered under that name.
                let registered = families(&name).iter().any(|f| source.contains(&format!("\"{f}\"")));
                let event_only = ["apiserver_audit_error", "apiserver_admission_webhook_rejection_count"];
                if !(registered && event_only.iter().any(|e| name.starts_with(e))) {
                    missing.push(name);
                }
            }
            assert!(missing.is_empty(), "named by deploy/monitoring but not exported: {missing:?}\n{scrape}");
        });
    });
}
