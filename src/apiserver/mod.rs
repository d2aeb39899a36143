//! The HTTPS server: rustls (HTTP/2 and HTTP/1.1), delegated authentication and authorization, the axum app,
//! graceful shutdown.

pub mod audit;
pub mod auth;
pub mod context;
pub mod discovery;
pub mod error;
pub mod filters;
#[cfg(test)]
mod golden;
mod handlers;
pub mod health;
mod instrument;
pub(crate) mod metrics;
pub mod negotiate;
mod render;
pub mod request;
pub mod routes;
pub mod self_signed;
pub mod serving_cert;
mod status;
pub mod tls;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

pub use handlers::{App, MAX_BODY_BYTES};
pub use watch::WatchConfig;

use self::routes::Routes;
use auth::{Authenticator, Authorizer, ConnInfo};
use filters::goaway::ConnectionGoaway;
use filters::FilterLayer;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct ServerConfig {
    pub tls: rustls::ServerConfig,
    pub authenticator: Authenticator,
    /// Shared with admission's CEL expressions (`authorizer`).
    pub authorizer: Arc<Authorizer>,
    pub bookmark_interval: Duration,
    /// How long in-flight requests may take to finish after shutdown starts.
    pub shutdown_grace: Duration,
    /// `--http2-max-streams-per-connection`.
    pub http2_max_streams: u32,
    pub health: health::HealthChecks,
    /// `--max-requests-inflight`, `--max-mutating-requests-inflight`.
    pub max_in_flight: filters::MaxInFlight,
    /// `--request-timeout`: longer-running requests (but watches) get 504.
    pub request_timeout: Duration,
    /// `--min-request-timeout`: watches end after [this, twice this).
    pub min_request_timeout: Duration,
    /// `--audit-*`: where audit events go.
    pub audit: Option<audit::Auditor>,
    /// `--goaway-chance`.
    pub goaway_chance: f64,
}

/// HTTP/1.1 and HTTP/2 as k8s.io/apiserver serves them: at most `max_streams` streams a connection, 256 KiB
/// read frames and per-stream window, a connection window of 256 KiB per stream (so every stream can fill its
/// own), and pings that find a dead peer holding thousands of watches.
fn connection_builder(max_streams: u32) -> auto::Builder<TokioExecutor> {
    const PER_STREAM: u32 = 256 << 10;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(max_streams)
        .max_frame_size(PER_STREAM)
        .initial_stream_window_size(PER_STREAM)
        .initial_connection_window_size(PER_STREAM.saturating_mul(max_streams).min(i32::MAX as u32))
        .keep_alive_interval(Some(HTTP2_PING_INTERVAL))
        .keep_alive_timeout(HTTP2_PING_TIMEOUT);
    builder
}

/// How often an HTTP/2 connection is pinged, and how long its answer may take before the connection is closed.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The filters built from the configuration.
struct Filters {
    authentication: FilterLayer<filters::authentication::Authentication>,
    audit: FilterLayer<filters::audit::Audit>,
    max_in_flight: FilterLayer<filters::MaxInFlight>,
    authorization: FilterLayer<filters::authorization::Authorization>,
    timeout: filters::RequestTimeoutLayer,
    goaway: FilterLayer<filters::goaway::ProbabilisticGoaway>,
}

/// A bound, not yet serving, server.
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
    /// The filters every request passes before the handler, outermost last.
    filters: Filters,
    acceptor: TlsAcceptor,
    shutdown_grace: Duration,
    /// How each accepted connection is served (HTTP/1.1 or HTTP/2 and its settings).
    connections: auto::Builder<TokioExecutor>,
}

