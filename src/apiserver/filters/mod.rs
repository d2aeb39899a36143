//! The filter chain: every request passes these tower layers, in k8s.io/apiserver's `DefaultBuildHandlerChain`
//! order, before the handler dispatches it. Outermost first:
//!
//! | filter | job |
//! |---|---|
//! | [`audit_init`] | the request's audit ID (kube-apiserver's `Audit-ID`, or a new one), echoed in the answer |
//! | [`panics`] | a panicking request is answered 500, and the server goes on |
//! | [`requestinfo`] | the request's RequestInfo, worked out once, read by every filter after it |
//! | [`httplog`] | the request log line, with the code the client got |
//! | [`goaway`] | `--goaway-chance`: a GOAWAY to the connection after a share of HTTP/2 answers |
//! | [`timeout`] | `--request-timeout`: 504 when a request runs too long |
//! | [`instrument`] | request metrics, with the code the handler answered |
//! | [`authentication`] | who is asking; 401 otherwise |
//! | [`traces`] | the request's span (with `--tracing-config-file`), a trusted caller's `traceparent` its parent |
//! | [`audit`] | the audit events of the request, as the policy asks |
//! | [`impersonation`] | impersonation headers refused |
//! | [`maxinflight`] | 429 when too many requests run at once |
//! | [`authorization`] | may they; 403 otherwise |
//!
//! Each filter reads what the ones before it left in the request's extensions (the RequestInfo, the
//! connection's [`ConnInfo`](super::auth::ConnInfo), the user). Long-running requests (watches) are exempt from the
//! timeout and the in-flight limits, as kube-apiserver's `LongRunningFunc` says.

pub mod audit;
pub mod audit_init;
pub mod authentication;
pub mod authorization;
pub mod goaway;
pub mod httplog;
pub mod impersonation;
pub mod instrument;
pub mod maxinflight;
pub mod panics;
pub mod requestinfo;
pub mod timeout;
pub mod traces;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use futures::FutureExt;
use tower::{Layer, Service};

pub use maxinflight::{InFlight, MaxInFlight, RequestKind};
pub use requestinfo::RequestInfoLayer;
pub use timeout::RequestTimeoutLayer;

/// The rest of the chain's answer, as [`Next::run`] gives it.
pub type Run<F> = futures::future::Map<F, fn(Result<Response, Infallible>) -> Response>;

/// What a filter passes the request on to: the next filter, or the handler.
pub trait Next:
    Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + 'static
{
    /// Runs the rest of the chain. Every service of the chain is always ready (none holds back requests: the
    /// in-flight limit answers 429 at once), so it is called without waiting for readiness.
    fn run(mut self, req: Request) -> Run<Self::Future> {
        fn answer(r: Result<Response, Infallible>) -> Response {
            match r {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
        self.call(req).map(answer as fn(_) -> _)
    }
}

impl<S> Next for S where
    S: Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

/// One step of the chain: answers the request itself, or passes it on to `next` (and may look at the answer).
pub trait Filter: Send + Sync + 'static {
    fn filter<N: Next>(self: Arc<Self>, req: Request, next: N) -> impl Future<Output = Response> + Send + 'static;
}

/// A [`Filter`] as a tower layer.
pub struct FilterLayer<F>(Arc<F>);

impl<F> FilterLayer<F> {
    pub fn new(filter: F) -> Self {
        Self(Arc::new(filter))
    }
}

impl<F> Clone for FilterLayer<F> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<F, S> Layer<S> for FilterLayer<F> {
    type Service = Filtered<F, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Filtered { filter: self.0.clone(), inner }
    }
}

/// The service a [`FilterLayer`] makes of the one it wraps.
pub struct Filtered<F, S> {
    filter: Arc<F>,
    inner: S,
}

impl<F, S: Clone> Clone for Filtered<F, S> {
    fn clone(&self) -> Self {
        Self { filter: self.filter.clone(), inner: self.inner.clone() }
    }
}

impl<F: Filter, S: Next> Service<Request> for Filtered<F, S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Always ready, as every service of the chain (see `Next::run`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        Box::pin(self.filter.clone().filter(req, self.inner.clone()).map(Ok))
    }
}
