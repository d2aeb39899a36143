use super::options::{field_manager_errors, prefix_from_user_agent};
use super::*;
use crate::api::resource::VersionIndex;
use crate::api::validation::ErrorType;
use crate::api::Version;
use crate::apiserver::routes::{testing, Resolved};
use crate::registry::FieldValidation;
use crate::resources::podset::INFO;

fn res(ns: Option<&str>, name: Option<&str>, sub: Subresource, verb: Verb) -> Target {
    Target::Resource(ResourceRequest {
        resolved: Resolved { route: 0, resource: &INFO, version: Version::V1alpha1.into() },
        namespace: ns.map(Into::into),
        name: name.map(Into::into),
        subresource: sub,
        verb: Some(verb),
    })
}

fn target(method: Method, path: &str, query: Option<&str>) -> ApiResult<Target> {
    RequestInfo::new(&method, path, query, &testing::routes()).target
}

#[test]
fn parses_paths() {
    let p = |s| target(Method::GET, s, None).unwrap();
    assert_eq!(p("/apis"), Target::Apis);
    assert_eq!(p("/apis/demo.k8s.io/"), Target::Group("demo.k8s.io"));
    assert_eq!(p("/apis/demo.k8s.io/v1alpha1"), Target::GroupVersion("demo.k8s.io", "v1alpha1"));
    assert_eq!(p("/apis/demo.k8s.io/v1beta1"), Target::GroupVersion("demo.k8s.io", "v1beta1"));
    assert_eq!(p("/apis/demo.k8s.io/v1"), Target::Unknown);
    assert_eq!(p("/openapi/v3/apis/demo.k8s.io/v1beta1"), Target::OpenApiV3GroupVersion("demo.k8s.io", "v1beta1"));
    assert_eq!(p("/apis/demo.k8s.io/v1alpha1/podsets"), res(None, None, Subresource::Main, Verb::List));
    assert_eq!(
        p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets"),
        res(Some("ns"), None, Subresource::Main, Verb::List)
    );
    assert_eq!(
        p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a"),
        res(Some("ns"), Some("a"), Subresource::Main, Verb::Get)
    );
    assert_eq!(
        p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a/scale"),
        res(Some("ns"), Some("a"), Subresource::Scale, Verb::Get)
    );
    for unknown in [
        "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a/exec",
        "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a/status/x",
        "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets//status",
        "/apis/demo.k8s.io/v1alpha1/namespaces/ns",
        "/apis/demo.k8s.io/v1alpha1/foos",
        "/apis/demo.k8s.io/v1alpha1/podsets/a",
        "/apis/demo.k8s.io/v1alpha1/watch",
        "/apis/demo.k8s.io/v1alpha1/proxy/namespaces/ns/podsets/a",
        "/apis/other.k8s.io/v1alpha1/namespaces/ns/podsets",
        "/apis/demo.k8s.io/v1/namespaces/ns/podsets",
        "/api/v1/pods",
    ] {
        assert_eq!(p(unknown), Target::Unknown, "{unknown}");
    }
    assert!(target(Method::GET, "/apis/demo.k8s.io/v1alpha1/namespaces/Bad_NS/podsets", None).is_err());
}

#[test]
fn the_verb_served_is_the_verb_authorized() {
    const NS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets";
    let cases = [
        (Method::GET, NS.to_owned(), Some("watch=true"), Some(Verb::Watch)),
        (Method::GET, format!("{NS}/a"), Some("watch=true"), Some(Verb::Get)),
        (Method::GET, "/apis/demo.k8s.io/v1alpha1/watch/namespaces/ns/podsets".into(), None, Some(Verb::Watch)),
        (Method::HEAD, NS.to_owned(), None, Some(Verb::List)),
        (Method::POST, NS.to_owned(), None, Some(Verb::Create)),
        (Method::POST, format!("{NS}/a"), None, None),
        (Method::PUT, NS.to_owned(), None, None),
        (Method::PATCH, format!("{NS}/a/status"), None, Some(Verb::Patch)),
        (Method::DELETE, NS.to_owned(), None, Some(Verb::DeleteCollection)),
        (Method::DELETE, format!("{NS}/a"), None, Some(Verb::Delete)),
        (Method::OPTIONS, NS.to_owned(), None, None),
    ];
    for (method, path, query, want) in cases {
        let info = RequestInfo::new(&method, &path, query, &testing::routes());
        let Ok(Target::Resource(r)) = &info.target else { panic!("{method} {path}: {:?}", info.target) };
        assert_eq!(r.verb, want, "{method} {path}");
        if let Some(v) = r.verb {
            let name = format!("{v:?}").to_lowercase();
            assert_eq!(info.attributes.verb, name, "{method} {path}: served as authorized");
        }
    }
    for m in [Method::DELETE, Method::POST, Method::PUT, Method::PATCH] {
        let info =
            RequestInfo::new(&m, "/apis/demo.k8s.io/v1alpha1/watch/namespaces/ns/podsets", None, &testing::routes());
        assert!(matches!(info.target, Ok(Target::Resource(ResourceRequest { verb: None, .. }))), "{m} on /watch/");
    }
}