impl Server {
    pub async fn bind(
        addr: SocketAddr,
        routes: Routes,
        cfg: ServerConfig,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let discovery = discovery::Discovery::build(&routes.described());
        let filters = Filters {
            authentication: FilterLayer::new(filters::authentication::Authentication {
                authenticator: cfg.authenticator,
                audit: cfg.audit.clone(),
            }),
            timeout: filters::RequestTimeoutLayer::new(cfg.request_timeout, cfg.audit.clone()),
            audit: FilterLayer::new(filters::audit::Audit(cfg.audit)),
            max_in_flight: FilterLayer::new(cfg.max_in_flight),
            authorization: FilterLayer::new(filters::authorization::Authorization(cfg.authorizer)),
            goaway: FilterLayer::new(filters::goaway::ProbabilisticGoaway::new(cfg.goaway_chance)),
        };
        let app = Arc::new(App {
            routes: Arc::new(routes),
            discovery,
            watch: WatchConfig {
                bookmark_interval: cfg.bookmark_interval,
                min_request_timeout: cfg.min_request_timeout,
                shutdown,
            },
            health: cfg.health,
        });
        Ok(Self {
            listener,
            app,
            filters,
            acceptor: TlsAcceptor::from(Arc::new(cfg.tls)),
            shutdown_grace: cfg.shutdown_grace,
            connections: connection_builder(cfg.http2_max_streams),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the shutdown token fires, then lets in-flight requests finish (watches end at once).
    pub async fn serve(self) {
        let f = self.filters;
        let handler = Router::new().fallback(handlers::handle).with_state(self.app.clone());
        // k8s.io/apiserver's `DefaultBuildHandlerChain`, outermost first. Built around the router, not with
        // `Router::layer`, which boxes each layer and clones the boxes on every request.
        let chain = tower::ServiceBuilder::new()
            .layer(FilterLayer::new(filters::audit_init::AuditInit))
            .layer(FilterLayer::new(filters::panics::PanicRecovery))
            .layer(filters::RequestInfoLayer(self.app.routes.clone()))
            .layer(FilterLayer::new(filters::httplog::HttpLog))
            .layer(f.goaway)
            .layer(f.timeout)
            .layer(FilterLayer::new(filters::instrument::Instrument))
            .layer(f.authentication)
            .layer(FilterLayer::new(filters::traces::Tracing))
            .layer(f.audit)
            .layer(FilterLayer::new(filters::impersonation::Impersonation))
            .layer(f.max_in_flight)
            .layer(f.authorization)
            .service(handler);
        // Every connection's task, so shutdown can wait for them.
        let connections = TaskTracker::new();
        let shutdown = self.app.watch.shutdown.clone();
        loop {
            let (tcp, remote) = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = self.acceptor.clone();
            let chain = chain.clone();
            let builder = self.connections.clone();
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let conn = ConnInfo::new(remote, tls.get_ref().1.peer_certificates());
                let goaway = ConnectionGoaway::default();
                let asked = goaway.clone();
                let svc = chain.map_request(move |req: axum::extract::Request<hyper::body::Incoming>| {
                    let mut req = req.map(axum::body::Body::new);
                    req.extensions_mut().insert(conn.clone());
                    req.extensions_mut().insert(goaway.clone());
                    req
                });
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc));
                let mut connection = std::pin::pin!(connection);
                // Shutdown, or a GOAWAY asked for by a request: a graceful close (HTTP/2's GOAWAY, or no
                // keep-alive), open requests answered first.
                let ended = tokio::select! {
                    ended = connection.as_mut() => ended,
                    _ = async { tokio::select! { _ = shutdown.cancelled() => {}, _ = asked.requested() => {} } } => {
                        connection.as_mut().graceful_shutdown();
                        connection.await
                    }
                };
                if let Err(e) = ended {
                    tracing::debug!(%remote, error = %e, "connection ended with an error");
                }
            });
        }
        drop(self.listener);
        connections.close();
        tracing::info!("shutting down: waiting for in-flight requests");
        if tokio::time::timeout(self.shutdown_grace, connections.wait()).await.is_err() {
            tracing::warn!("in-flight requests did not finish within {:?}", self.shutdown_grace);
        }
    }
}
