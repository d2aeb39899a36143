//! Request metrics as k8s.io/apiserver's `pkg/endpoints/metrics` records them: `apiserver_request_total`,
//! `apiserver_request_duration_seconds` and `apiserver_longrunning_requests`, labelled from the request's
//! RequestInfo with kube-apiserver's verb (`LIST` vs `GET`, `APPLY`, `WATCH`), scope and dry-run rules. Labels only
//! ever take values from what we serve, so a client sending random paths cannot grow the series.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, Method, Uri};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use prometheus_client::metrics::gauge::Gauge;

use super::health::Endpoint;
use super::metrics::{metrics, DurationLabels, LongRunningLabels, RequestLabels};
use super::request::{RequestInfo, Target, Verb};

const COMPONENT: &str = "apiserver";

/// What one request is recorded as.
pub struct RequestMetrics {
    labels: DurationLabels,
}

/// kube-apiserver's `cleanDryRun`: the sorted, deduplicated `dryRun` values; `invalid` for anything but `All`.
fn dry_run(query: Option<&str>) -> String {
    let mut values: Vec<String> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| k == "dryRun")
        .map(|(_, v)| v.into_owned())
        .collect();
    if values.iter().any(|v| v != "All") {
        return "invalid".into();
    }
    values.dedup();
    values.join(",")
}

fn verb_label(verb: Verb, headers: &HeaderMap) -> &'static str {
    match verb {
        Verb::Get => "GET",
        Verb::List => "LIST",
        Verb::Watch => "WATCH",
        Verb::Create => "POST",
        Verb::Update => "PUT",
        Verb::Patch
            if headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("application/apply-patch")) =>
        {
            "APPLY"
        }
        Verb::Patch => "PATCH",
        Verb::Delete => "DELETE",
        Verb::DeleteCollection => "DELETECOLLECTION",
    }
}

/// A non-resource request's verb: the method, HEAD counted as GET (`CanonicalVerb`), others as `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "other",
    }
}

impl RequestMetrics {
    pub fn new(info: &RequestInfo, method: &Method, uri: &Uri, headers: &HeaderMap) -> Self {
        let mut l = DurationLabels {
            dry_run: dry_run(uri.query()),
            component: COMPONENT.into(),
            verb: method_label(method).into(),
            ..Default::default()
        };
        let path = match &info.target {
            Ok(Target::Resource(r)) => {
                let verb = r.verb;
                l.verb = verb.map_or("other", |v| verb_label(v, headers)).into();
                let resource = r.resolved.resource;
                l.group = resource.group.into();
                l.version = resource.version(r.resolved.version).name.into();
                l.resource = resource.plural.into();
                l.subresource = r.subresource.as_str().into();
                l.scope = if r.name.is_some() || verb == Some(Verb::Create) {
                    "resource"
                } else if r.namespace.is_some() {
                    "namespace"
                } else {
                    "cluster"
                }
                .into();
                None
            }
            Ok(Target::Apis) => Some("/apis".to_owned()),
            Ok(Target::Group(g)) => Some(format!("/apis/{g}")),
            Ok(Target::GroupVersion(g, v)) => Some(format!("/apis/{g}/{v}")),
            Ok(Target::OpenApiV2) => Some("/openapi/v2".to_owned()),
            Ok(Target::OpenApiV3Root) => Some("/openapi/v3".to_owned()),
            Ok(Target::OpenApiV3GroupVersion(g, v)) => Some(format!("/openapi/v3/apis/{g}/{v}")),
            Ok(Target::Version) => Some("/version".to_owned()),
            Ok(Target::Metrics) => Some("/metrics".to_owned()),
            Ok(Target::Health(e, _)) => Some(
                match e {
                    Endpoint::Healthz => "/healthz",
                    Endpoint::Livez => "/livez",
                    Endpoint::Readyz => "/readyz",
                }
                .to_owned(),
            ),
            Ok(Target::Unknown) | Err(_) => None,
        };
        // As `InstrumentHandlerFunc` for non-resource paths: the path is the subresource.
        if let Some(p) = path {
            l.subresource = p;
        }
        Self { labels: l }
    }

    pub fn is_watch(&self) -> bool {
        self.labels.verb == "WATCH"
    }

