//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook: the cluster's webhook configurations
//! (`admissionregistration.k8s.io/v1`, watched from the main API server), which of their webhooks a request
//! concerns, and calling them as k8s.io/apiserver's mutating and validating dispatchers do.

mod client;
mod configurations;
mod dispatch;
mod hooks;
pub mod manifests;
mod mutating;
mod review;
pub(crate) mod rules;
#[cfg(test)]
pub(crate) mod tests;
mod validating;
mod verify;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{RuleWithOperations, WebhookClientConfig};

pub use client::{CallError, WebhookClients};
pub use configurations::{StaticWebhooks, WebhookConfigurations};
pub use mutating::MutatingWebhooks;
pub use validating::ValidatingWebhooks;
pub use verify::san_names;

use super::manifest;
use super::matchconditions::MatchConditions;
use super::{Error, Outcome};
use crate::api::selector::Selector;

/// A webhook's wait when its configuration gives no `timeoutSeconds` (v1's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// One webhook of a configuration, ready to match and call.
#[derive(Debug)]
pub struct Hook {
    /// `<configuration>/<webhook>/<n>`: webhook names need not be unique within a configuration.
    uid: String,
    configuration: String,
    name: String,
    rules: Vec<RuleWithOperations>,
    /// `Exact`, or `Equivalent` (v1's default: also called for the same resource in another served version).
    match_policy: Option<String>,
    namespace_selector: Result<Selector, String>,
    object_selector: Result<Selector, String>,
    ignore_failures: bool,
    side_effects: Option<String>,
    timeout: Duration,
    review_versions: Vec<String>,
    reinvoke_if_needed: bool,
    client_config: WebhookClientConfig,
    /// Compiled when the configuration is read; an expression that does not compile fails when evaluated.
    match_conditions: Arc<MatchConditions>,
}

impl Hook {
    /// Names it in the request's audit annotations when it comes from a manifest.
    fn record_source(&self, out: &mut Outcome) {
        if self.configuration.ends_with(manifest::STATIC_SUFFIX) {
            manifest::record_source(out, manifest::MANIFEST_WEBHOOKS_ANNOTATION, &self.name);
        }
    }

    fn configuration_error(&self, message: &str) -> Error {
        Error::Configuration { webhook: self.name.clone(), message: message.to_owned() }
    }
}