#[test]
fn parses_query_options_and_rejects_bad_ones() {
    let q = Query::parse(Some("watch=1&limit=5&labelSelector=a%3Db&dryRun=All&fieldValidation=Strict")).unwrap();
    assert!(q.watch && q.dry_run);
    assert_eq!(q.limit, Some(5));
    assert_eq!(q.label_selector.as_deref(), Some("a=b"));
    assert_eq!(q.field_validation, FieldValidation::Strict);
    for (raw, watch) in [("watch=false", false), ("watch=0", false), ("watch=FALSE", false), ("watch=", true)] {
        assert_eq!(Query::parse(Some(raw)).unwrap().watch, watch, "{raw}");
    }
    let q = Query::parse(Some("watch=false&watch=true&fieldSelector=metadata.name%3Dweb&fieldSelector=")).unwrap();
    assert!(!q.watch, "the first value counts");
    assert_eq!(q.field_selector.as_deref(), Some("metadata.name=web"));
    for bad in ["limit=x", "dryRun=Some", "fieldValidation=Loose"] {
        assert_eq!(Query::parse(Some(bad)).unwrap_err().code(), 400, "{bad}");
    }
}

#[test]
fn field_managers_are_printable_and_at_most_128_bytes() {
    assert!(field_manager_errors("kubectl-client-side-apply").is_empty());
    assert!(field_manager_errors("équipe 1").is_empty(), "non-ASCII letters and the ASCII space are printable");
    let errors = field_manager_errors("a\tb\u{200B}c\u{A0}");
    let details: Vec<&str> = errors.iter().map(|e| e.detail.as_str()).collect();
    assert_eq!(
        details,
        [
            "invalid character U+0009 (at position 1)",
            "invalid character U+200B (at position 3)",
            "invalid character U+00A0 (at position 7)"
        ]
    );
    assert_eq!(field_manager_errors(&"m".repeat(129))[0].kind, ErrorType::TooLong);
    assert!(field_manager_errors(&"m".repeat(128)).is_empty());
}

#[test]
fn the_user_agent_prefix_names_the_manager() {
    assert_eq!(prefix_from_user_agent("kubectl/v1.37.1 (linux/amd64) kubernetes/abc"), "kubectl");
    assert_eq!(prefix_from_user_agent("tab\there"), "tabhere");
    assert_eq!(prefix_from_user_agent(&"é".repeat(100)).len(), 128, "cut at a character boundary");
    assert_eq!(prefix_from_user_agent(""), "");
}

#[test]
fn a_delete_body_of_null_or_nothing_is_no_options() {
    let q = Query::parse(Some("gracePeriodSeconds=3")).unwrap();
    for body in ["", " \n", "null"] {
        let o = delete_options(&q, body.as_bytes()).unwrap();
        assert_eq!((o.grace_period_seconds, o.propagation_policy), (Some(3), None), "{body:?}");
    }
    let o = delete_options(&q, br#"{"propagationPolicy":"Orphan"}"#).unwrap();
    assert_eq!(o.propagation_policy.as_deref(), Some("Orphan"));
    let e = delete_options(&q, b"[1]").unwrap_err();
    assert_eq!(e.code(), 400);
}

/// A cluster-scoped kind beside PodSets: its paths have no namespace, and it serves only the subresources it has.
#[test]
fn a_cluster_scoped_kind_is_addressed_without_a_namespace() {
    let p = |s| target(Method::GET, s, None).unwrap();
    let widget = |name: Option<&str>, sub, verb| {
        Target::Resource(ResourceRequest {
            resolved: Resolved { route: 1, resource: &crate::api::resource::WIDGETS, version: VersionIndex(0) },
            namespace: None,
            name: name.map(Into::into),
            subresource: sub,
            verb: Some(verb),
        })
    };
    assert_eq!(p("/apis/test.podset.example"), Target::Group("test.podset.example"));
    assert_eq!(p("/apis/test.podset.example/v1"), Target::GroupVersion("test.podset.example", "v1"));
    assert_eq!(p("/apis/test.podset.example/v1alpha1"), Target::Unknown, "not a version of this group");
    assert_eq!(p("/apis/test.podset.example/v1/widgets"), widget(None, Subresource::Main, Verb::List));
    assert_eq!(p("/apis/test.podset.example/v1/widgets/blue"), widget(Some("blue"), Subresource::Main, Verb::Get));
    assert_eq!(
        p("/apis/test.podset.example/v1/widgets/blue/status"),
        widget(Some("blue"), Subresource::Status, Verb::Get)
    );
    for unserved in [
        "/apis/test.podset.example/v1/namespaces/ns/widgets",
        "/apis/test.podset.example/v1/namespaces/ns/widgets/blue",
        "/apis/test.podset.example/v1/widgets/blue/scale",
        "/apis/test.podset.example/v1/podsets",
        "/apis/demo.k8s.io/v1beta1/widgets",
    ] {
        assert_eq!(p(unserved), Target::Unknown, "{unserved}");
    }
    let create = target(Method::POST, "/apis/test.podset.example/v1/widgets", None).unwrap();
    assert_eq!(create, widget(None, Subresource::Main, Verb::Create));
}
