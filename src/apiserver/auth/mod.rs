//! Delegated authentication and authorization, as k8s.io/apiserver sets them up for an aggregated API server:
//! the trust anchors (`trust`, kept current by `delegation`), who is calling (`authn`), whether they may (`authz`),
//! both asking the main API server through `review` and remembering its answers in `cache`.

pub mod authn;
pub mod authz;
pub mod cache;
pub mod delegation;
pub mod expressions;
pub(crate) mod metrics;
mod review;
pub mod trust;

pub use crate::api::UserInfo;
pub use authn::{Authenticator, ConnInfo, TokenReviewer};
pub use authz::{AlwaysAllowPaths, Authorizer, AuthorizerConfig};
pub use cache::CacheLimits;
pub use expressions::ExpressionAuthorizer;
pub use trust::{DynamicTrust, RequestHeader, Trust};
