//! `WithAuthentication`: who is asking, from the connection's client certificate, the front proxy's headers or a
//! bearer token ([`Authenticator`]). The identity headers and the token are removed from the request either way;
//! the filters after this one and the handler read the user from the request's extensions. A request nobody
//! vouches for is answered 401, and audited as kube-apiserver's `WithFailedAuthenticationAudit` does.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::{Filter, Next};
use crate::apiserver::audit::Auditor;
use crate::apiserver::auth::{Authenticator, ConnInfo, UserInfo};
use crate::apiserver::error::ApiError;

/// The authenticated user, in the request's extensions (for the filters after this one and the handler) and in
/// the answer's (for the request log line).
#[derive(Debug, Clone)]
pub struct Authenticated(pub Arc<UserInfo>);

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
                let user = Authenticated(Arc::new(user));
                req.extensions_mut().insert(user.clone());
                let mut resp = next.run(req).await;
                resp.extensions_mut().insert(user);
                resp
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
