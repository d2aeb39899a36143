//! `/healthz`, `/livez`, `/readyz` from named checks, as k8s.io/apiserver's `pkg/server/healthz`: `?verbose` lists
//! every check, `?exclude=<name>` skips one, `/<endpoint>/<name>` runs one and says why it fails. Parts of the
//! server register their own checks: `ping`, `storage`, `informer-sync` (the controller's and admission's caches),
//! `delegation` (trust anchors loaded), `shutdown` (fails from SIGTERM on, so load balancers stop sending before we
//! stop serving).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http::{header, HeaderValue, StatusCode};
use tokio_util::sync::CancellationToken;

use super::error::{ApiError, ApiResult};

/// A check that gives up after this long has failed (a store stuck in a write is not healthy).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// One named check, as k8s.io/apiserver's `healthz.HealthChecker`.
#[async_trait]
pub trait HealthCheck: Send + Sync {
    fn name(&self) -> &str;
    /// Ok, or why not (logged and shown on `/<endpoint>/<name>`; the combined endpoints withhold it).
    async fn check(&self) -> Result<(), String>;
}

struct NamedCheck<F> {
    name: &'static str,
    check: F,
}

#[async_trait]
impl<F> HealthCheck for NamedCheck<F>
where
    F: Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync,
{
    fn name(&self) -> &str {
        self.name
    }

    async fn check(&self) -> Result<(), String> {
        (self.check)().await
    }
}

/// A check from a name and an async function, as `healthz.NamedCheck`.
pub fn named_check<F, Fut>(name: &'static str, check: F) -> Arc<dyn HealthCheck>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    Arc::new(NamedCheck { name, check: move || -> BoxFuture<'static, _> { Box::pin(check()) } })
}

/// `ping`: answers while the server serves at all (k8s.io/apiserver's `PingHealthz`).
pub fn ping() -> Arc<dyn HealthCheck> {
    named_check("ping", || std::future::ready(Ok(())))
}

/// `shutdown` on `/readyz`: fails as soon as `initiated` fires (SIGTERM), while requests are still served for
/// `--shutdown-delay-duration`, so endpoints drop this replica before its connections are closed.
pub fn shutdown(initiated: CancellationToken) -> Arc<dyn HealthCheck> {
    named_check("shutdown", move || {
        let down = initiated.is_cancelled();
        std::future::ready(if down { Err("process is shutting down".into()) } else { Ok(()) })
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Healthz,
    Livez,
    Readyz,
}

impl Endpoint {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "healthz" => Some(Self::Healthz),
            "livez" => Some(Self::Livez),
            "readyz" => Some(Self::Readyz),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Livez => "livez",
            Self::Readyz => "readyz",
        }
    }
}

/// The checks behind each endpoint, in the order they were added.
#[derive(Default, Clone)]
pub struct HealthChecks {
    checks: Vec<(Endpoint, Arc<dyn HealthCheck>)>,
}

impl HealthChecks {
    /// Adds a check to one endpoint. k8s.io/apiserver's `AddHealthChecks` is `add` to all three; a failing
    /// `/livez` check gets the process restarted, a failing `/readyz` one only takes it out of rotation.
    pub fn add(&mut self, endpoint: Endpoint, check: Arc<dyn HealthCheck>) -> &mut Self {
        self.checks.push((endpoint, check));
        self
    }

    fn of(&self, endpoint: Endpoint) -> impl Iterator<Item = &Arc<dyn HealthCheck>> {
        self.checks.iter().filter(move |(e, _)| *e == endpoint).map(|(_, c)| c)
    }

