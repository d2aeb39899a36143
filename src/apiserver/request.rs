//! Parsing a request once into what it addresses (kube-apiserver's `RequestInfo`) and its query options.

use http::Method;

use super::error::{ApiError, ApiResult};
use super::health::Endpoint;
use crate::api::validation::{dns1123_label_errors, FieldError};
use crate::api::{Subresource, GROUP, PLURAL, VERSION};
use crate::registry::{FieldValidation, Revision};

/// What a request addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/apis`
    Apis,
    /// `/apis/demo.k8s.io`
    Group,
    /// `/apis/demo.k8s.io/v1alpha1`
    GroupVersion,
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3GroupVersion,
    Version,
    /// `/metrics`
    Metrics,
    /// `/healthz`, `/livez`, `/readyz`, maybe with one check's name.
    Health(Endpoint, Option<String>),
    Resource(ResourceRequest),
    Unknown,
}

/// A request for PodSets: a collection (no name) or one object, maybe a subresource of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Subresource,
    /// The deprecated `/watch/` path prefix was used.
    pub watch_path: bool,
}

impl Target {
    pub fn parse(path: &str) -> ApiResult<Self> {
        let trimmed = path.trim_end_matches('/');
        let parts: Vec<&str> = trimmed.split('/').skip(1).collect();
        if let (Some(endpoint), 1..=2) = (parts.first().and_then(|p| Endpoint::parse(p)), parts.len()) {
            return Ok(Target::Health(endpoint, parts.get(1).map(|c| c.to_string())));
        }
        Ok(match parts.as_slice() {
            ["apis"] => Target::Apis,
            ["apis", g] if *g == GROUP => Target::Group,
            ["apis", g, v] if *g == GROUP && *v == VERSION => Target::GroupVersion,
            ["apis", g, v, rest @ ..] if *g == GROUP && *v == VERSION => parse_resource(rest)?,
            ["openapi", "v2"] => Target::OpenApiV2,
            ["openapi", "v3"] => Target::OpenApiV3Root,
            ["openapi", "v3", "apis", g, v] if *g == GROUP && *v == VERSION => Target::OpenApiV3GroupVersion,
            ["version"] => Target::Version,
            ["metrics"] => Target::Metrics,
            _ => Target::Unknown,
        })
    }
}

fn parse_resource(parts: &[&str]) -> ApiResult<Target> {
    let (watch_path, parts) = match parts {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, parts),
    };
    let (namespace, rest) = match parts {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, parts),
    };
    let (name, subresource) = match rest {
        [r] if *r == PLURAL => (None, Subresource::Main),
        [r, name] if *r == PLURAL && namespace.is_some() => (Some(*name), Subresource::Main),
        [r, name, sub] if *r == PLURAL && namespace.is_some() => {
            let sub = match *sub {
                "status" => Subresource::Status,
                "scale" => Subresource::Scale,
                _ => return Ok(Target::Unknown),
            };
            (Some(*name), sub)
        }
        _ => return Ok(Target::Unknown),
    };
    if let Some(ns) = namespace {
        if let Some(e) = dns1123_label_errors(ns).into_iter().next() {
            return Err(ApiError::bad_request(format!("invalid namespace {ns:?}: {e}")));
        }
    }
    if name.is_some_and(str::is_empty) {
        return Ok(Target::Unknown);
    }
    Ok(Target::Resource(ResourceRequest {
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        subresource,
        watch_path,
    }))
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

