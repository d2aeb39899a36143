//! `WithAuthorization`: whether the user may do what the request asks ([`Authorizer`]: SubjectAccessReviews
//! against the main API server, cached); 403 if not (401 for an anonymous caller), 500 if it cannot be decided.
//! The decision and its reason go to the request's audit event, under kube's annotation keys.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::{Filter, Next};
use crate::apiserver::audit::AuditContext;
use crate::apiserver::auth::Authorizer;
use crate::apiserver::context::{info_of, Authenticated};
use crate::apiserver::error::ApiError;

pub const DECISION_ANNOTATION: &str = "authorization.k8s.io/decision";
pub const REASON_ANNOTATION: &str = "authorization.k8s.io/reason";

pub struct Authorization(pub std::sync::Arc<Authorizer>);

impl Filter for Authorization {
    async fn filter<N: Next>(self: Arc<Self>, mut req: Request, next: N) -> Response {
        let info = info_of(&mut req);
        let Some(Authenticated(user)) = req.extensions().get::<Authenticated>().cloned() else {
            return ApiError::unauthorized().into_response();
        };
        let audit = req.extensions().get::<Arc<AuditContext>>().cloned();
        // Boxed: a SubjectAccessReview's future is large.
        let decided = Box::pin(self.0.decide(&user, &info.attributes)).await;
        match decided {
            Ok(reason) => {
                if let Some(a) = &audit {
                    a.annotate(DECISION_ANNOTATION, "allow");
                    a.annotate(REASON_ANNOTATION, reason);
                }
                next.run(req).await
            }
            Err(refusal) => {
                if let Some(a) = &audit {
                    match refusal.reason {
                        Some(reason) => {
                            a.annotate(DECISION_ANNOTATION, "forbid");
                            a.annotate(REASON_ANNOTATION, reason);
                        }
                        None => a.annotate(REASON_ANNOTATION, "internal error"),
                    }
                }
                refusal.error.into_response()
            }
        }
    }
}
