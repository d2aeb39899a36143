use super::*;
use http::Method;

use crate::apiserver::request::RequestInfo;

fn attrs(method: Method, path: &str) -> Attributes {
    let (path, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
    RequestInfo::new(&method, path, query, &crate::apiserver::routes::testing::routes()).attributes
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo::named(name, groups.iter().map(|g| g.to_string()).collect())
}

const PS: &str = "/apis/demo.k8s.io/v1beta1/namespaces/shop/podsets";

/// The level `policy` gives a request.
fn level(policy: &Policy, u: Option<&UserInfo>, method: Method, path: &str) -> Level {
    policy.evaluate(u, &attrs(method, path)).level
}

#[test]
fn the_first_matching_rule_decides_and_none_matching_means_none() {
    let p = Policy::parse(
        r#"
apiVersion: audit.k8s.io/v1
kind: Policy
metadata: {name: shop}
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:serviceaccount:kube-system:podset-controller"]
  verbs: ["update", "patch"]
  resources:
  - group: demo.k8s.io
    resources: ["podsets/status"]
- level: RequestResponse
  resources:
  - group: demo.k8s.io
    resources: ["podsets"]
  omitStages: [ResponseStarted]
- level: Request
  userGroups: ["ops"]
  namespaces: ["shop"]
- level: Metadata
  nonResourceURLs: ["/healthz*", "/version"]
"#,
    )
    .unwrap();
    let ctl = user("system:serviceaccount:kube-system:podset-controller", &["system:serviceaccounts"]);
    let bob = user("bob", &["ops", "system:authenticated"]);
    let status = format!("{PS}/web/status");
    assert_eq!(level(&p, Some(&ctl), Method::PUT, &status), Level::None, "the controller's status churn");
    assert_eq!(
        level(&p, Some(&bob), Method::PUT, &status),
        Level::Request,
        "someone else's: podsets/status is not podsets"
    );
    assert_eq!(level(&p, Some(&bob), Method::GET, &status), Level::Request, "not an update: rule 1 is passed over");
    assert_eq!(level(&p, Some(&ctl), Method::GET, &status), Level::None, "and no later rule is for them");
    assert_eq!(level(&p, Some(&ctl), Method::PUT, &format!("{PS}/web")), Level::RequestResponse);
    assert_eq!(level(&p, Some(&bob), Method::GET, &format!("{PS}/web/scale")), Level::Request);
    assert_eq!(level(&p, Some(&ctl), Method::GET, &format!("{PS}/web/scale")), Level::None, "no rule matches");
    assert_eq!(level(&p, None, Method::GET, "/healthz/ping"), Level::Metadata, "a prefix");
    assert_eq!(level(&p, None, Method::GET, "/version"), Level::Metadata);
    assert_eq!(level(&p, None, Method::GET, "/versions"), Level::None, "no prefix without the '*'");
    assert_eq!(level(&p, Some(&bob), Method::GET, "/apis"), Level::None, "namespaces only match resource requests");

    let rr = p.evaluate(Some(&bob), &attrs(Method::POST, PS));
    assert!(rr.omit_stages.contains(Stage::RequestReceived) && rr.omit_stages.contains(Stage::ResponseStarted));
    assert!(!rr.omit_stages.contains(Stage::ResponseComplete));
    let none = p.evaluate(Some(&ctl), &attrs(Method::GET, "/apis"));
    assert_eq!(none.level, Level::None);
    assert!(none.omit_stages.contains(Stage::RequestReceived) && !none.omit_stages.contains(Stage::ResponseStarted));
}

#[test]
fn resources_match_as_kube_matches_them() {
    let rule = |resources: &str| {
        Policy::parse(&format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  resources: [{resources}]\n"
        ))
        .unwrap()
    };
    let cases = [
        // (resources, method, path, matches)
        (r#"{group: demo.k8s.io}"#, Method::GET, format!("{PS}/a/status"), true),
        (r#"{group: ""}"#, Method::GET, format!("{PS}/a"), false),
        (r#"{group: demo.k8s.io, resources: ["*"]}"#, Method::GET, format!("{PS}/a/scale"), true),
        (r#"{group: demo.k8s.io, resources: ["*/scale"]}"#, Method::GET, format!("{PS}/a/scale"), true),
        (r#"{group: demo.k8s.io, resources: ["*/scale"]}"#, Method::GET, format!("{PS}/a"), false),
        (r#"{group: demo.k8s.io, resources: ["podsets/*"]}"#, Method::GET, format!("{PS}/a/status"), true),
        (r#"{group: demo.k8s.io, resources: ["podsets/*"]}"#, Method::GET, format!("{PS}/a"), true),
        (r#"{group: demo.k8s.io, resources: ["podsets"]}"#, Method::GET, format!("{PS}/a/status"), false),
        (r#"{group: demo.k8s.io, resources: ["podsets"], resourceNames: ["a"]}"#, Method::GET, format!("{PS}/a"), true),
        (
            r#"{group: demo.k8s.io, resources: ["podsets"], resourceNames: ["a"]}"#,
            Method::GET,
            format!("{PS}/b"),
            false,
        ),
        (r#"{group: demo.k8s.io, resources: ["podsets"], resourceNames: ["a"]}"#, Method::GET, PS.to_owned(), false),
        (r#"{group: demo.k8s.io, resources: ["podsets"]}"#, Method::GET, "/version".to_owned(), false),
    ];
    for (resources, method, path, want) in cases {
        let got = level(&rule(resources), Some(&user("u", &[])), method.clone(), &path) == Level::Metadata;
        assert_eq!(got, want, "{resources} on {method} {path}");
    }
    let cluster =
        Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  namespaces: [\"\"]\n")
            .unwrap();
    assert_eq!(level(&cluster, None, Method::GET, "/apis/demo.k8s.io/v1beta1/podsets"), Level::Metadata);
    assert_eq!(level(&cluster, None, Method::GET, PS), Level::None);
}

#[test]
fn omit_managed_fields_is_the_rules_else_the_policys() {
    let p = Policy::parse(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitManagedFields: true\nrules:\n- level: Request\n  verbs: [create]\n  omitManagedFields: false\n- level: Request\n",
    )
    .unwrap();
    assert!(!p.evaluate(None, &attrs(Method::POST, PS)).omit_managed_fields);
    assert!(p.evaluate(None, &attrs(Method::GET, PS)).omit_managed_fields);
}

#[test]
fn a_bad_policy_is_refused_with_its_line_and_reason() {
    let cases = [
        ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n- level: Everything\n", Some(5), "unknown variant `Everything`"),
        ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  omitStages: [Done]\n", Some(5), "unknown variant `Done`"),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n\n- level: Metadata\n  resources: [{group: demo.k8s.io}]\n  nonResourceURLs: [/healthz]\n",
            Some(6),
            "rules[1].nonResourceURLs: Invalid value: [\"/healthz\"]: rules cannot apply to both regular resources and non-resource URLs",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n    nonResourceURLs: [healthz]\n",
            Some(4),
            "rules[0].nonResourceURLs[0]: Invalid value: \"healthz\": non-resource URL rules must begin with a '/' character",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}, {level: Metadata, nonResourceURLs: [\"/a*/b\"]}]\n",
            Some(3),
            "rules[1].nonResourceURLs[0]: Invalid value: \"/a*/b\": non-resource URL wildcards '*' must be the final character of the rule",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n- level: Metadata\n  resources: [{group: Demo.k8s.io}]\n",
            Some(5),
            "rules[1].resources[0].group: Invalid value: \"Demo.k8s.io\"",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  resources: [{group: demo.k8s.io, resourceNames: [a]}]\n",
            Some(4),
            "using resourceNames requires at least one resource",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  nonResourceURLs: [\"/*é\"]\n",
            Some(4),
            "non-resource URL wildcards '*' must be the final character of the rule",
        ),
        ("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []\n", None, "loaded illegal policy with 0 rules"),
        ("apiVersion: audit.k8s.io/v1beta2\nkind: Policy\nrules:\n- level: None\n", None, "expected apiVersion audit.k8s.io/v1"),
        ("rules: [\n", Some(2), "did not find expected"),
    ];
    for (text, line, reason) in cases {
        let (got_line, got) = Policy::parse(text).expect_err(text);
        assert!(got.contains(reason), "{text}\n=> {got}");
        assert_eq!(got_line, line, "{text}\n=> {got}");
    }
}

#[test]
fn unknown_fields_are_ignored_as_kube_ignores_them() {
    let p = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Request\n  userGroup: [ops]\n")
        .unwrap();
    assert_eq!(level(&p, None, Method::GET, PS), Level::Request, "the rule without its unknown field matches all");
}

#[test]
fn a_missing_file_is_named() {
    let e = Policy::load(Path::new("/nonexistent/policy.yaml")).unwrap_err();
    assert!(e.to_string().starts_with("/nonexistent/policy.yaml: failed to read the audit policy"), "{e}");
}
