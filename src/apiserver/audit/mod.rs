//! Audit, as k8s.io/apiserver audits: the policy (`--audit-policy-file`, [`policy`]) decides per request how much is
//! recorded (`None`, `Metadata`, `Request` with the request's object, `RequestResponse` with the answer's too) and
//! which stages are left out; the events (`audit.k8s.io/v1` `Event`) go to the log backend ([`log`]) and the
//! webhook backend ([`webhook`]), each in its mode ([`backend`]). Without a policy nothing is recorded.
//!
//! A request's event is built in its [`AuditContext`], which the audit filter puts in the request's extensions:
//! the authorization filter adds its decision, the handler the request's object, and the filter the answer. Its
//! `auditID` is the request's `Audit-ID` ([`AuditId`]), so kube-apiserver's events and ours join.

pub mod backend;
pub mod log;
pub(crate) mod metrics;
pub mod policy;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::response::Response;
use chrono::{DateTime, SecondsFormat, Utc};
use http::HeaderMap;
use kube::core::response::StatusSummary;
use parking_lot::Mutex;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use self::metrics::{metrics, LevelLabel};
use super::auth::ConnInfo;
use super::context::{info_of, AuditId, Authenticated, ReceivedAt};
use super::error::Answered;
use super::request::RequestInfo;
use backend::Backend;
pub use policy::{Level, Policy, RequestAudit, Stage};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: Level,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: Stage,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Box<RawValue>>,
    #[serde(serialize_with = "micro_time")]
    pub request_received_timestamp: DateTime<Utc>,
    #[serde(serialize_with = "micro_time")]
    pub stage_timestamp: DateTime<Utc>,
    /// From authorization (`authorization.k8s.io/*`) and admission (the webhooks' `auditAnnotations` as
    /// `<webhook>/<key>`, how each mutating webhook changed the object).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Audit annotations a response carries to the audit event of its request (admission's).
#[derive(Debug, Clone, Default)]
pub struct Annotations(pub BTreeMap<String, String>);

/// `authentication.k8s.io/v1` UserInfo; empty for a request that failed authentication.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UserInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    pub api_group: String,
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The answer, as a `metav1.Status`: the code, and for an answer that was a Status, its status, message, reason
/// and details (kube's "bounded fields").
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ResponseStatus {
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    pub code: u16,
}

impl ResponseStatus {
    fn code(code: u16) -> Self {
        Self { code, ..Default::default() }
    }

    fn of(status: &kube::core::Status) -> Self {
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Self {
            metadata: BTreeMap::new(),
            status: status.status.as_ref().map(|s| {
                match s {
                    StatusSummary::Success => "Success",
                    StatusSummary::Failure => "Failure",
                }
                .to_owned()
            }),
            message: nonempty(&status.message),
            reason: nonempty(&status.reason),
            details: status.details.as_ref().and_then(|d| serde_json::to_value(d).ok()),
            code: status.code,
        }
    }
}

/// metav1.MicroTime: RFC 3339 in UTC with microseconds.
fn micro_time<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Micros, true))
}

