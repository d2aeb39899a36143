//! `WithAuthentication`: who is asking, from the connection's client certificate, the front proxy's headers or a
//! bearer token ([`Authenticator`]). The identity headers and the token are removed from the request either way;
//! the filters after this one and the handler read the user from the request's extensions, the log line from its
//! [`LogContext`]. A request nobody
//! vouches for is answered 401, and audited as kube-apiserver's `WithFailedAuthenticationAudit` does.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::{Filter, Next};
use crate::apiserver::audit::Auditor;
use crate::apiserver::auth::{Authenticator, ConnInfo};
use crate::apiserver::context::{Authenticated, LogContext};
use crate::apiserver::error::ApiError;

pub struct Authentication {
    pub authenticator: Authenticator,
    pub audit: Option<Auditor>,
}

impl Filter for Authentication {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let outcome = match &conn {
            // Boxed: the reviews it may run make a large future, which a request would otherwise carry throughout.
            Some(conn) => Box::pin(self.authenticator.authenticate(conn, req.headers_mut())).await,
            None => Err(ApiError::unauthorized()),
        };
        match outcome {
            Ok(user) => {
                let user = Arc::new(user);
                if let Some(log) = req.extensions().get::<Arc<LogContext>>() {
                    log.set_user(user.clone());
                }
                req.extensions_mut().insert(Authenticated(user));
                next.run(req).await
            }
            Err(e) => {
                let resp = e.into_response();
                match &self.audit {
                    Some(audit) => audit.failed_request(&mut req, resp),
                    None => resp,
                }
            }
        }
    }
}
