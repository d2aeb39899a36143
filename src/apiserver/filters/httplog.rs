//! `WithHTTPLogging`: every request is logged as one line with who asked and how it went. Outside the timeout, as
//! in kube-apiserver, so the line has the code the client got (a 504 included), not the handler's later one.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;

use super::{Filter, Next};
use crate::apiserver::auth::ConnInfo;
use crate::apiserver::context::LogContext;

#[derive(Debug, Clone, Copy, Default)]
pub struct HttpLog;

impl Filter for HttpLog {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let started = Instant::now();
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let remote = req.extensions().get::<ConnInfo>().map(|c| c.remote);
        let log = Arc::new(LogContext::default());
        req.extensions_mut().insert(log.clone());
        let resp = next.run(req).await;
        tracing::info!(
            target: "podset_apiserver::http",
            method = %method,
            uri = %uri,
            user = log.user().map(|u| u.name.as_str()).unwrap_or(""),
            remote = remote.map(|r| r.to_string()).unwrap_or_default(),
            status = resp.status().as_u16(),
            latency_us = started.elapsed().as_micros() as u64,
            "request"
        );
        resp
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::response::IntoResponse;
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::api::UserInfo;
    use crate::apiserver::filters::{FilterLayer, RequestTimeoutLayer};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A request that overruns the timeout is logged with the 504 its client got, and with its user.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_timed_out_request_is_logged_as_504_with_its_user() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let handler = tower::service_fn(|req: Request| async move {
            // What authentication does for the log line.
            req.extensions().get::<Arc<LogContext>>().unwrap().set_user(Arc::new(UserInfo::named("alice", vec![])));
            tokio::time::sleep(Duration::from_secs(61)).await;
            Ok::<_, std::convert::Infallible>("late".into_response())
        });
        let svc =
            FilterLayer::new(HttpLog).layer(RequestTimeoutLayer::new(Duration::from_secs(60), None).layer(handler));
        let req = Request::post("/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets").body(Default::default()).unwrap();
        assert_eq!(svc.oneshot(req).await.unwrap().status(), 504);
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(out.lines().next().expect("one line")).unwrap();
        assert_eq!(line["fields"]["status"], 504, "{line}");
        assert_eq!(line["fields"]["user"], "alice", "{line}");
    }
}
