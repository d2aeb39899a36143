//! Parsing a request once into what it addresses (kube-apiserver's `RequestInfo`) and its query options.

use http::{header, HeaderMap, Method};

use super::error::{ApiError, ApiResult};
use super::health::Endpoint;
use crate::api::selector::FieldSelector;
use crate::api::validation::{dns1123_label_errors, ErrorType, FieldError};
use crate::api::{Subresource, UserInfo, GROUP, PLURAL, VERSION};
use crate::registry::{DeleteOptions, FieldValidation, PatchType, Revision, WriteOptions};

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
    /// anything else a non-resource one (`/api/v1/...` is never ours, so it is authorized as the path it is).
    pub fn new(method: &Method, path: &str, query: Option<&str>) -> Self {
        let query = Query::parse(query);
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 4 || parts[0] != "apis" {
            let attributes = Attributes { verb: method.as_str().to_lowercase(), path: path.to_owned(), resource: None };
            return Self { attributes, target: Ok(non_resource_target(path)), query };
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
        let ours = group == GROUP && version == VERSION && resource == PLURAL && verb != "proxy";
        let target = match (ours, Subresource::parse(subresource)) {
            // Nothing past the subresource, and a name only within a namespace (PodSets are namespaced).
            (true, Some(sub))
                if parts.len() <= 3
                    && (path_name.is_empty() || !namespace.is_empty())
                    && (!path_name.is_empty() || sub == Subresource::Main) =>
            {
                resource_target(method, verb, special, namespace, path_name, sub)
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

/// A PodSet request: the verb served, from the one kube-apiserver authorizes (what was authorized is what runs).
fn resource_target(
    method: &Method,
    verb: &str,
    special: bool,
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
        namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
        name: named.then(|| name.to_owned()),
        subresource: sub,
        verb,
    }))
}

fn non_resource_target(path: &str) -> Target {
    let trimmed = path.trim_end_matches('/');
    let parts: Vec<&str> = trimmed.split('/').skip(1).collect();
    if let (Some(endpoint), 1..=2) = (parts.first().and_then(|p| Endpoint::parse(p)), parts.len()) {
        return Target::Health(endpoint, parts.get(1).map(|c| c.to_string()));
    }
    match parts.as_slice() {
        ["apis"] => Target::Apis,
        ["apis", g] if *g == GROUP => Target::Group,
        ["apis", g, v] if *g == GROUP && *v == VERSION => Target::GroupVersion,
        ["openapi", "v2"] => Target::OpenApiV2,
        ["openapi", "v3"] => Target::OpenApiV3Root,
        ["openapi", "v3", "apis", g, v] if *g == GROUP && *v == VERSION => Target::OpenApiV3GroupVersion,
        ["version"] => Target::Version,
        ["metrics"] => Target::Metrics,
        _ => Target::Unknown,
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

/// kube-apiserver's limit on a field manager's length, in bytes.
const FIELD_MANAGER_MAX: usize = 128;

/// The options of a write, checked as kube-apiserver checks Create/Update/PatchOptions (422 naming the options
/// kind). The field manager is `fieldManager`, else the User-Agent's prefix; an apply must name it.
pub fn write_options(
    q: &Query,
    headers: &HeaderMap,
    verb: Verb,
    patch: Option<PatchType>,
    user: UserInfo,
) -> ApiResult<WriteOptions> {
    let mut errors = Vec::new();
    if verb == Verb::Patch {
        if patch != Some(PatchType::Apply) && q.force.is_some() {
            errors.push(FieldError::forbidden("force", "may not be specified for non-apply patch"));
        }
        if patch == Some(PatchType::Apply) && q.field_manager.is_none() {
            errors.push(FieldError::required("fieldManager", "is required for apply patch"));
        }
    }
    if let Some(m) = q.field_manager.as_deref() {
        errors.extend(field_manager_errors(m));
    }
    if !errors.is_empty() {
        let kind = match verb {
            Verb::Create => "CreateOptions.meta.k8s.io",
            Verb::Update => "UpdateOptions.meta.k8s.io",
            _ => "PatchOptions.meta.k8s.io",
        };
        return Err(ApiError::invalid_kind(kind, "", &errors));
    }
    let agent = || headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    Ok(WriteOptions {
        user,
        dry_run: q.dry_run,
        field_validation: q.field_validation,
        field_manager: q.field_manager.clone().unwrap_or_else(|| prefix_from_user_agent(agent())),
        field_manager_named: q.field_manager.is_some(),
        force: q.force.unwrap_or(false),
    })
}

/// apimachinery's `ValidateFieldManager`: at most 128 bytes, printable characters only.
fn field_manager_errors(m: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if m.len() > FIELD_MANAGER_MAX {
        errors.push(FieldError {
            field: "fieldManager".into(),
            kind: ErrorType::TooLong,
            value: None,
            detail: format!("must have at most {FIELD_MANAGER_MAX} bytes"),
        });
    }
    for (i, c) in m.char_indices().filter(|(_, c)| !is_printable(*c)) {
        errors.push(FieldError::invalid(
            "fieldManager",
            m,
            format!("invalid character U+{:04X} (at position {i})", c as u32),
        ));
    }
    errors
}

/// kube-apiserver's `prefixFromUserAgent`: the User-Agent up to its first `/`, printable characters only, cut to
/// 128 bytes.
fn prefix_from_user_agent(agent: &str) -> String {
    let mut out = String::new();
    for c in agent.split('/').next().unwrap_or("").chars().filter(|c| is_printable(*c)) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX {
            break;
        }
        out.push(c);
    }
    out
}

/// Go's `unicode.IsPrint`, without Unicode's tables: no control or format characters, no space but U+0020, no
/// private use. (Unassigned code points pass here; Go refuses them too.)
fn is_printable(c: char) -> bool {
    const FORMAT: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let private_use = matches!(c, '\u{E000}'..='\u{F8FF}' | '\u{F0000}'..='\u{10FFFF}');
    let cp = c as u32;
    c == ' '
        || !(c.is_control()
            || c.is_whitespace()
            || private_use
            || FORMAT.iter().any(|(lo, hi)| (*lo..=*hi).contains(&cp)))
}

/// DeleteOptions from the body (if any), overridden by query parameters.
pub fn delete_options(q: &Query, body: &[u8]) -> ApiResult<DeleteOptions> {
    let mut opts: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        // `null` is no options, as kube-apiserver reads it.
        serde_json::from_slice::<Option<DeleteOptions>>(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
            .unwrap_or_default()
    };
    if q.propagation_policy.is_some() {
        opts.propagation_policy = q.propagation_policy.clone();
    }
    if q.orphan_dependents.is_some() {
        opts.orphan_dependents = q.orphan_dependents;
    }
    if q.grace_period_seconds.is_some() {
        opts.grace_period_seconds = q.grace_period_seconds;
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ns: Option<&str>, name: Option<&str>, sub: Subresource, verb: Verb) -> Target {
        Target::Resource(ResourceRequest {
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            subresource: sub,
            verb: Some(verb),
        })
    }

    fn target(method: Method, path: &str, query: Option<&str>) -> ApiResult<Target> {
        RequestInfo::new(&method, path, query).target
    }

    #[test]
    fn parses_paths() {
        let p = |s| target(Method::GET, s, None).unwrap();
        assert_eq!(p("/apis"), Target::Apis);
        assert_eq!(p("/apis/demo.k8s.io/"), Target::Group);
        assert_eq!(p("/apis/demo.k8s.io/v1alpha1"), Target::GroupVersion);
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
            let info = RequestInfo::new(&method, &path, query);
            let Ok(Target::Resource(r)) = &info.target else { panic!("{method} {path}: {:?}", info.target) };
            assert_eq!(r.verb, want, "{method} {path}");
            if let Some(v) = r.verb {
                let name = format!("{v:?}").to_lowercase();
                assert_eq!(info.attributes.verb, name, "{method} {path}: served as authorized");
            }
        }
        for m in [Method::DELETE, Method::POST, Method::PUT, Method::PATCH] {
            let info = RequestInfo::new(&m, "/apis/demo.k8s.io/v1alpha1/watch/namespaces/ns/podsets", None);
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
}
