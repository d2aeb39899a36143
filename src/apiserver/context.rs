//! What the filters leave in a request's extensions for the filters after them, the handler and the audit log:
//! a module of its own, so audit reads these without depending on the filters that audit in turn.

use std::sync::{Arc, OnceLock};

use axum::extract::Request;
use chrono::{DateTime, Utc};
use http::HeaderValue;

use super::auth::UserInfo;
use super::request::RequestInfo;
use super::routes::Routes;

/// The header kube-apiserver's proxy sets on every request it forwards, and every server answers with.
pub const AUDIT_ID_HEADER: &str = "audit-id";

/// The request's audit ID (as sent: kube does not truncate it either).
#[derive(Debug, Clone)]
pub struct AuditId(pub HeaderValue);

impl AuditId {
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

/// When the request arrived (`requestReceivedTimestamp`).
#[derive(Debug, Clone, Copy)]
pub struct ReceivedAt(pub DateTime<Utc>);

/// The authenticated user, in the request's extensions (for the filters after authentication and the handler) and
/// in the answer's (for the request log line).
#[derive(Debug, Clone)]
pub struct Authenticated(pub Arc<UserInfo>);

/// The request's [`RequestInfo`]: the one the request-info filter worked out, or (for a service run without it, as
/// in a unit test) worked out now, as for a server that serves no resource, and kept for the steps after.
pub fn info_of<B>(req: &mut Request<B>) -> Arc<RequestInfo> {
    if let Some(info) = req.extensions().get::<Arc<RequestInfo>>() {
        return info.clone();
    }
    let info = Arc::new(RequestInfo::new(req.method(), req.uri().path(), req.uri().query(), &Routes::default()));
    req.extensions_mut().insert(info.clone());
    info
}

/// What the request log line reports that only the filters inside it learn. The line is written outside the
/// timeout, whose 504 carries none of the handler's extensions, so authentication leaves the user here.
#[derive(Debug, Default)]
pub struct LogContext {
    user: OnceLock<Arc<UserInfo>>,
}

impl LogContext {
    pub fn set_user(&self, user: Arc<UserInfo>) {
        let _ = self.user.set(user);
    }

    pub fn user(&self) -> Option<&UserInfo> {
        self.user.get().map(|u| &**u)
    }
}
