//! Parsing a request once: what it addresses (kube-apiserver's `RequestInfo`, here), its query options
//! ([`query`]), and the options of a write or delete checked as kube-apiserver checks them ([`options`]).

use http::Method;

use super::error::{ApiError, ApiResult};
use super::health::Endpoint;
use super::routes::{Resolved, Routes};
use crate::api::selector::FieldSelector;
use crate::api::validation::dns1123_label_errors;
use crate::api::Subresource;

mod options;
mod query;
#[cfg(test)]
mod tests;

pub use options::{delete_options, write_options};
pub use query::{IncludeObject, Query};

/// kube-apiserver's `RequestInfo`, worked out once per request by the first filter (`filters::RequestInfoLayer`)
/// and read from the request's extensions by the timeout, in-flight and audit filters, authorization, the metrics
/// and the handler.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    /// What authorization sees.
    pub attributes: Attributes,
    /// What this server serves at the path (a 400 for a bad namespace comes after authorization).
    pub target: ApiResult<Target>,
    /// The query, parsed once (a 400 for it comes after authorization, as in kube-apiserver).
    pub query: ApiResult<Query>,
}

/// Authorization's view of a request (`authorizer.Attributes`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// The Kubernetes verb of a resource request (`get`, `list`, `watch`, `create`, ...), else the method in lower
    /// case.
    pub verb: String,
    /// The URL path (for a non-resource request, what is authorized).
    pub path: String,
    /// `None` for a non-resource request (discovery, OpenAPI, health, version).
    pub resource: Option<ResourceAttrs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceAttrs {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// What a request addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/apis`
    Apis,
    /// `/apis/<group>` of a served group.
    Group(&'static str),
    /// `/apis/<group>/<version>` of a served group and version.
    GroupVersion(&'static str, &'static str),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3GroupVersion(&'static str, &'static str),
    Version,
    /// `/metrics`
    Metrics,
    /// `/healthz`, `/livez`, `/readyz`, maybe with one check's name.
    Health(Endpoint, Option<String>),
    Resource(ResourceRequest),
    Unknown,
}

/// A request for a served resource: a collection (no name) or one object, maybe a subresource of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    /// Which resource, and the version in the path: the one bodies are read in and answers written in.
    pub resolved: Resolved,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Subresource,
    /// The verb served; `None` when the method has no meaning there (405).
    pub verb: Option<Verb>,
}

/// The Kubernetes verb of a resource request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

fn valid_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

impl RequestInfo {
    /// k8s.io/apiserver's `RequestInfoFactory.NewRequestInfo`: `/apis/<group>/<version>/...` is a resource request,
    /// anything else a non-resource one (`/api/v1/...` is never ours, so it is authorized as the path it is). What
    /// authorization sees depends on the path alone; what it addresses, on what `routes` serve.
    pub fn new(method: &Method, path: &str, query: Option<&str>, routes: &Routes) -> Self {
        let query = Query::parse(query);
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 4 || parts[0] != "apis" {
            let attributes = Attributes { verb: method.as_str().to_lowercase(), path: path.to_owned(), resource: None };
            return Self { attributes, target: Ok(non_resource_target(path, routes)), query };
        }
        let (group, version) = (parts[1], parts[2]);
        let mut parts = &parts[3..];
        let mut verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let mut special = false;
        if matches!(parts[0], "watch" | "proxy") {
            if parts.len() < 2 {
                let attributes =
                    Attributes { verb: method.as_str().to_lowercase(), path: path.to_owned(), resource: None };
                return Self { attributes, target: Ok(Target::Unknown), query };
            }
            verb = parts[0];
            special = true;
            parts = &parts[1..];
        }
        let mut namespace = "";
        if parts[0] == "namespaces" && parts.len() > 1 {
            namespace = parts[1];
            if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
                parts = &parts[2..];
            }
        }
        let at = |i: usize| parts.get(i).copied().unwrap_or("");
        let (resource, path_name) = (at(0), at(1));
        let subresource = if verb != "proxy" { at(2) } else { "" };
        let q = query.as_ref().ok();
        let mut name = path_name.to_owned();
        if path_name.is_empty() && verb == "get" {
            verb = if q.is_some_and(|q| q.watch) { "watch" } else { "list" };
            // A list or watch of one object by field selector is authorized as on that object.
            let selector = q.and_then(|q| q.field_selector.as_deref()).unwrap_or_default();
            if let Some(n) = FieldSelector::parse(selector).ok().as_ref().and_then(FieldSelector::exact_name) {
                if valid_path_segment(n) {
                    name = n.to_owned();
                }
            }
        }
        if path_name.is_empty() && verb == "delete" {
            verb = "deletecollection";
        }
        let served = routes.resolve(group, version, resource).filter(|_| verb != "proxy");
        let target = match (served, Subresource::parse(subresource)) {
            // Nothing past the subresource, a subresource the resource has, and a namespace as its scope says: a
            // name only within one for a namespaced resource (a list may span them), never one for a cluster one.
            (Some(r), Some(sub))
                if parts.len() <= 3
                    && routes.route(r.route).serves(sub)
                    && match r.resource.namespaced() {
                        true => path_name.is_empty() || !namespace.is_empty(),
                        false => namespace.is_empty(),
                    }
                    && (!path_name.is_empty() || sub == Subresource::Main) =>
            {
                resource_target(method, verb, special, r, namespace, path_name, sub)
            }
            _ => Ok(Target::Unknown),
        };
        let resource = ResourceAttrs {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name,
        };
        let attributes = Attributes { verb: verb.to_owned(), path: path.to_owned(), resource: Some(resource) };
        Self { attributes, target, query }
    }

    /// `BasicLongRunningRequestCheck` for what we serve: watches (their own timeout is `--min-request-timeout`).
    pub fn is_long_running(&self) -> bool {
        self.attributes.verb == "watch"
    }
}

