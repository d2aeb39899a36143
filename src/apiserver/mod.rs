//! The HTTPS server: rustls (HTTP/2 and HTTP/1.1), delegated authentication and authorization, the axum app,
//! graceful shutdown.

pub mod audit;
pub mod auth;
pub mod discovery;
pub mod error;
pub mod filters;
mod handlers;
pub mod health;
mod instrument;
pub mod negotiate;
mod render;
pub mod request;
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
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub use handlers::{App, MAX_BODY_BYTES};
pub use watch::WatchConfig;

use crate::registry::Registry;
use auth::{Authenticator, Authorizer, ConnInfo};

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct ServerConfig {
    pub tls: rustls::ServerConfig,
    pub authenticator: Authenticator,
    pub authorizer: Authorizer,
    pub bookmark_interval: Duration,
    /// How long in-flight requests may take to finish after shutdown starts.
    pub shutdown_grace: Duration,
    pub health: health::HealthChecks,
    /// `--max-requests-inflight`, `--max-mutating-requests-inflight`.
    pub max_in_flight: filters::MaxInFlight,
    /// `--request-timeout`: longer-running requests (but watches) get 504.
    pub request_timeout: Duration,
    /// `--min-request-timeout`: watches end after [this, twice this).
    pub min_request_timeout: Duration,
    /// `--audit-log-path`: an Event line per request.
    pub audit: Option<audit::AuditLog>,
}

/// A bound, not yet serving, server.
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
    acceptor: TlsAcceptor,
    shutdown_grace: Duration,
    request_timeout: Duration,
}

impl Server {
    pub async fn bind(
        addr: SocketAddr,
        registry: Registry,
        cfg: ServerConfig,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let app = Arc::new(App {
            registry,
            authenticator: cfg.authenticator,
            authorizer: cfg.authorizer,
            discovery: discovery::Discovery::build(),
            watch: WatchConfig {
                bookmark_interval: cfg.bookmark_interval,
                min_request_timeout: cfg.min_request_timeout,
                shutdown,
            },
            health: cfg.health,
            max_in_flight: cfg.max_in_flight,
            audit: cfg.audit,
        });
        Ok(Self {
            listener,
            app,
            acceptor: TlsAcceptor::from(Arc::new(cfg.tls)),
            shutdown_grace: cfg.shutdown_grace,
            request_timeout: cfg.request_timeout,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the shutdown token fires, then lets in-flight requests finish (watches end at once).
    pub async fn serve(self) {
        let router = Router::new()
            .fallback(handlers::handle)
            .with_state(self.app.clone())
            .layer(filters::RequestTimeoutLayer::new(self.request_timeout))
            // Outermost: every filter after it reads the RequestInfo it works out.
            .layer(filters::RequestInfoLayer);
        let graceful = GracefulShutdown::new();
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
            let router = router.clone();
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let conn = ConnInfo::new(remote, tls.get_ref().1.peer_certificates());
                let svc = router.map_request(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(conn.clone());
                    req
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc));
                if let Err(e) = watcher.watch(connection.into_owned()).await {
                    tracing::debug!(%remote, error = %e, "connection ended with an error");
                }
            });
        }
        drop(self.listener);
        tracing::info!("shutting down: waiting for in-flight requests");
        if tokio::time::timeout(self.shutdown_grace, graceful.shutdown()).await.is_err() {
            tracing::warn!("in-flight requests did not finish within {:?}", self.shutdown_grace);
        }
    }
}
