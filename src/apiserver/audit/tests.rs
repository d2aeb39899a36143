use super::*;
use axum::extract::Request;
use http::Method;

fn request(method: Method, uri: &str) -> Request {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("user-agent", "kubectl/v1.37.1")
        .header("x-forwarded-for", "10.0.0.7, 10.0.0.8")
        .body(axum::body::Body::empty())
        .unwrap();
    req.extensions_mut().insert(ConnInfo::new("127.0.0.1:5555".parse().unwrap(), None));
    req.extensions_mut().insert(AuditId("8a2c7a5e-aaaa-4a8e-9d0f-4b1e2f3a4b5c".parse().unwrap()));
    let user = crate::api::UserInfo {
        name: "bob".into(),
        uid: "42".into(),
        groups: vec!["system:authenticated".into()],
        extra: Default::default(),
    };
    req.extensions_mut().insert(Authenticated(Arc::new(user)));
    req
}

fn context(level: Level, omit_managed_fields: bool, req: &mut Request) -> AuditContext {
    let config = RequestAudit { level, omit_stages: Default::default(), omit_managed_fields };
    AuditContext { config, event: Mutex::new(Event::of_request(req, level)) }
}

#[test]
fn an_event_names_who_did_what_to_which_object() {
    let mut req = request(Method::PUT, "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/web/scale?dryRun=All");
    let ev = Event::of_request(&mut req, Level::Metadata);
    let v = serde_json::to_value(&ev).unwrap();
    assert_eq!(v["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(
        (v["kind"].as_str(), v["level"].as_str(), v["stage"].as_str()),
        (Some("Event"), Some("Metadata"), Some("RequestReceived"))
    );
    assert_eq!(v["auditID"], "8a2c7a5e-aaaa-4a8e-9d0f-4b1e2f3a4b5c");
    assert_eq!(v["verb"], "update");
    assert_eq!(v["requestURI"], "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/web/scale?dryRun=All");
    assert_eq!(
        v["objectRef"],
        serde_json::json!({"resource": "podsets", "namespace": "ns", "name": "web", "apiGroup": "demo.k8s.io", "apiVersion": "v1alpha1", "subresource": "scale"})
    );
    assert_eq!(v["user"], serde_json::json!({"username": "bob", "uid": "42", "groups": ["system:authenticated"]}));
    assert_eq!(v["sourceIPs"], serde_json::json!(["10.0.0.7", "10.0.0.8", "127.0.0.1"]));
    assert_eq!(v["userAgent"], "kubectl/v1.37.1");
    let stamp = v["requestReceivedTimestamp"].as_str().unwrap();
    assert!(stamp.ends_with('Z') && stamp.len() == "2026-11-28T12:00:00.123456Z".len(), "{stamp}");
    assert!(v.get("responseStatus").is_none() && v.get("requestObject").is_none());

    let health =
        serde_json::to_value(Event::of_request(&mut request(Method::GET, "/readyz"), Level::Metadata)).unwrap();
    assert_eq!((health["verb"].as_str(), health.get("objectRef")), (Some("get"), None));
}

#[test]
fn the_legacy_line_is_kubes_event_string() {
    let mut req = request(Method::GET, "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets");
    let mut ev = Event::of_request(&mut req, Level::Metadata);
    ev.request_received_timestamp = "2026-11-28T12:00:00.120000Z".parse().unwrap();
    ev.response_status = Some(ResponseStatus::code(200));
    assert_eq!(
        ev.legacy_line(),
        r#"2026-11-28T12:00:00.12Z AUDIT: id="8a2c7a5e-aaaa-4a8e-9d0f-4b1e2f3a4b5c" stage="RequestReceived" ip="10.0.0.7" method="list" user="bob" groups="\"system:authenticated\"" as="<self>" asgroups="<lookup>" user-agent="kubectl/v1.37.1" namespace="ns" uri="/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets" response="200""#
    );
    ev.user = UserInfo::default();
    ev.response_status = None;
    let line = ev.legacy_line();
    assert!(line.contains(r#"user="<none>" groups="<none>""#) && line.ends_with(r#"response="<deferred>""#), "{line}");
}

#[test]
fn the_request_object_completes_the_reference_and_is_kept_from_the_request_level() {
    let uri = "/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets";
    // Audit reads any object: the registry has decoded it before (a Widget here).
    let body = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "web", "uid": "u-1", "resourceVersion": "7", "managedFields": [{"manager": "m"}]}});
    let meta = context(Level::Metadata, false, &mut request(Method::POST, uri));
    meta.log_request_object(&body);
    let ev = meta.event.lock().clone();
    let r = ev.object_ref.unwrap();
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str(), r.uid.as_str(), r.resource_version.as_str()),
        ("ns", "web", "u-1", "7")
    );
    assert!(ev.request_object.is_none(), "Metadata records no object");

    let req_level = context(Level::Request, true, &mut request(Method::POST, uri));
    req_level.log_request_object(&body);
    let obj: Value = serde_json::from_str(req_level.event.lock().request_object.as_ref().unwrap().get()).unwrap();
    assert_eq!(obj["metadata"]["name"], "web");
    assert!(obj["metadata"].get("managedFields").is_none(), "omitManagedFields");

    let patch = context(Level::Request, false, &mut request(Method::PATCH, &format!("{uri}/web")));
    patch.log_request_patch(b"apiVersion: example.com/v1\nkind: Widget\nspec:\n  replicas: 2\n");
    let obj: Value = serde_json::from_str(patch.event.lock().request_object.as_ref().unwrap().get()).unwrap();
    assert_eq!(obj["spec"]["replicas"], 2, "an apply patch's YAML recorded as JSON");
}