/// kube's `utilnet.SourceIPs`: `X-Forwarded-For`, then `X-Real-Ip`, then the peer (kube-apiserver's own proxy
/// sets the first; only the last is sure).
fn source_ips(headers: &HeaderMap, remote: Option<std::net::IpAddr>) -> Vec<String> {
    let mut ips: Vec<String> = Vec::new();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    for ip in header("x-forwarded-for").split(',').chain([header("x-real-ip")]) {
        if let Ok(ip) = ip.trim().parse::<std::net::IpAddr>() {
            if !ips.contains(&ip.to_string()) {
                ips.push(ip.to_string());
            }
        }
    }
    if let Some(ip) = remote.map(|r| r.to_string()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

/// kube truncates a user agent longer than this.
const MAX_USER_AGENT: usize = 1024;

/// Go's `%q` for a string (JSON's escaping is the same for what headers and names hold).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Event {
    /// The event of a request as received: the filters before audit left its audit ID, when it came, from where,
    /// and (once authenticated) who sent it.
    pub fn of_request<B>(req: &mut http::Request<B>, level: Level) -> Self {
        let info = info_of(req);
        let ext = req.extensions();
        let remote = ext.get::<ConnInfo>().map(|c| c.remote.ip());
        let at = ext.get::<ReceivedAt>().map_or_else(Utc::now, |r| r.0);
        let mut ev = Self::received(&info, req.uri(), req.headers(), remote, at, level);
        if let Some(id) = ext.get::<AuditId>() {
            ev.audit_id = id.as_str().to_owned();
        }
        if let Some(Authenticated(user)) = ext.get::<Authenticated>() {
            ev.user = UserInfo {
                username: user.name.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
            };
        }
        ev
    }

    fn received(
        info: &RequestInfo,
        uri: &http::Uri,
        headers: &HeaderMap,
        remote: Option<std::net::IpAddr>,
        at: DateTime<Utc>,
        level: Level,
    ) -> Self {
        let attrs = &info.attributes;
        let mut user_agent =
            headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        if user_agent.len() > MAX_USER_AGENT {
            let end = (0..=MAX_USER_AGENT).rev().find(|i| user_agent.is_char_boundary(*i)).unwrap_or(0);
            user_agent = format!("{}...TRUNCATED", &user_agent[..end]);
        }
        Self {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level,
            audit_id: String::new(),
            stage: Stage::RequestReceived,
            request_uri: uri.path_and_query().map(|p| p.as_str()).unwrap_or(uri.path()).to_owned(),
            verb: attrs.verb.clone(),
            user: UserInfo::default(),
            source_ips: source_ips(headers, remote),
            user_agent,
            object_ref: attrs.resource.as_ref().map(|r| ObjectReference {
                resource: r.resource.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                api_group: r.group.clone(),
                api_version: r.version.clone(),
                subresource: r.subresource.clone(),
                ..Default::default()
            }),
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: at,
            stage_timestamp: at,
            annotations: BTreeMap::new(),
        }
    }

    /// kube's `EventString`: the `legacy` log format, and how failed events are logged.
    pub fn legacy_line(&self) -> String {
        let (mut user, mut groups) = ("<none>".to_owned(), "<none>".to_owned());
        if !self.user.username.is_empty() {
            user = self.user.username.clone();
            if !self.user.groups.is_empty() {
                groups = self.user.groups.iter().map(|g| quoted(g)).collect::<Vec<_>>().join(",");
            }
        }
        let namespace = self.object_ref.as_ref().map(|r| r.namespace.as_str()).filter(|n| !n.is_empty());
        let response = self.response_status.as_ref().map_or("<deferred>".to_owned(), |s| s.code.to_string());
        format!(
            "{} AUDIT: id={} stage={} ip={} method={} user={} groups={} as=\"<self>\" asgroups=\"<lookup>\" user-agent={} namespace={} uri={} response=\"{response}\"",
            go_rfc3339_nano(self.request_received_timestamp),
            quoted(&self.audit_id),
            quoted(self.stage.as_str()),
            quoted(self.source_ips.first().map_or("<unknown>", String::as_str)),
            quoted(&self.verb),
            quoted(&user),
            quoted(&groups),
            quoted(&self.user_agent),
            quoted(namespace.unwrap_or("<none>")),
            quoted(&self.request_uri),
        )
    }
}

/// Go's `time.RFC3339Nano`: the fraction's trailing zeros left out.
fn go_rfc3339_nano(t: DateTime<Utc>) -> String {
    let s = t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    let (body, _) = s.split_at(s.len() - 1);
    let body = body.trim_end_matches('0').trim_end_matches('.');
    format!("{body}Z")
}

/// The event of one request while it is served, and what the policy asked of it.
#[derive(Debug)]
pub struct AuditContext {
    pub config: RequestAudit,
    event: Mutex<Event>,
}

/// The `patch.webhook.admission.k8s.io/` annotations are kept only at the `Request` level and above.
const PATCH_ANNOTATION_PREFIX: &str = "patch.webhook.admission.k8s.io/";

impl AuditContext {
    pub fn level(&self) -> Level {
        self.config.level
    }

    /// An annotation; as kube's `AddAuditAnnotation`, one already set keeps its value.
    pub fn annotate(&self, key: &str, value: impl Into<String>) {
        self.event.lock().annotations.entry(key.to_owned()).or_insert_with(|| value.into());
    }

    /// kube's `LogRequestObject`: the object completes `objectRef` (namespace, name, uid, resourceVersion) and is
    /// recorded at the `Request` level and above. `object` is what the request sent, decoded, in its version.
    pub fn log_request_object(&self, object: &Value) {
        let mut ev = self.event.lock();
        if let (Some(r), Some(meta)) = (ev.object_ref.as_mut(), object.get("metadata")) {
            let field = |k: &str| meta.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            for (slot, key) in [
                (&mut r.namespace, "namespace"),
                (&mut r.name, "name"),
                (&mut r.uid, "uid"),
                (&mut r.resource_version, "resourceVersion"),
            ] {
                if slot.is_empty() {
                    *slot = field(key);
                }
            }
        }
        if self.config.level >= Level::Request {
            ev.request_object = raw(object, self.config.omit_managed_fields);
        }
    }

    /// kube's `LogRequestObject` for a body without object metadata (DeleteOptions): recorded at `Request`.
    pub fn log_request_options(&self, options: &Value) {
        if self.config.level >= Level::Request {
            self.event.lock().request_object = raw(options, false);
        }
    }

    /// kube's `LogRequestPatch`: the patch as sent, in JSON (an apply patch's YAML converted, as kube does since
    /// it stopped recording YAML under a JSON content type).
    pub fn log_request_patch(&self, patch: &[u8]) {
        if self.config.level < Level::Request {
            return;
        }
        let json = match serde_json::from_slice::<&RawValue>(patch) {
            Ok(raw) => Some(raw.to_owned()),
            Err(_) => serde_yaml::from_slice::<Value>(patch).ok().and_then(|v| raw(&v, false)),
        };
        self.event.lock().request_object = json;
    }

    /// The answer's status: its code, and for a Status answer its bounded fields.
    fn log_response_status(&self, resp: &mut Response) {
        let mut ev = self.event.lock();
        ev.response_status = Some(match resp.extensions().get::<Answered>() {
            Some(Answered(status)) => {
                let mut s = ResponseStatus::of(status);
                s.code = resp.status().as_u16();
                s
            }
            None => ResponseStatus::code(resp.status().as_u16()),
        });
        if let Some(Annotations(a)) = resp.extensions_mut().remove::<Annotations>() {
            for (k, v) in a {
                if k.starts_with(PATCH_ANNOTATION_PREFIX) && self.config.level < Level::Request {
                    continue;
                }
                ev.annotations.entry(k).or_insert(v);
            }
        }
    }

    /// kube's `LogResponseObject` at `RequestResponse`: the answer as sent, in JSON.
    fn log_response_body(&self, content_type: Option<&str>, body: &[u8]) {
        let value = match content_type {
            Some(ct) if ct.starts_with("application/json") => {
                if !self.config.omit_managed_fields {
                    if let Ok(raw) = serde_json::from_slice::<&RawValue>(body) {
                        self.event.lock().response_object = Some(raw.to_owned());
                        return;
                    }
                }
                serde_json::from_slice::<Value>(body).ok()
            }
            Some(ct) if ct.starts_with("application/yaml") => serde_yaml::from_slice::<Value>(body).ok(),
            _ => None,
        };
        if let Some(v) = value {
            self.event.lock().response_object = raw(&v, self.config.omit_managed_fields);
        }
    }
}

/// An object as an event records it, `managedFields` left out if asked (of an object, a list's items, a Table's
/// rows).
fn raw(value: &Value, omit_managed_fields: bool) -> Option<Box<RawValue>> {
    if !omit_managed_fields {
        return serde_json::value::to_raw_value(value).ok();
    }
    let mut v = value.clone();
    let strip = |o: &mut Value| {
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    strip(&mut v);
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
    if let Some(rows) = v.get_mut("rows").and_then(Value::as_array_mut) {
        rows.iter_mut().filter_map(|r| r.get_mut("object")).for_each(strip);
    }
    serde_json::value::to_raw_value(&v).ok()
}

/// The audit of requests: the policy and where events go.
#[derive(Clone)]
pub struct Auditor {
    policy: Arc<Policy>,
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auditor")
    }
}

impl Auditor {
    pub fn new(policy: Policy, backend: Arc<dyn Backend>) -> Self {
        Self { policy: Arc::new(policy), backend }
    }

    /// What the policy asks of a request (after authentication; `None` user when it failed), counted in
    /// `apiserver_audit_level_total`; no context at the `None` level.
    pub fn begin<B>(&self, req: &mut http::Request<B>) -> Option<Arc<AuditContext>> {
        let info = info_of(req);
        let user = req.extensions().get::<Authenticated>().map(|a| &*a.0);
        let config = self.policy.evaluate(user, &info.attributes);
        metrics().levels.get_or_create(&LevelLabel { level: config.level.as_str().into() }).inc();
        if config.level == Level::None {
            return None;
        }
        let event = Mutex::new(Event::of_request(req, config.level));
        Some(Arc::new(AuditContext { config, event }))
    }

    /// Writes the event at `stage` (unless the policy leaves the stage out); false if a backend failed it.
    pub fn process(&self, ctx: &AuditContext, stage: Stage) -> bool {
        if ctx.config.omit_stages.contains(stage) {
            return true;
        }
        // The event is handed on under its request's own lock (no other request takes it): no copy per stage.
        let mut ev = ctx.event.lock();
        ev.stage = stage;
        ev.stage_timestamp = if stage == Stage::RequestReceived { ev.request_received_timestamp } else { Utc::now() };
        metrics().events.inc();
        self.backend.process(std::slice::from_ref(&*ev))
    }

    /// The answer to an audited request: its status, annotations, and at `RequestResponse` its body (which is
    /// read whole: every answer but a watch's is already in memory).
    pub async fn log_response(&self, ctx: &AuditContext, resp: Response, record_body: bool) -> Response {
        let mut resp = resp;
        ctx.log_response_status(&mut resp);
        if !record_body || ctx.level() < Level::RequestResponse {
            return resp;
        }
        let (parts, body) = resp.into_parts();
        let bytes = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "reading an answer for the audit log failed");
                return Response::from_parts(parts, axum::body::Body::empty());
            }
        };
        let content_type = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        ctx.log_response_body(content_type, &bytes);
        Response::from_parts(parts, axum::body::Body::from(bytes))
    }

    /// A request refused before the audit filter (authentication failed, a bad `?timeout=`), answered with `resp`:
    /// one `ResponseStarted` event without a user, as kube's `WithFailedAuthenticationAudit` and
    /// `withFailedRequestAudit` write.
    pub fn failed_request<B>(&self, req: &mut http::Request<B>, mut resp: Response) -> Response {
        if let Some(ctx) = self.begin(req) {
            ctx.log_response_status(&mut resp);
            self.process(&ctx, Stage::ResponseStarted);
        }
        resp
    }

    /// A panic while the request was served: the `Panic` event.
    pub fn panicked(&self, ctx: &AuditContext, message: &str) {
        ctx.event.lock().response_status = Some(ResponseStatus {
            status: Some("Failure".into()),
            reason: Some("InternalError".into()),
            message: Some(format!("APIServer panic'd: {message}")),
            code: 500,
            ..Default::default()
        });
        self.process(ctx, Stage::Panic);
    }
}

#[cfg(test)]
mod tests;
