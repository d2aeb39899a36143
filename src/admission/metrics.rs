//! Admission's metrics, under k8s.io/apiserver's names: each step's and webhook's latency and rejections, the
//! policies' checks, match conditions, and the sources and manifests they come from.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families, HistogramFamily};

/// `apiserver_admission_step_admission_duration_seconds`' labels: `type` is `admit` or `validate`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionStepLabels {
    pub r#type: String,
    pub operation: String,
    pub rejected: String,
}

/// `apiserver_admission_webhook_admission_duration_seconds`' labels: `type` is `admit` or `validating`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionWebhookLabels {
    pub name: String,
    pub r#type: String,
    pub operation: String,
    pub rejected: String,
}

/// `apiserver_admission_controller_admission_duration_seconds`' labels (one plugin's phase): `type` is `admit` or
/// `validate`.
pub type AdmissionControllerLabels = AdmissionWebhookLabels;

/// `apiserver_admission_webhook_rejection_count`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionRejectionLabels {
    pub name: String,
    pub r#type: String,
    pub operation: String,
    /// `calling_webhook_error`, `no_error` (the webhook said no) or `apiserver_internal_error`.
    pub error_type: String,
    pub rejection_code: String,
}

/// A webhook's or a policy's match conditions: `name` the webhook's or policy's, `kind` `webhook` or `policy`,
/// `type` as kube labels it (`admit`, `validating`, `validate`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MatchConditionLabels {
    pub name: String,
    pub kind: String,
    pub r#type: String,
    pub operation: String,
}

/// One ValidatingAdmissionPolicy check (`validating/metrics`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyCheckLabels {
    pub policy: String,
    pub policy_binding: String,
    /// `no_error`, `compile_error`, `invalid_error` or `out_of_budget`.
    pub error_type: String,
    /// `allow`, `deny`, `warn` or `audit`.
    pub enforcement_action: String,
}

/// One MutatingAdmissionPolicy mutation (`mutating/metrics`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MutatingPolicyCheckLabels {
    pub policy: String,
    pub policy_binding: String,
    /// `no_error`, `compile_error`, `invalid_error` or `out_of_budget`.
    pub error_type: String,
}

/// Whether a policy plugin watches the cluster's policies, or why not (one state of a plugin is 1).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicySourceLabels {
    pub plugin: String,
    /// `watching`, `not_served`, `forbidden` or `unreachable`.
    pub state: String,
}

/// A manifest directory's reloads (k8s.io/apiserver's `manifest` controller metrics).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManifestReloadLabels {
    /// `success` or `failure`.
    pub status: String,
    pub plugin: String,
    pub apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManifestConfigLabels {
    pub plugin: String,
    pub apiserver_id_hash: String,
    pub hash: String,
}

/// Admission, as k8s.io/apiserver's `admission/metrics`.
#[derive(Debug)]
pub struct AdmissionMetrics {
    pub step_duration: HistogramFamily<AdmissionStepLabels>,
    pub controller_duration: HistogramFamily<AdmissionControllerLabels>,
    pub webhook_duration: HistogramFamily<AdmissionWebhookLabels>,
    pub webhook_rejections: Family<AdmissionRejectionLabels, Counter>,
    pub match_condition_errors: Family<MatchConditionLabels, Counter>,
    pub match_condition_exclusions: Family<MatchConditionLabels, Counter>,
    pub match_condition_duration: HistogramFamily<MatchConditionLabels>,
    pub policy_checks: Family<PolicyCheckLabels, Counter>,
    pub policy_check_duration: HistogramFamily<PolicyCheckLabels>,
    pub mutating_policy_checks: Family<MutatingPolicyCheckLabels, Counter>,
    pub mutating_policy_check_duration: HistogramFamily<MutatingPolicyCheckLabels>,
    pub manifest_reloads: Family<ManifestReloadLabels, Counter>,
    pub manifest_reload_last_timestamp: Family<ManifestReloadLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub manifest_config_info: Family<ManifestConfigLabels, Gauge>,
    pub policy_source: Family<PolicySourceLabels, Gauge>,
    /// Each plugin's series of `manifest_config_info`, to replace when its manifests change.
    manifest_last: parking_lot::Mutex<std::collections::BTreeMap<String, ManifestConfigLabels>>,
}

impl AdmissionMetrics {
    /// A manifest directory read again: `ok` whether its objects are now in force.
    pub fn manifest_reloaded(&self, plugin: &str, apiserver_id_hash: &str, ok: bool) {
        let status = if ok { "success" } else { "failure" }.to_owned();
        let labels =
            ManifestReloadLabels { status, plugin: plugin.to_owned(), apiserver_id_hash: apiserver_id_hash.to_owned() };
        self.manifest_reloads.get_or_create(&labels).inc();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.manifest_reload_last_timestamp.get_or_create(&labels).set(now.as_secs_f64());
    }

    /// The manifests now in force for `plugin`: its series alone is 1.
    pub fn manifest_loaded(&self, plugin: &str, apiserver_id_hash: &str, hash: &str) {
        let labels = ManifestConfigLabels {
            plugin: plugin.to_owned(),
            apiserver_id_hash: apiserver_id_hash.to_owned(),
            hash: hash.to_owned(),
        };
        if let Some(old) = self.manifest_last.lock().insert(plugin.to_owned(), labels.clone()) {
            self.manifest_config_info.remove(&old);
        }
        self.manifest_config_info.get_or_create(&labels).set(1);
    }
}

/// k8s.io/apiserver's admission latency buckets.
fn admission_histogram() -> Histogram {
    Histogram::new([0.005, 0.025, 0.1, 0.5, 2.5])
}

