//! The server's authorizer as CEL's `authorizer` library asks it (admission's match conditions and policies):
//! the same SubjectAccessReviews through the main API server, and the same cache, as a request's own
//! authorization. CEL is synchronous: a check blocks its thread, so admission evaluates expressions that ask it
//! on a blocking thread, never on the runtime's workers.

use std::sync::Arc;

use super::authz::Authorizer;
use crate::api::UserInfo;
use crate::apiserver::request::{Attributes, ResourceAttrs};
use crate::cel::{self, Check, Decision};

pub struct ExpressionAuthorizer {
    authorizer: Arc<Authorizer>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for ExpressionAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExpressionAuthorizer")
    }
}

impl ExpressionAuthorizer {
    /// Checks go to `authorizer`, their requests run on the current runtime.
    pub fn new(authorizer: Arc<Authorizer>) -> Self {
        Self { authorizer, runtime: tokio::runtime::Handle::current() }
    }
}

/// What a check asks, as `library/authz.go` builds its attributes: a resource in any version (`*`), or a path.
fn attributes(verb: &str, check: &Check) -> Attributes {
    match check {
        Check::Resource(r) => Attributes {
            verb: verb.to_owned(),
            path: String::new(),
            resource: Some(ResourceAttrs {
                group: r.group.clone(),
                version: "*".into(),
                resource: r.resource.clone(),
                subresource: r.subresource.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            }),
        },
        Check::Path(path) => Attributes {
            verb: verb.to_owned(),
            path: if path.starts_with('/') { path.clone() } else { format!("/{path}") },
            resource: None,
        },
    }
}

impl cel::Authorizer for ExpressionAuthorizer {
    fn authorize(&self, user: &UserInfo, verb: &str, check: &Check) -> Decision {
        let attrs = attributes(verb, check);
        match self.runtime.block_on(self.authorizer.decide(user, &attrs)) {
            Ok(reason) => Decision { allowed: true, reason, error: None },
            Err(refusal) => match refusal.reason {
                Some(reason) => Decision { allowed: false, reason, error: None },
                // No decision: the main API server could not be asked.
                None => Decision { allowed: false, reason: String::new(), error: Some(refusal.error.status.message) },
            },
        }
    }
}