impl Verb {
    pub fn of(method: &Method, req: &ResourceRequest, watch: bool) -> Option<Self> {
        let named = req.name.is_some();
        // The `/watch/` prefix serves only GET; `?watch` applies to collections (a named GET ignores it), as in
        // kube-apiserver, so what was authorized is what runs.
        Some(match (method.as_str(), named) {
            ("GET" | "HEAD", _) if req.watch_path => Verb::Watch,
            _ if req.watch_path => return None,
            ("GET" | "HEAD", false) if watch => Verb::Watch,
            ("GET" | "HEAD", true) => Verb::Get,
            ("GET" | "HEAD", false) => Verb::List,
            ("POST", false) => Verb::Create,
            ("PUT", true) => Verb::Update,
            ("PATCH", true) => Verb::Patch,
            ("DELETE", true) => Verb::Delete,
            ("DELETE", false) => Verb::DeleteCollection,
            _ => return None,
        })
    }
}

/// The query options kube-apiserver understands, parsed and checked.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub force: Option<bool>,
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub orphan_dependents: Option<bool>,
    pub include_object: IncludeObject,
    pub pretty: bool,
}

/// What a Table row carries besides its cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

fn parse_bool(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "true" | "1" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "f" | "F" | "" => Ok(false),
        _ => Err(ApiError::bad_request(format!("invalid value {v:?} for query parameter {name}: must be a boolean"))),
    }
}

fn parse_int<T: std::str::FromStr>(name: &str, v: &str) -> ApiResult<T> {
    v.parse().map_err(|_| {
        ApiError::bad_request(format!("invalid value {v:?} for query parameter {name}: must be an integer"))
    })
}

