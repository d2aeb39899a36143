//! Cross-cutting request filters, each with one job, named after k8s.io/apiserver's `pkg/server/filters`:
//! `maxinflight` (429 when too many requests run at once) and `timeout` (504 when one runs too long). Both leave
//! long-running requests (watches) alone, as kube-apiserver's `LongRunningFunc` says.

pub mod maxinflight;
pub mod timeout;

use http::Method;

use super::auth::authz::Attributes;
use super::request::Query;

pub use maxinflight::{InFlight, MaxInFlight, RequestKind};
pub use timeout::RequestTimeoutLayer;

/// kube-apiserver's `RequestInfo` of a request, read before anything else (the query as the handler will read it).
pub fn request_info(method: &Method, path: &str, query: Option<&str>) -> Attributes {
    Attributes::from_request(method, path, Query::parse(query).ok().as_ref())
}

/// `BasicLongRunningRequestCheck` for what we serve: watches (their own timeout is `--min-request-timeout`).
pub fn is_long_running(info: &Attributes) -> bool {
    info.verb == "watch"
}