/// A resource request: the verb served, from the one kube-apiserver authorizes (what was authorized is what runs).
fn resource_target(
    method: &Method,
    verb: &str,
    special: bool,
    resolved: Resolved,
    namespace: &str,
    name: &str,
    sub: Subresource,
) -> ApiResult<Target> {
    if !namespace.is_empty() {
        if let Some(e) = dns1123_label_errors(namespace).into_iter().next() {
            return Err(ApiError::bad_request(format!("invalid namespace {namespace:?}: {e}")));
        }
    }
    let named = !name.is_empty();
    let read = *method == Method::GET || *method == Method::HEAD;
    let verb = match verb {
        // The `/watch/` prefix serves only GET.
        "watch" if special && !read => None,
        "watch" => Some(Verb::Watch),
        "get" => Some(Verb::Get),
        "list" => Some(Verb::List),
        "create" if !named => Some(Verb::Create),
        "update" if named => Some(Verb::Update),
        "patch" if named => Some(Verb::Patch),
        "delete" => Some(Verb::Delete),
        "deletecollection" => Some(Verb::DeleteCollection),
        _ => None,
    };
    Ok(Target::Resource(ResourceRequest {
        resolved,
        namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
        name: named.then(|| name.to_owned()),
        subresource: sub,
        verb,
    }))
}

fn non_resource_target(path: &str, routes: &Routes) -> Target {
    let trimmed = path.trim_end_matches('/');
    let parts: Vec<&str> = trimmed.split('/').skip(1).collect();
    if let (Some(endpoint), 1..=2) = (parts.first().and_then(|p| Endpoint::parse(p)), parts.len()) {
        return Target::Health(endpoint, parts.get(1).map(|c| c.to_string()));
    }
    match parts.as_slice() {
        ["apis"] => Target::Apis,
        ["apis", g] => routes.group(g).map_or(Target::Unknown, |g| Target::Group(g.name)),
        ["apis", g, v] => group_version(routes, g, v).map_or(Target::Unknown, |(g, v)| Target::GroupVersion(g, v)),
        ["openapi", "v2"] => Target::OpenApiV2,
        ["openapi", "v3"] => Target::OpenApiV3Root,
        ["openapi", "v3", "apis", g, v] => {
            group_version(routes, g, v).map_or(Target::Unknown, |(g, v)| Target::OpenApiV3GroupVersion(g, v))
        }
        ["version"] => Target::Version,
        ["metrics"] => Target::Metrics,
        _ => Target::Unknown,
    }
}

/// A served group and version, named as served.
fn group_version(routes: &Routes, group: &str, version: &str) -> Option<(&'static str, &'static str)> {
    let g = routes.group(group)?;
    let v = g.versions.iter().find(|v| **v == version)?;
    Some((g.name, v))
}