    /// One finished request (for a watch: its start; how long it then streams is not a latency).
    pub fn record(&self, code: u16, took: Duration) {
        let l = &self.labels;
        let m = metrics();
        m.requests
            .get_or_create(&RequestLabels {
                verb: l.verb.clone(),
                dry_run: l.dry_run.clone(),
                group: l.group.clone(),
                version: l.version.clone(),
                resource: l.resource.clone(),
                subresource: l.subresource.clone(),
                scope: l.scope.clone(),
                component: l.component.clone(),
                code: code.to_string(),
            })
            .inc();
        if !self.is_watch() {
            m.request_duration.get_or_create(l).observe(took.as_secs_f64());
        }
    }

    /// Counts a long-running request in `apiserver_longrunning_requests` until the guard is dropped (see
    /// [`hold_while_streaming`]).
    pub fn long_running(&self) -> impl Send + 'static {
        let l = &self.labels;
        let gauge = metrics()
            .longrunning
            .get_or_create(&LongRunningLabels {
                verb: l.verb.clone(),
                group: l.group.clone(),
                version: l.version.clone(),
                resource: l.resource.clone(),
                subresource: l.subresource.clone(),
                scope: l.scope.clone(),
                component: l.component.clone(),
            })
            .clone();
        gauge.inc();
        GaugeGuard(gauge)
    }
}

/// `body`, keeping `guard` alive until the body has been sent or dropped (a watch's end).
pub fn hold_while_streaming(body: Body, guard: impl Send + 'static) -> Body {
    Body::new(Tracked { inner: body, _guard: Box::new(guard) })
}

/// Decrements its gauge when dropped.
struct GaugeGuard(Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A response body that holds a guard until it is done or dropped.
struct Tracked {
    inner: Body,
    _guard: Box<dyn Send>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(method: Method, uri: &str, content_type: Option<&str>) -> DurationLabels {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(header::CONTENT_TYPE, ct.parse().unwrap());
        }
        let uri: Uri = uri.parse().unwrap();
        let info = RequestInfo::new(&method, uri.path(), uri.query(), &crate::apiserver::routes::testing::routes());
        RequestMetrics::new(&info, &method, &uri, &headers).labels
    }

    const NS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets";

    #[test]
    fn verbs_scopes_and_dry_run_as_kube_apiserver_labels_them() {
        let vs = |l: DurationLabels| (l.verb, l.scope, l.subresource, l.dry_run);
        let s = |a: &str, b: &str, c: &str, d: &str| (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned());
        assert_eq!(vs(labels(Method::GET, NS, None)), s("LIST", "namespace", "", ""));
        assert_eq!(vs(labels(Method::GET, "/apis/demo.k8s.io/v1alpha1/podsets", None)), s("LIST", "cluster", "", ""));
        assert_eq!(vs(labels(Method::GET, &format!("{NS}?watch=1"), None)), s("WATCH", "namespace", "", ""));
        assert_eq!(vs(labels(Method::GET, &format!("{NS}/a"), None)), s("GET", "resource", "", ""));
        assert_eq!(vs(labels(Method::POST, &format!("{NS}?dryRun=All"), None)), s("POST", "resource", "", "All"));
        assert_eq!(vs(labels(Method::PUT, &format!("{NS}/a/status"), None)), s("PUT", "resource", "status", ""));
        let apply = labels(Method::PATCH, &format!("{NS}/a/scale"), Some("application/apply-patch+yaml"));
        assert_eq!(vs(apply), s("APPLY", "resource", "scale", ""));
        assert_eq!(vs(labels(Method::DELETE, NS, None)), s("DELETECOLLECTION", "namespace", "", ""));
        assert_eq!(labels(Method::POST, &format!("{NS}?dryRun=Some"), None).dry_run, "invalid");
        assert_eq!(vs(labels(Method::HEAD, "/readyz/storage", None)), s("GET", "", "/readyz", ""));
        let unknown = labels(Method::GET, "/random/path/abc", None);
        assert_eq!((unknown.subresource.as_str(), unknown.resource.as_str()), ("", ""), "no unbounded labels");
        assert_eq!(labels(Method::GET, NS, None).group, "demo.k8s.io");
    }
}
