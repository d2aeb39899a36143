//! `WithTracing`: each request is a server span, named and annotated as k8s.io/apiserver's (`POST
//! /apis/demo.k8s.io/v1beta1/namespaces/{:namespace}/podsets`, its `audit-id`, verb, resource and code). It comes
//! after authentication, as kube-apiserver's since 1.33, because an incoming `traceparent` is the span's parent only
//! for callers trusted with it (`system:masters`, `system:monitoring`): anyone else's is a link, so a client cannot
//! force sampling or hide its requests in another trace. Without `--tracing-config-file` no span is made.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use opentelemetry::trace::TraceContextExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Filter, Next};
use crate::apiserver::auth::authz::MASTERS;
use crate::apiserver::context::{info_of, AuditId, Authenticated};
use crate::apiserver::request::RequestInfo;

/// kube's `user.MonitoringGroup`, trusted with trace context as `system:masters` is.
pub const MONITORING: &str = "system:monitoring";

#[derive(Debug, Clone, Copy, Default)]
pub struct Tracing;

/// kube's `getSpanNameFromRequestInfo`: the method and the route, names and namespaces left out.
fn span_name(method: &http::Method, info: &RequestInfo) -> String {
    let Some(r) = &info.attributes.resource else {
        return method.to_string();
    };
    let mut name = format!("{method} /apis/{}/{}", r.group, r.version);
    if !r.namespace.is_empty() {
        name.push_str("/namespaces/{:namespace}");
    }
    name.push('/');
    name.push_str(&r.resource);
    if !r.name.is_empty() {
        name.push_str("/{:name}");
    }
    if !r.subresource.is_empty() {
        name.push('/');
        name.push_str(&r.subresource);
    }
    name
}

fn trusted(req: &Request) -> bool {
    req.extensions().get::<Authenticated>().is_some_and(|u| u.0.groups.iter().any(|g| g == MASTERS || g == MONITORING))
}

impl Filter for Tracing {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        if !crate::trace::enabled() {
            return next.run(req).await;
        }
        // Sampled as kube's ParentBased(TraceIDRatioBased) samples, decided before any span is made: a trusted
        // caller's context decides for its trace, anything else is a new trace.
        let (parent, link) = match crate::trace::remote(req.headers()) {
            Some(remote) if trusted(&req) => (Some(remote), None),
            other => (None, other),
        };
        let sampled = match &parent {
            Some(p) => p.is_sampled(),
            None => crate::trace::sample_new_trace(),
        };
        if !sampled {
            return next.run(req).await;
        }
        let info = info_of(&mut req);
        let resource = info.attributes.resource.as_ref();
        let span = tracing::info_span!(
            target: crate::trace::ROOT,
            "KubernetesAPI",
            otel.name = %span_name(req.method(), &info),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            "audit-id" = req.extensions().get::<AuditId>().and_then(|id| id.0.to_str().ok()).unwrap_or(""),
            "http.request.method" = %req.method(),
            "http.target" = %req.uri(),
            "http.response.status_code" = tracing::field::Empty,
            "user_agent.original" = req.headers().get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()),
            verb = %info.attributes.verb,
            resource = resource.map(|r| r.resource.as_str()),
            subresource = resource.map(|r| r.subresource.as_str()).filter(|s| !s.is_empty()),
            namespace = resource.map(|r| r.namespace.as_str()).filter(|s| !s.is_empty()),
        );
        if let Some(parent) = parent {
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
        }
        if let Some(link) = link {
            span.add_link(link);
        }
        let resp = crate::trace::in_sampled(next.run(req)).instrument(span.clone()).await;
        let code = resp.status();
        span.record("http.response.status_code", code.as_u16());
        if code.is_server_error() {
            span.record("otel.status_code", "error");
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_named_by_route_as_kube_names_them() {
        for (method, path, want) in [
            (
                http::Method::POST,
                "/apis/demo.k8s.io/v1beta1/namespaces/a/podsets",
                "POST /apis/demo.k8s.io/v1beta1/namespaces/{:namespace}/podsets",
            ),
            (
                http::Method::GET,
                "/apis/demo.k8s.io/v1beta1/namespaces/a/podsets/web/scale",
                "GET /apis/demo.k8s.io/v1beta1/namespaces/{:namespace}/podsets/{:name}/scale",
            ),
            (http::Method::GET, "/apis/demo.k8s.io/v1alpha1/podsets", "GET /apis/demo.k8s.io/v1alpha1/podsets"),
            (http::Method::GET, "/openapi/v2", "GET"),
        ] {
            let info = RequestInfo::new(&method, path, None, &crate::apiserver::routes::testing::routes());
            assert_eq!(span_name(&method, &info), want, "{path}");
        }
    }
}
