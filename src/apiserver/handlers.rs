//! The handler after the filter chain ([`super::filters`]): dispatch by target and verb, then the representation
//! the client asked for. Every failure is rendered as a Status here ([`super::error`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use super::audit::{AuditContext, Level};
use super::auth::UserInfo;
use super::context::{info_of, Authenticated};
use super::discovery::{Discovery, Doc};
use super::error::{Answered, ApiError, ApiResult, StatusBody};
use super::health::HealthChecks;
use super::negotiate::{body_format, negotiate, BodyFormat, Output, APIS, OBJECTS, PLAIN};
use super::render::{bytes_response, list_response, object_response, value_response, with_admission, JSON};
use super::request::{delete_options, write_options, Query, RequestInfo, ResourceRequest, Target, Verb};
use super::routes::Routes;
use super::status::status_details;
use super::watch::{self, WatchConfig, WatchRequest};
use crate::api::resource::{ResourceInfo, VersionIndex};
use crate::api::selector::{FieldSelector, Selector};
use crate::api::Subresource;
use crate::registry::{
    json_object, yaml_object, ListRequest, ObjectKey, PatchType, RestStorage, ScaleChange, WriteOptions, Written,
};

/// Request bodies above this are refused with 413, as kube-apiserver does.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
const DRAIN_BYTES: usize = 16 * 1024 * 1024;

/// Everything the handler needs, shared by all connections (the filters before it hold their own).
pub struct App {
    pub routes: Arc<Routes>,
    pub discovery: Discovery,
    pub watch: WatchConfig,
    pub health: HealthChecks,
}

/// One request, past the filters: dispatched, and any failure rendered as a Status.
pub async fn handle(State(app): State<Arc<App>>, mut req: Request) -> Response {
    let info = info_of(&mut req);
    let Some(Authenticated(user)) = req.extensions().get::<Authenticated>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    match dispatch(&app, &info, req, user).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

fn accept(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())
}