impl Query {
    /// The first value of a repeated parameter counts, as in kube-apiserver (and in authorization).
    pub fn parse(raw: Option<&str>) -> ApiResult<Self> {
        let mut q = Query::default();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !seen.insert(k.clone()) {
                continue;
            }
            let v = v.as_ref();
            match k.as_ref() {
                // kube-apiserver's conversion: only "0" and "false" (any case) are false.
                "watch" => q.watch = !(v == "0" || v.eq_ignore_ascii_case("false")),
                "resourceVersion" => q.resource_version = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "resourceVersionMatch" => q.resource_version_match = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "limit" => q.limit = Some(parse_int::<i64>("limit", v)?).filter(|l| *l > 0).map(|l| l as usize),
                "continue" => q.continue_token = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "labelSelector" => q.label_selector = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "fieldSelector" => q.field_selector = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "timeoutSeconds" => q.timeout_seconds = Some(parse_int("timeoutSeconds", v)?),
                "allowWatchBookmarks" => q.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", v)?,
                "sendInitialEvents" => q.send_initial_events = Some(parse_bool("sendInitialEvents", v)?),
                "dryRun" => match v {
                    "All" => q.dry_run = true,
                    "" => {}
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "Invalid dry run value: {other:?}; supported values are: \"All\""
                        )))
                    }
                },
                "fieldValidation" => {
                    q.field_validation = match v {
                        "Ignore" => FieldValidation::Ignore,
                        "Warn" | "" => FieldValidation::Warn,
                        "Strict" => FieldValidation::Strict,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got {other:?}"
                            )))
                        }
                    }
                }
                "fieldManager" => q.field_manager = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "force" => q.force = Some(parse_bool("force", v)?),
                "propagationPolicy" => q.propagation_policy = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "gracePeriodSeconds" => q.grace_period_seconds = Some(parse_int("gracePeriodSeconds", v)?),
                "orphanDependents" => q.orphan_dependents = Some(parse_bool("orphanDependents", v)?),
                "includeObject" => {
                    q.include_object = match v {
                        "None" => IncludeObject::None,
                        "Metadata" | "" => IncludeObject::Metadata,
                        "Object" => IncludeObject::Object,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "includeObject must be one of None, Metadata or Object, got {other:?}"
                            )))
                        }
                    }
                }
                "pretty" => q.pretty = parse_bool("pretty", v)?,
                _ => {}
            }
        }
        Ok(q)
    }

    /// k8s.io/apimachinery's `ValidateListOptions`: how `resourceVersionMatch` goes with the other options, for a
    /// list and for a watch; 422 naming every problem.
    pub fn check_list_options(&self, watch: bool) -> ApiResult<()> {
        const FIELD: &str = "resourceVersionMatch";
        let m = self.resource_version_match.as_deref();
        let mut errors = Vec::new();
        if watch {
            if self.send_initial_events.is_some() {
                if m != Some("NotOlderThan") {
                    errors.push(FieldError::forbidden(
                        FIELD,
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if self.send_initial_events == Some(true) && !self.allow_watch_bookmarks {
                    errors.push(FieldError::forbidden(
                        "allowWatchBookmarks",
                        "sendInitialEvents requires setting allowWatchBookmarks to true",
                    ));
                }
            }
            if let Some(m) = m {
                if self.send_initial_events.is_none() {
                    errors.push(FieldError::forbidden(
                        FIELD,
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != "NotOlderThan" {
                    errors.push(FieldError::not_supported(FIELD, m, &["NotOlderThan"]));
                }
            }
        } else if let Some(m) = m {
            if self.resource_version.is_none() {
                errors.push(FieldError::forbidden(
                    FIELD,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.continue_token.is_some() {
                errors
                    .push(FieldError::forbidden(FIELD, "resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errors.push(FieldError::not_supported(FIELD, m, &["Exact", "NotOlderThan", ""]));
            }
            if m == "Exact" && self.resource_version.as_deref() == Some("0") {
                errors.push(FieldError::forbidden(
                    FIELD,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(ApiError::invalid_kind("ListOptions.meta.k8s.io", "", &errors)),
        }
    }

    /// The resourceVersion as a revision (`None` when unset); "0" is a valid revision here.
    pub fn revision(&self) -> ApiResult<Option<Revision>> {
        self.resource_version
            .as_deref()
            .map(|rv| rv.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}"))))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ns: Option<&str>, name: Option<&str>, sub: Subresource) -> Target {
        Target::Resource(ResourceRequest {
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            subresource: sub,
            watch_path: false,
        })
    }

    #[test]
    fn parses_paths() {
        let p = |s| Target::parse(s).unwrap();
        assert_eq!(p("/apis"), Target::Apis);
        assert_eq!(p("/apis/demo.k8s.io/"), Target::Group);
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1"), Target::GroupVersion);
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1/podsets"), res(None, None, Subresource::Main));
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets"), res(Some("ns"), None, Subresource::Main));
        assert_eq!(
            p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a"),
            res(Some("ns"), Some("a"), Subresource::Main)
        );
        assert_eq!(
            p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a/scale"),
            res(Some("ns"), Some("a"), Subresource::Scale)
        );
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/a/exec"), Target::Unknown);
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1/foos"), Target::Unknown);
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1/podsets/a"), Target::Unknown);
        assert_eq!(p("/api/v1/pods"), Target::Unknown);
        assert!(Target::parse("/apis/demo.k8s.io/v1alpha1/namespaces/Bad_NS/podsets").is_err());
    }

    #[test]
    fn verbs_serve_only_what_kube_apiserver_would_authorize() {
        let coll = ResourceRequest {
            namespace: Some("ns".into()),
            name: None,
            subresource: Subresource::Main,
            watch_path: false,
        };
        let named = ResourceRequest { name: Some("a".into()), ..coll.clone() };
        let watch_path = ResourceRequest { watch_path: true, ..coll.clone() };
        assert_eq!(Verb::of(&Method::GET, &coll, true), Some(Verb::Watch));
        assert_eq!(Verb::of(&Method::GET, &named, true), Some(Verb::Get), "a named GET ignores ?watch");
        assert_eq!(Verb::of(&Method::GET, &watch_path, false), Some(Verb::Watch));
        for m in [Method::DELETE, Method::POST, Method::PUT, Method::PATCH] {
            assert_eq!(Verb::of(&m, &watch_path, false), None, "{m} on a /watch/ path");
        }
        assert_eq!(Verb::of(&Method::DELETE, &coll, false), Some(Verb::DeleteCollection));
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
}
