//! `WithRequestInfo`: the first filter works out the request's `RequestInfo` once and keeps it in the request's
//! extensions, where every later filter and the handler read it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use crate::apiserver::request::RequestInfo;
use crate::apiserver::routes::Routes;

/// Works out each request against what `routes` serve.
#[derive(Clone, Default)]
pub struct RequestInfoLayer(pub Arc<Routes>);

impl<S> Layer<S> for RequestInfoLayer {
    type Service = WithRequestInfo<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithRequestInfo { inner, routes: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct WithRequestInfo<S> {
    inner: S,
    routes: Arc<Routes>,
}

impl<S, B> Service<Request<B>> for WithRequestInfo<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let info = RequestInfo::new(req.method(), req.uri().path(), req.uri().query(), &self.routes);
        req.extensions_mut().insert(Arc::new(info));
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::context::info_of;
    use tower::ServiceExt;

    #[tokio::test]
    async fn worked_out_once_and_read_after() {
        let svc = tower::service_fn(|mut req: Request<()>| async move {
            let first = req.extensions().get::<Arc<RequestInfo>>().cloned().expect("set by the layer");
            let again = info_of(&mut req);
            Ok::<_, std::convert::Infallible>((Arc::ptr_eq(&first, &again), again.attributes.verb.clone()))
        });
        let req = Request::get("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets?watch=1").body(()).unwrap();
        let (same, verb) = RequestInfoLayer::default().layer(svc).oneshot(req).await.unwrap();
        assert!(same, "read, not worked out again");
        assert_eq!(verb, "watch");
    }
}
