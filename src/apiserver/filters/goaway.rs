//! `--goaway-chance`, as k8s.io/apiserver's `WithProbabilisticGoaway`: after answering a share of HTTP/2 requests,
//! the server sends the connection a GOAWAY. The client finishes what it has open on that connection (a watch goes
//! on to its end) and opens a new one for its next request, which a Service's load balancing may send to another
//! replica; so a replica that restarts gets its share of a long-lived client's requests back. Only HTTP/2 has a
//! GOAWAY (an HTTP/1.1 client opens a connection per request in flight, which spreads already); long-running
//! requests (watches) never cause one, so a watch is never the reason its connection goes.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use tokio_util::sync::CancellationToken;

use super::{Filter, Next};
use crate::apiserver::context::info_of;

/// The largest chance kube-apiserver accepts: more would make clients reconnect too often to be worth it.
pub const MAX_CHANCE: f64 = 0.02;

/// Asks the connection a request came on to close gracefully: a GOAWAY now, the connection closed once its open
/// streams are done. Every request carries its connection's, in its extensions.
#[derive(Debug, Clone, Default)]
pub struct ConnectionGoaway(CancellationToken);

impl ConnectionGoaway {
    pub fn send(&self) {
        self.0.cancel();
    }

    /// Resolves once a GOAWAY has been asked for.
    pub async fn requested(&self) {
        self.0.cancelled().await
    }
}

/// The filter: sends a GOAWAY after the answer to a request with probability `chance`.
#[derive(Debug, Clone)]
pub struct ProbabilisticGoaway {
    chance: f64,
    decide: fn() -> f64,
}

impl ProbabilisticGoaway {
    pub fn new(chance: f64) -> Self {
        Self { chance, decide: rand::random::<f64> }
    }
}

impl Filter for ProbabilisticGoaway {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let goaway = self.chance > 0.0
            && req.version() == http::Version::HTTP_2
            && !info_of(&mut req).is_long_running()
            && (self.decide)() < self.chance;
        let connection = goaway.then(|| req.extensions().get::<ConnectionGoaway>().cloned()).flatten();
        let resp = next.run(req).await;
        // The stream this answer goes out on is open, so the GOAWAY (which names the last stream the server took)
        // lets it finish.
        if let Some(c) = connection {
            c.send();
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::filters::{FilterLayer, RequestInfoLayer};
    use axum::response::IntoResponse;
    use tower::{Layer, ServiceExt};

    fn always() -> f64 {
        0.0
    }

    async fn goaway_after(chance: f64, decide: fn() -> f64, req: Request) -> bool {
        let filter = ProbabilisticGoaway { chance, decide };
        let svc = RequestInfoLayer::default()
            .layer(FilterLayer::new(filter).layer(tower::service_fn(|_: Request| async { Ok("ok".into_response()) })));
        let connection = ConnectionGoaway::default();
        let mut req = req;
        req.extensions_mut().insert(connection.clone());
        assert_eq!(svc.oneshot(req).await.unwrap().status(), 200);
        connection.0.is_cancelled()
    }

    fn get(uri: &str, version: http::Version) -> Request {
        Request::get(uri).version(version).body(axum::body::Body::empty()).unwrap()
    }

    const LIST: &str = "/apis/demo.k8s.io/v1beta1/namespaces/default/podsets";

    #[tokio::test]
    async fn http2_requests_but_watches_get_a_goaway_by_chance() {
        assert!(goaway_after(MAX_CHANCE, always, get(LIST, http::Version::HTTP_2)).await);
        assert!(!goaway_after(0.0, always, get(LIST, http::Version::HTTP_2)).await, "no chance, no GOAWAY");
        assert!(!goaway_after(MAX_CHANCE, || 0.5, get(LIST, http::Version::HTTP_2)).await);
        let watch = format!("{LIST}?watch=true");
        assert!(!goaway_after(MAX_CHANCE, always, get(&watch, http::Version::HTTP_2)).await, "a watch");
        assert!(!goaway_after(MAX_CHANCE, always, get(LIST, http::Version::HTTP_11)).await, "HTTP/1.1");
    }
}
