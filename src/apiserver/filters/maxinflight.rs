//! `--max-requests-inflight` and `--max-mutating-requests-inflight`, as k8s.io/apiserver's
//! `WithMaxInFlightLimit`: two pools, read-only (get, list, watch) and mutating; a request that finds its pool full
//! is answered at once with `429 Too Many Requests`, `Retry-After: 1` and a Status, so clients back off instead of
//! piling up. Long-running requests (watches) take no slot; `system:masters` are never refused (kube-apiserver: "a
//! super-admin or a loopback connection ... should always get an answer"): they take a slot when one is free and
//! run without one when none is.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::{Filter, Next};
use crate::apiserver::auth::authz::MASTERS;
use crate::apiserver::auth::UserInfo;
use crate::apiserver::context::{info_of, Authenticated};
use crate::apiserver::error::ApiError;
use crate::apiserver::metrics::{metrics, RequestKindLabel};
use crate::apiserver::request::RequestInfo;

/// The two pools, as metrics label them (`request_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    ReadOnly,
    Mutating,
}

impl RequestKind {
    pub fn of(info: &RequestInfo) -> Self {
        match info.attributes.verb.as_str() {
            "get" | "list" | "watch" => Self::ReadOnly,
            _ => Self::Mutating,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "readOnly",
            Self::Mutating => "mutating",
        }
    }
}

struct Pool {
    limit: usize,
    slots: Arc<Semaphore>,
    /// `apiserver_current_inflight_requests` for this pool, looked up once.
    gauge: Gauge,
}

impl Pool {
    /// 0 means no limit, as in kube-apiserver.
    fn new(limit: usize, kind: RequestKind) -> Option<Self> {
        let label = RequestKindLabel { request_kind: kind.as_str().into() };
        let gauge = metrics().current_inflight.get_or_create(&label).clone();
        (limit > 0).then(|| Self { limit, slots: Arc::new(Semaphore::new(limit)), gauge })
    }
}

/// The limits; shared by every connection.
pub struct MaxInFlight {
    read_only: Option<Pool>,
    mutating: Option<Pool>,
}

/// A slot held while a request runs (or nothing, for a request not counted); `apiserver_current_inflight_requests`
/// counts the slots held.
pub struct InFlight {
    _permit: Option<OwnedSemaphorePermit>,
    gauge: Option<Gauge>,
}

impl InFlight {
    fn none() -> Self {
        Self { _permit: None, gauge: None }
    }

    fn held(permit: OwnedSemaphorePermit, gauge: &Gauge) -> Self {
        let gauge = gauge.clone();
        gauge.inc();
        Self { _permit: Some(permit), gauge: Some(gauge) }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

impl MaxInFlight {
    pub fn new(max_requests_inflight: usize, max_mutating_requests_inflight: usize) -> Self {
        Self {
            read_only: Pool::new(max_requests_inflight, RequestKind::ReadOnly),
            mutating: Pool::new(max_mutating_requests_inflight, RequestKind::Mutating),
        }
    }

    /// No limits (tests, tools).
    pub fn unlimited() -> Self {
        Self::new(0, 0)
    }

    fn pool(&self, kind: RequestKind) -> Option<&Pool> {
        match kind {
            RequestKind::ReadOnly => self.read_only.as_ref(),
            RequestKind::Mutating => self.mutating.as_ref(),
        }
    }

    /// Takes a slot for a request, or refuses it with 429.
    pub fn admit(&self, info: &RequestInfo, user: &UserInfo) -> Result<InFlight, ApiError> {
        let kind = RequestKind::of(info);
        let Some(pool) = self.pool(kind).filter(|_| !info.is_long_running()) else {
            return Ok(InFlight::none());
        };
        match pool.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(InFlight::held(permit, &pool.gauge)),
            Err(TryAcquireError::NoPermits) if user.groups.iter().any(|g| g == MASTERS) => Ok(InFlight::none()),
            Err(_) => Err(ApiError::too_many_requests()),
        }
    }

    /// Requests holding a slot now, per pool (`apiserver_current_inflight_requests`).
    pub fn in_use(&self, kind: RequestKind) -> usize {
        self.pool(kind).map(|p| p.limit - p.slots.available_permits()).unwrap_or(0)
    }
}

impl Filter for MaxInFlight {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let info = info_of(&mut req);
        let anonymous = UserInfo::default();
        let user = req.extensions().get::<Authenticated>().map_or(&anonymous, |u| &*u.0);
        match self.admit(&info, user) {
            Ok(_slot) => next.run(req).await,
            Err(e) => e.into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(method: Method, path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::new(&method, path, query, &crate::apiserver::routes::testing::routes())
    }

    fn user(groups: &[&str]) -> UserInfo {
        UserInfo {
            name: "bob".into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: Default::default(),
        }
    }

    const PODSETS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets";

    #[test]
    fn each_pool_refuses_with_429_once_full_and_frees_its_slots() {
        let limits = MaxInFlight::new(2, 1);
        let bob = user(&["system:authenticated"]);
        let list = info(Method::GET, PODSETS, None);
        let create = info(Method::POST, PODSETS, None);
        assert_eq!((RequestKind::of(&list), RequestKind::of(&create)), (RequestKind::ReadOnly, RequestKind::Mutating));

        let a = limits.admit(&list, &bob).unwrap();
        let _b = limits.admit(&list, &bob).unwrap();
        let refused = limits.admit(&list, &bob).err().expect("the read-only pool is full");
        assert_eq!((refused.code(), refused.reason()), (429, "TooManyRequests"));
        assert_eq!(refused.status.details.as_ref().unwrap().retry_after_seconds, 1);
        assert_eq!(limits.in_use(RequestKind::ReadOnly), 2);

        let _c = limits.admit(&create, &bob).expect("mutating requests have their own pool");
        assert!(limits.admit(&info(Method::DELETE, &format!("{PODSETS}/x"), None), &bob).is_err());
        drop(a);
        assert!(limits.admit(&list, &bob).is_ok(), "a finished request frees its slot");
    }

    #[test]
    fn watches_and_masters_are_never_refused() {
        let limits = MaxInFlight::new(1, 1);
        let bob = user(&[]);
        let _held = limits.admit(&info(Method::GET, PODSETS, None), &bob).unwrap();
        for watch in [
            info(Method::GET, PODSETS, Some("watch=true")),
            info(Method::GET, "/apis/demo.k8s.io/v1alpha1/watch/podsets", None),
        ] {
            assert!(limits.admit(&watch, &bob).is_ok(), "long-running: {watch:?}");
        }
        assert_eq!(limits.in_use(RequestKind::ReadOnly), 1, "watches take no slot");
        assert!(limits.admit(&info(Method::GET, "/version", None), &bob).is_err(), "non-resource reads count too");
        assert!(limits.admit(&info(Method::GET, PODSETS, None), &user(&[MASTERS])).is_ok());
        assert!(MaxInFlight::unlimited().admit(&info(Method::GET, PODSETS, None), &bob).is_ok());
    }
}