impl AdmissionMetrics {
    fn new() -> Self {
        Self {
            step_duration: Family::new_with_constructor(admission_histogram),
            controller_duration: Family::new_with_constructor(admission_histogram),
            webhook_duration: Family::new_with_constructor(admission_histogram),
            webhook_rejections: Family::default(),
            match_condition_errors: Family::default(),
            match_condition_exclusions: Family::default(),
            match_condition_duration: Family::new_with_constructor(|| {
                Histogram::new([0.001, 0.005, 0.01, 0.025, 0.1, 0.2, 0.25])
            }),
            policy_checks: Family::default(),
            policy_check_duration: Family::new_with_constructor(|| Histogram::new([0.0000005, 0.001, 0.01, 0.1, 1.0])),
            mutating_policy_checks: Family::default(),
            mutating_policy_check_duration: Family::new_with_constructor(|| {
                Histogram::new([0.0000005, 0.001, 0.01, 0.1, 1.0])
            }),
            manifest_reloads: Family::default(),
            manifest_reload_last_timestamp: Family::default(),
            manifest_config_info: Family::default(),
            manifest_last: Default::default(),
            policy_source: Family::default(),
        }
    }
}

impl Families for AdmissionMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "apiserver_admission_step_admission_duration_seconds",
            "Admission sub-step latency histogram in seconds, broken out for each operation and API resource and \
             step type (validate or admit).",
            self.step_duration.clone(),
        );
        r.register(
            "apiserver_admission_controller_admission_duration_seconds",
            "Admission controller latency histogram in seconds, identified by name and broken out for each operation \
             and API resource and type (validate or admit).",
            self.controller_duration.clone(),
        );
        r.register(
            "apiserver_admission_webhook_admission_duration_seconds",
            "Admission webhook latency histogram in seconds, identified by name and broken out for each operation \
             and API resource and type (validate or admit).",
            self.webhook_duration.clone(),
        );
        r.register(
            "apiserver_admission_webhook_rejection_count",
            "Admission webhook rejection count, identified by name and broken out for each admission type \
             (validating or admit) and operation. Additional labels specify an error type (calling_webhook_error or \
             apiserver_internal_error if an error occurred; no_error otherwise) and optionally a non-zero rejection \
             code if the webhook rejects the request with an HTTP status code (honored by the apiserver when the \
             code is greater or equal to 400). Codes greater than 600 are truncated to 600, to keep the metrics \
             cardinality bounded.",
            self.webhook_rejections.clone(),
        );
        r.register(
            "apiserver_admission_match_condition_evaluation_errors",
            "Admission match condition evaluation errors count, identified by name of resource containing the match \
             condition and broken out for each kind containing matchConditions (webhook or policy), operation and \
             admission type (validate or admit).",
            self.match_condition_errors.clone(),
        );
        r.register(
            "apiserver_admission_match_condition_exclusions",
            "Admission match condition evaluation exclusions count, identified by name of resource containing the \
             match condition and broken out for each kind containing matchConditions (webhook or policy), operation \
             and admission type (validate or admit).",
            self.match_condition_exclusions.clone(),
        );
        r.register(
            "apiserver_admission_match_condition_evaluation_seconds",
            "Admission match condition evaluation time in seconds, identified by name and broken out for each kind \
             containing matchConditions (webhook or policy), operation and type (validate or admit).",
            self.match_condition_duration.clone(),
        );
        r.register(
            "apiserver_validating_admission_policy_check",
            "Validation admission policy check total, labeled by policy and further identified by binding and \
             enforcement action taken.",
            self.policy_checks.clone(),
        );
        r.register(
            "apiserver_validating_admission_policy_check_duration_seconds",
            "Validation admission latency for individual validation expressions in seconds, labeled by policy and \
             further including binding and enforcement action taken.",
            self.policy_check_duration.clone(),
        );
        r.register(
            "apiserver_mutating_admission_policy_check",
            "Mutation admission policy check total, labeled by policy and further identified by binding.",
            self.mutating_policy_checks.clone(),
        );
        r.register(
            "apiserver_mutating_admission_policy_check_duration_seconds",
            "Mutation admission latency for individual mutation expressions in seconds, labeled by policy and binding.",
            self.mutating_policy_check_duration.clone(),
        );
        r.register(
            "apiserver_manifest_admission_config_controller_automatic_reloads",
            "Total number of automatic reloads of manifest-based admission configuration split by status, plugin, \
             and apiserver identity.",
            self.manifest_reloads.clone(),
        );
        r.register(
            "apiserver_manifest_admission_config_controller_automatic_reload_last_timestamp_seconds",
            "Timestamp of the last automatic reload of manifest-based admission configuration split by status, \
             plugin, and apiserver identity.",
            self.manifest_reload_last_timestamp.clone(),
        );
        r.register(
            "apiserver_manifest_admission_config_controller_last_config_info",
            "Information about the last applied manifest-based admission configuration with hash as label, split by \
             plugin and apiserver identity.",
            self.manifest_config_info.clone(),
        );
        r.register(
            "podset_admission_policy_source",
            "Whether an admission policy plugin watches the cluster's policies (state=watching) or why it does not \
             (not_served: the main API server has no such API; forbidden: RBAC; unreachable).",
            self.policy_source.clone(),
        );
    }
}

static METRICS: LazyLock<AdmissionMetrics> = LazyLock::new(|| registered(AdmissionMetrics::new()));

/// The process's admission metrics, registered on first use.
pub fn metrics() -> &'static AdmissionMetrics {
    &METRICS
}