    /// Serves `/<endpoint>` (`check` = None) or `/<endpoint>/<check>`.
    pub async fn serve(&self, endpoint: Endpoint, check: Option<&str>, query: Option<&str>) -> ApiResult<Response> {
        if let Some(name) = check {
            let c = self
                .of(endpoint)
                .find(|c| c.name() == name)
                .ok_or_else(|| ApiError::path_not_found(&format!("/{}/{name}", endpoint.as_str())))?;
            return Ok(match run(c.as_ref()).await {
                Ok(()) => text(StatusCode::OK, "ok".into()),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {e}\n")),
            });
        }
        let mut verbose = false;
        let mut excluded: Vec<String> = Vec::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*k {
                "verbose" => verbose = true,
                "exclude" => excluded.push(v.into_owned()),
                _ => {}
            }
        }
        let name = endpoint.as_str();
        let mut out = String::new();
        let mut failed = Vec::new();
        for c in self.of(endpoint) {
            if let Some(i) = excluded.iter().position(|e| e == c.name()) {
                excluded.swap_remove(i);
                out.push_str(&format!("[+]{} excluded: ok\n", c.name()));
                continue;
            }
            match run(c.as_ref()).await {
                Ok(()) => out.push_str(&format!("[+]{} ok\n", c.name())),
                Err(e) => {
                    // The combined endpoints may be public: the reason goes to the log only.
                    out.push_str(&format!("[-]{} failed: reason withheld\n", c.name()));
                    tracing::warn!(endpoint = name, check = c.name(), error = %e, "health check failed");
                    failed.push(c.name().to_owned());
                }
            }
        }
        if !excluded.is_empty() {
            let list = excluded.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(",");
            out.push_str(&format!("warn: some health checks cannot be excluded: no matches for {list}\n"));
        }
        Ok(if !failed.is_empty() {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("{out}{name} check failed\n"))
        } else if verbose {
            text(StatusCode::OK, format!("{out}{name} check passed\n"))
        } else {
            text(StatusCode::OK, "ok".into())
        })
    }
}

async fn run(check: &dyn HealthCheck) -> Result<(), String> {
    match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    async fn body(r: Response) -> (u16, String) {
        let status = r.status().as_u16();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(b.to_vec()).unwrap())
    }

    fn checks(broken: Arc<AtomicBool>) -> HealthChecks {
        let mut h = HealthChecks::default();
        h.add(Endpoint::Readyz, named_check("always", || async { Ok(()) }));
        h.add(
            Endpoint::Readyz,
            named_check("storage", move || {
                let broken = broken.load(Ordering::Relaxed);
                async move {
                    if broken {
                        Err("disk full".into())
                    } else {
                        Ok(())
                    }
                }
            }),
        );
        h
    }

    #[tokio::test]
    async fn endpoints_report_as_kube_apiserver_does() {
        let broken = Arc::new(AtomicBool::new(false));
        let h = checks(broken.clone());
        let ready = Endpoint::Readyz;
        assert_eq!(body(h.serve(ready, None, None).await.unwrap()).await, (200, "ok".into()));
        assert_eq!(
            body(h.serve(ready, None, Some("verbose")).await.unwrap()).await,
            (200, "[+]always ok\n[+]storage ok\nreadyz check passed\n".into())
        );
        assert_eq!(body(h.serve(Endpoint::Livez, None, Some("verbose")).await.unwrap()).await.0, 200);

        broken.store(true, Ordering::Relaxed);
        assert_eq!(
            body(h.serve(ready, None, None).await.unwrap()).await,
            (500, "[+]always ok\n[-]storage failed: reason withheld\nreadyz check failed\n".into()),
            "always verbose on failure, the reason withheld"
        );
        assert_eq!(
            body(h.serve(ready, Some("storage"), None).await.unwrap()).await,
            (500, "internal server error: disk full\n".into())
        );
        assert_eq!(body(h.serve(ready, Some("always"), None).await.unwrap()).await, (200, "ok".into()));
        assert_eq!(
            body(h.serve(ready, None, Some("exclude=storage&exclude=nope&verbose")).await.unwrap()).await,
            (
                200,
                "[+]always ok\n[+]storage excluded: ok\nwarn: some health checks cannot be excluded: no matches for \
                 \"nope\"\nreadyz check passed\n"
                    .into()
            )
        );
        let missing = h.serve(ready, Some("nope"), None).await.expect_err("unknown check");
        assert_eq!(missing.status.code, 404);
    }

    #[tokio::test]
    async fn shutdown_fails_once_initiated() {
        let initiated = CancellationToken::new();
        let mut h = HealthChecks::default();
        h.add(Endpoint::Readyz, ping()).add(Endpoint::Readyz, shutdown(initiated.clone()));
        assert_eq!(body(h.serve(Endpoint::Readyz, None, None).await.unwrap()).await, (200, "ok".into()));
        initiated.cancel();
        assert_eq!(
            body(h.serve(Endpoint::Readyz, None, None).await.unwrap()).await,
            (500, "[+]ping ok\n[-]shutdown failed: reason withheld\nreadyz check failed\n".into())
        );
        assert_eq!(
            body(h.serve(Endpoint::Readyz, Some("shutdown"), None).await.unwrap()).await,
            (500, "internal server error: process is shutting down\n".into())
        );
    }
}