#[tokio::test]
async fn the_answer_is_recorded_as_the_level_asks() {
    let uri = "/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets/web";
    let answer = || {
        let mut resp = Response::new(axum::body::Body::from(
            r#"{"kind":"Widget","metadata":{"name":"web","managedFields":[{"manager":"m"}]}}"#,
        ));
        resp.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
        let mut a = BTreeMap::new();
        a.insert("patch.webhook.admission.k8s.io/round_0_index_0".to_owned(), "{}".to_owned());
        a.insert("mutation.webhook.admission.k8s.io/round_0_index_0".to_owned(), "{}".to_owned());
        resp.extensions_mut().insert(Annotations(a));
        resp
    };
    let auditor = Auditor::new(
        Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n").unwrap(),
        Arc::new(backend::Union(Vec::new())),
    );
    for (level, omit, body, patch_annotation) in [
        (Level::Metadata, false, None, false),
        (Level::Request, false, None, true),
        (Level::RequestResponse, false, Some(true), true),
        (Level::RequestResponse, true, Some(false), true),
    ] {
        let ctx = context(level, omit, &mut request(Method::GET, uri));
        let resp = auditor.log_response(&ctx, answer(), true).await;
        let sent = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        assert!(sent.starts_with(b"{\"kind\":\"Widget\""), "the client still gets the answer");
        let ev = ctx.event.lock().clone();
        assert_eq!(ev.response_status, Some(ResponseStatus::code(200)));
        let recorded = ev.response_object.map(|r| r.get().contains("managedFields"));
        assert_eq!(recorded, body, "{level:?} omitManagedFields={omit}");
        assert_eq!(ev.annotations.contains_key("patch.webhook.admission.k8s.io/round_0_index_0"), patch_annotation);
        assert!(ev.annotations.contains_key("mutation.webhook.admission.k8s.io/round_0_index_0"));
    }
}

#[test]
fn a_status_answer_is_recorded_with_its_bounded_fields() {
    let mut resp = axum::response::IntoResponse::into_response(crate::apiserver::error::ApiError::not_found(
        &crate::resources::podset::INFO,
        "web",
    ));
    let ctx = context(
        Level::Metadata,
        false,
        &mut request(Method::GET, "/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets/web"),
    );
    ctx.log_response_status(&mut resp);
    let v = serde_json::to_value(ctx.event.lock().response_status.clone()).unwrap();
    assert_eq!(v["code"], 404);
    assert_eq!((v["status"].as_str(), v["reason"].as_str()), (Some("Failure"), Some("NotFound")));
    assert_eq!(v["details"]["name"], "web");
    assert!(v["message"].as_str().unwrap().contains("not found"), "{v}");
}