fn doc_response(doc: &Doc, content_type: &'static str, headers: &HeaderMap) -> Response {
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == doc.etag || t.trim() == "*"));
    let mut resp = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        bytes_response(StatusCode::OK, content_type, doc.body.clone())
    };
    let h = resp.headers_mut();
    if matches {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    if let Ok(etag) = HeaderValue::from_str(&doc.etag) {
        h.insert(header::ETAG, etag);
    }
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

async fn dispatch(app: &App, info: &RequestInfo, req: Request, user: Arc<UserInfo>) -> ApiResult<Response> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let read_only = |m: &Method| m == Method::GET || m == Method::HEAD;
    let headers = req.headers();
    let d = &app.discovery;
    match info.target.as_ref().map_err(Clone::clone)? {
        Target::Resource(r) => Box::pin(resource(app, info, r, req, user)).await,
        Target::Unknown => Err(ApiError::path_not_found(&path)),
        _ if !read_only(&method) => Err(ApiError::method_not_allowed(&method, &path)),
        Target::Apis => Ok(match negotiate(accept(headers), APIS)? {
            Output::Discovery(version) => {
                let (doc, content_type) = match version {
                    "v2" => (&d.aggregated_v2, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
                    _ => (
                        &d.aggregated_v2beta1,
                        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
                    ),
                };
                let mut resp = doc_response(doc, content_type, headers);
                // As k8s.io/apiserver's aggregated discovery handler.
                resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
                resp
            }
            _ => doc_response(&d.group_list, JSON, headers),
        }),
        Target::Group(g) => plain_doc(d.group(g).ok_or_else(|| ApiError::path_not_found(&path))?, headers),
        Target::GroupVersion(g, v) => {
            plain_doc(d.resource_list(g, v).ok_or_else(|| ApiError::path_not_found(&path))?, headers)
        }
        Target::OpenApiV2 => plain_doc(&d.openapi_v2, headers),
        Target::OpenApiV3Root => plain_doc(&d.openapi_v3_root, headers),
        Target::OpenApiV3GroupVersion(g, v) => {
            let doc = d.openapi_v3(g, v).ok_or_else(|| ApiError::path_not_found(&path))?;
            let mut resp = plain_doc(doc, headers)?;
            let hashed = req.uri().query().is_some_and(|q| q.contains(&format!("hash={}", doc.hash())));
            let cache = if hashed { "public, immutable" } else { "no-cache, private" };
            resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
            Ok(resp)
        }
        Target::Version => plain_doc(&d.version, headers),
        Target::Metrics => Ok(metrics_response(&app.routes)),
        Target::Health(endpoint, check) => {
            if method != Method::GET && method != Method::HEAD {
                return Err(ApiError::method_not_allowed(&method, "health"));
            }
            app.health.serve(*endpoint, check.as_deref(), req.uri().query()).await
        }
    }
}

/// `/metrics`: the object counts are read now (kube-apiserver polls them; a count from the cache is cheap).
fn metrics_response(routes: &Routes) -> Response {
    for r in routes.routes() {
        let resource = super::metrics::ResourceLabel { resource: r.resource.to_string() };
        super::metrics::metrics().storage_objects.get_or_create(&resource).set(r.storage.object_count() as i64);
    }
    let mut resp = bytes_response(StatusCode::OK, crate::metrics::CONTENT_TYPE, Bytes::from(crate::metrics::encode()));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn plain_doc(doc: &Doc, headers: &HeaderMap) -> ApiResult<Response> {
    negotiate(accept(headers), PLAIN)?;
    Ok(doc_response(doc, JSON, headers))
}

/// Reads a body of at most `MAX_BODY_BYTES`. A larger one is read on (and dropped) up to `DRAIN_BYTES`, so a
/// client still writing it gets the 413 rather than a broken pipe.
async fn read_body(mut body: Body) -> ApiResult<Bytes> {
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        seen += data.len();
        if seen > DRAIN_BYTES {
            break;
        }
        if seen <= MAX_BODY_BYTES {
            buf.extend_from_slice(&data);
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    Ok(buf.freeze())
}

fn selectors(q: &Query, name: Option<&str>) -> ApiResult<(Selector, FieldSelector)> {
    let labels = Selector::parse(q.label_selector.as_deref().unwrap_or("")).map_err(ApiError::bad_request)?;
    let mut fields = q.field_selector.clone().unwrap_or_default();
    if let Some(n) = name {
        // A watch on one object is a watch filtered by name.
        fields = if fields.is_empty() { format!("metadata.name={n}") } else { format!("{fields},metadata.name={n}") };
    }
    let fields = FieldSelector::parse(&fields).map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

/// A resource request, worked out: what every verb's step reads.
struct Call<'a> {
    app: &'a App,
    /// The resource's storage.
    storage: &'a dyn RestStorage,
    resource: &'static ResourceInfo,
    /// The version in the path.
    version: VersionIndex,
    r: &'a ResourceRequest,
    q: &'a Query,
    /// The representation the client takes.
    out: Output,
    content_type: Option<String>,
    headers: HeaderMap,
    method: Method,
    path: String,
    /// The request's audit event, if the policy records it.
    audit: Option<Arc<AuditContext>>,
}

impl Call<'_> {
    /// A create's or update's body, for the audit event (kube's `LogRequestObject`): as sent for its metadata,
    /// decoded by the registry only when the event records the object.
    fn audit_object(&self, body: &Value) {
        let Some(a) = &self.audit else { return };
        if a.level() < Level::Request {
            return a.log_request_object(body);
        }
        if let Some(obj) = self.storage.request_object(body.clone(), self.r.subresource) {
            a.log_request_object(&obj);
        }
    }

    /// A delete's options, when the request sent them, for the audit event.
    fn audit_delete_options(&self, body: &[u8]) {
        let Some(a) = &self.audit else { return };
        if let Ok(Value::Object(mut options)) = serde_json::from_slice::<Value>(body) {
            options.insert("kind".into(), "DeleteOptions".into());
            options.insert("apiVersion".into(), "meta.k8s.io/v1".into());
            a.log_request_options(&Value::Object(options));
        }
    }

    fn key(&self) -> ObjectKey {
        ObjectKey::new(self.r.namespace.as_deref().unwrap_or_default(), self.r.name.as_deref().unwrap_or(""))
    }

    fn not_allowed(&self) -> ApiError {
        ApiError::method_not_allowed(&self.method, &self.path)
    }

    /// A create or update body: JSON or YAML.
    fn body_format(&self) -> ApiResult<BodyFormat> {
        let format = body_format(self.content_type.as_deref())?;
        if !matches!(format, BodyFormat::Json | BodyFormat::Yaml) {
            return Err(ApiError::unsupported_media_type(self.content_type.as_deref().unwrap_or("")));
        }
        Ok(format)
    }

    fn object(&self, code: StatusCode, written: &Written) -> ApiResult<Response> {
        let resp = object_response(code, self.out, &written.object, self.q.include_object, self.version)?;
        Ok(with_admission(resp, &written.warnings, &written.audit_annotations))
    }

    /// A Status or list answer, which has no Table form: YAML if asked, else JSON.
    fn plain(&self, value: &Value) -> ApiResult<Response> {
        value_response(StatusCode::OK, if self.out == Output::Yaml { Output::Yaml } else { Output::Json }, value)
    }
}

async fn resource(
    app: &App,
    info: &RequestInfo,
    r: &ResourceRequest,
    req: Request,
    user: Arc<UserInfo>,
) -> ApiResult<Response> {
    let q = info.query.as_ref().map_err(Clone::clone)?;
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let verb = r.verb.ok_or_else(|| ApiError::method_not_allowed(&parts.method, &path))?;
    if let Some(len) = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok()) {
        if len > DRAIN_BYTES {
            return Err(ApiError::too_large(MAX_BODY_BYTES));
        }
    }
    let offers = if r.subresource == Subresource::Scale { PLAIN } else { OBJECTS };
    let out = negotiate(accept(&parts.headers), offers)?;
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let audit = parts.extensions.get::<Arc<AuditContext>>().cloned();
    let route = app.routes.route(r.resolved.route);
    let (storage, resource, version) = (&*route.storage, r.resolved.resource, r.resolved.version);
    let headers = parts.headers;
    let method = parts.method;
    let call = Call { app, storage, resource, version, r, q, out, content_type, headers, method, path, audit };
    // Reads run inline; each write's larger future is boxed, so a get does not carry (and copy) a write's state.
    match verb {
        Verb::Watch => watch(call).await,
        Verb::List => list(call).await,
        Verb::Get => get(call).await,
        Verb::Create => Box::pin(create(call, body, user)).await,
        Verb::Update => Box::pin(update(call, body, user)).await,
        Verb::Patch => Box::pin(patch(call, body, user)).await,
        Verb::Delete => Box::pin(delete(call, body, user)).await,
        Verb::DeleteCollection => Box::pin(delete_collection(call, body, user)).await,
    }
}

async fn watch(c: Call<'_>) -> ApiResult<Response> {
    if c.r.subresource != Subresource::Main {
        return Err(c.not_allowed());
    }
    let (labels, fields) = selectors(c.q, c.r.name.as_deref())?;
    let output = if c.out == Output::Yaml { Output::Json } else { c.out };
    let wr = WatchRequest {
        namespace: c.r.namespace.clone(),
        labels,
        fields,
        query: c.q.clone(),
        output,
        resource: c.resource,
        version: c.version,
    };
    watch::serve(c.storage, &c.app.watch, wr).await
}

async fn list(c: Call<'_>) -> ApiResult<Response> {
    let q = c.q;
    if c.r.subresource != Subresource::Main {
        return Err(c.not_allowed());
    }
    q.check_list_options(false)?;
    // "0" means any, so a continue token's own revision satisfies it (as in kube-apiserver).
    if q.continue_token.is_some() && q.resource_version.as_deref().is_some_and(|rv| rv != "0") {
        return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
    }
    let (labels, fields) = selectors(q, None)?;
    let exact = q.resource_version_match.as_deref() == Some("Exact");
    let page = c
        .storage
        .list(ListRequest {
            namespace: c.r.namespace.clone(),
            labels,
            fields,
            limit: q.limit,
            continue_token: q.continue_token.clone(),
            resource_version: q.revision()?,
            exact,
            // A client's list fails on an object no key reads, naming it.
            skip_unreadable: false,
        })
        .await?;
    list_response(c.resource, c.out, &page, q.include_object, c.version)
}

async fn get(c: Call<'_>) -> ApiResult<Response> {
    let reg = c.storage;
    match c.r.subresource {
        Subresource::Scale => scale_response(c.out, &reg.get_scale(&c.key(), c.q.revision()?).await?),
        _ => {
            let obj = reg.get(&c.key(), c.q.revision()?).await?;
            object_response(StatusCode::OK, c.out, &obj, c.q.include_object, c.version)
        }
    }
}

async fn create(c: Call<'_>, body: Body, user: Arc<UserInfo>) -> ApiResult<Response> {
    let user = Arc::unwrap_or_clone(user);
    let ns = match (&c.r.namespace, c.r.subresource) {
        (Some(ns), Subresource::Main) => ns.as_str(),
        (None, Subresource::Main) if !c.resource.namespaced() => "",
        _ => return Err(c.not_allowed()),
    };
    let format = c.body_format()?;
    let opts = write_options(c.q, &c.headers, Verb::Create, None, user, c.version)?;
    let body = read_body(body).await?;
    let reg = c.storage;
    let written = match format {
        // An audited create is parsed once, for its event and for the write.
        _ if c.audit.is_some() => {
            let value = parse_body(&body, format)?;
            c.audit_object(&value);
            reg.create(ns, value, &opts).await?
        }
        BodyFormat::Yaml => reg.create(ns, yaml_object(&body)?, &opts).await?,
        _ => reg.create_json(ns, &body, &opts).await?,
    };
    c.object(StatusCode::CREATED, &written)
}

async fn update(c: Call<'_>, body: Body, user: Arc<UserInfo>) -> ApiResult<Response> {
    let user = Arc::unwrap_or_clone(user);
    let format = c.body_format()?;
    let opts = write_options(c.q, &c.headers, Verb::Update, None, user, c.version)?;
    let body = parse_body(&read_body(body).await?, format)?;
    c.audit_object(&body);
    let (reg, key) = (c.storage, c.key());
    match c.r.subresource {
        Subresource::Scale => scale_response(c.out, &reg.update_scale(&key, ScaleChange::Replace(body), &opts).await?),
        sub => c.object(StatusCode::OK, &reg.replace(&key, body, sub, &opts).await?),
    }
}

async fn patch(c: Call<'_>, body: Body, user: Arc<UserInfo>) -> ApiResult<Response> {
    let user = Arc::unwrap_or_clone(user);
    let patch_type = patch_type(c.content_type.as_deref())?;
    let opts = write_options(c.q, &c.headers, Verb::Patch, Some(patch_type), user, c.version)?;
    let (reg, key) = (c.storage, c.key());
    match c.r.subresource {
        // No field management runs on a Scale, so it takes merge and JSON patches only.
        Subresource::Scale if patch_type == PatchType::Apply => {
            Err(ApiError::unsupported_patch("application/apply-patch+yaml"))
        }
        Subresource::Scale => {
            let patch = read_body(body).await?;
            if let Some(a) = &c.audit {
                a.log_request_patch(&patch);
            }
            scale_response(c.out, &reg.update_scale(&key, ScaleChange::Patch(&patch, patch_type), &opts).await?)
        }
        sub => {
            let patch = read_body(body).await?;
            if let Some(a) = &c.audit {
                a.log_request_patch(&patch);
            }
            let written = reg.patch(&key, &patch, patch_type, sub, &opts).await?;
            c.object(if written.created { StatusCode::CREATED } else { StatusCode::OK }, &written)
        }
    }
}

async fn delete(c: Call<'_>, body: Body, user: Arc<UserInfo>) -> ApiResult<Response> {
    let user = Arc::unwrap_or_clone(user);
    if c.r.subresource != Subresource::Main {
        return Err(c.not_allowed());
    }
    let (key, q) = (c.key(), c.q);
    let body = read_body(body).await?;
    c.audit_delete_options(&body);
    let delete = delete_options(q, &body)?;
    let opts = WriteOptions {
        user,
        dry_run: q.dry_run || delete.dry_run_all(),
        version: Some(c.version),
        ..Default::default()
    };
    let deleted = c.storage.delete(&key, &delete, &opts).await?;
    let resp = if deleted.gone {
        // As kube-apiserver: a Status once the object is gone, the object while finalizers hold it.
        let mut details = status_details(&key.name, c.resource.group, c.resource.plural, Vec::new());
        details.uid = deleted.object.uid().unwrap_or_default().to_owned();
        let status = kube::core::Status {
            // As kube's store answers a delete: no code in the body.
            status: Some(kube::core::response::StatusSummary::Success),
            metadata: Some(Default::default()),
            details: Some(details),
            ..Default::default()
        };
        let value = serde_json::to_value(StatusBody::new(&status)).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut resp = c.plain(&value)?;
        resp.extensions_mut().insert(Answered(Box::new(status)));
        resp
    } else {
        object_response(StatusCode::OK, c.out, &deleted.object, q.include_object, c.version)?
    };
    Ok(with_admission(resp, &deleted.warnings, &deleted.audit_annotations))
}

async fn delete_collection(c: Call<'_>, body: Body, user: Arc<UserInfo>) -> ApiResult<Response> {
    let user = Arc::unwrap_or_clone(user);
    let ns = match (&c.r.namespace, c.r.subresource) {
        (Some(ns), Subresource::Main) => Some(ns.clone()),
        (None, Subresource::Main) if !c.resource.namespaced() => None,
        _ => return Err(c.not_allowed()),
    };
    let q = c.q;
    let body = read_body(body).await?;
    c.audit_delete_options(&body);
    let delete = delete_options(q, &body)?;
    let opts = WriteOptions {
        user,
        dry_run: q.dry_run || delete.dry_run_all(),
        version: Some(c.version),
        ..Default::default()
    };
    let (labels, fields) = selectors(q, None)?;
    let req = ListRequest { namespace: ns, labels, fields, ..Default::default() };
    let (items, revision) = c.storage.delete_collection(req, &delete, &opts).await?;
    let items = items.iter().map(|o| o.to_version(c.version)?.to_value()).collect::<Result<Vec<_>, _>>()?;
    c.plain(&serde_json::json!({
        "apiVersion": c.resource.version(c.version).api_version,
        "kind": c.resource.list_kind,
        "metadata": {"resourceVersion": revision.to_string()},
        "items": items,
    }))
}

/// Parses a create or update body (JSON or YAML) into a JSON object.
fn parse_body(body: &[u8], format: BodyFormat) -> ApiResult<Value> {
    match format {
        BodyFormat::Yaml => Ok(yaml_object(body)?),
        _ => Ok(json_object(body)?),
    }
}

/// The patch a PATCH's Content-Type names; strategic merge patch is refused, as kube-apiserver does for custom
/// resources.
fn patch_type(content_type: Option<&str>) -> ApiResult<PatchType> {
    match body_format(content_type)? {
        BodyFormat::MergePatch => Ok(PatchType::Merge),
        BodyFormat::JsonPatch => Ok(PatchType::Json),
        BodyFormat::ApplyPatch => Ok(PatchType::Apply),
        BodyFormat::StrategicMergePatch => Err(ApiError::unsupported_patch("application/strategic-merge-patch+json")),
        BodyFormat::Json | BodyFormat::Yaml => Err(ApiError::unsupported_patch("application/json")),
    }
}

fn scale_response(out: Output, scale: &k8s_openapi::api::autoscaling::v1::Scale) -> ApiResult<Response> {
    let value = serde_json::to_value(scale).map_err(|e| ApiError::internal(e.to_string()))?;
    value_response(StatusCode::OK, out, &value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_types_from_content_types() {
        assert_eq!(patch_type(Some("application/merge-patch+json")).unwrap(), PatchType::Merge);
        assert_eq!(patch_type(Some("application/json-patch+json")).unwrap(), PatchType::Json);
        assert_eq!(patch_type(Some("application/apply-patch+yaml")).unwrap(), PatchType::Apply);
        for ct in ["application/strategic-merge-patch+json", "application/json", "text/plain"] {
            assert_eq!(patch_type(Some(ct)).unwrap_err().code(), 415, "{ct}");
        }
    }
}
