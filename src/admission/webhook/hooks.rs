//! A webhook configuration's webhooks made [`Hook`]s, in the order kube-apiserver calls them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};

use super::{Hook, DEFAULT_TIMEOUT};
use crate::admission::activation;
use crate::admission::matchconditions::MatchConditions;
use crate::api::selector::Selector;

/// The fields both kinds of webhook share.
pub(super) struct HookSpec<'a> {
    pub(super) name: &'a str,
    pub(super) rules: &'a Option<Vec<RuleWithOperations>>,
    pub(super) match_policy: &'a Option<String>,
    pub(super) namespace_selector: &'a Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    pub(super) object_selector: &'a Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    pub(super) failure_policy: &'a Option<String>,
    pub(super) side_effects: &'a str,
    pub(super) timeout_seconds: Option<i32>,
    pub(super) review_versions: &'a [String],
    pub(super) reinvocation_policy: Option<&'a str>,
    pub(super) client_config: &'a WebhookClientConfig,
    pub(super) match_conditions: &'a Option<Vec<MatchCondition>>,
}

fn selector(s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>) -> Result<Selector, String> {
    s.as_ref().map_or(Ok(Selector::default()), Selector::from_label_selector)
}

pub(super) fn mutating_spec(h: &MutatingWebhook) -> HookSpec<'_> {
    HookSpec {
        name: &h.name,
        rules: &h.rules,
        match_policy: &h.match_policy,
        namespace_selector: &h.namespace_selector,
        object_selector: &h.object_selector,
        failure_policy: &h.failure_policy,
        side_effects: &h.side_effects,
        timeout_seconds: h.timeout_seconds,
        review_versions: &h.admission_review_versions,
        reinvocation_policy: h.reinvocation_policy.as_deref(),
        client_config: &h.client_config,
        match_conditions: &h.match_conditions,
    }
}

pub(super) fn validating_spec(h: &ValidatingWebhook) -> HookSpec<'_> {
    HookSpec {
        name: &h.name,
        rules: &h.rules,
        match_policy: &h.match_policy,
        namespace_selector: &h.namespace_selector,
        object_selector: &h.object_selector,
        failure_policy: &h.failure_policy,
        side_effects: &h.side_effects,
        timeout_seconds: h.timeout_seconds,
        review_versions: &h.admission_review_versions,
        reinvocation_policy: None,
        client_config: &h.client_config,
        match_conditions: &h.match_conditions,
    }
}

/// The webhooks of `configurations` in the order kube-apiserver calls them: configurations by name, webhooks as
/// listed.
fn hooks_of<'a, C: 'a>(
    configurations: impl IntoIterator<Item = &'a C>,
    name_of: impl Fn(&C) -> &str,
    specs: impl Fn(&'a C) -> Vec<HookSpec<'a>>,
) -> Vec<Arc<Hook>> {
    let mut configurations: Vec<&C> = configurations.into_iter().collect();
    configurations.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    let mut hooks = Vec::new();
    for c in configurations {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for h in specs(c) {
            let n = seen.entry(h.name).or_default();
            let uid = format!("{}/{}/{n}", name_of(c), h.name);
            *n += 1;
            hooks.push(Arc::new(Hook {
                uid,
                configuration: name_of(c).to_owned(),
                name: h.name.to_owned(),
                rules: h.rules.clone().unwrap_or_default(),
                match_policy: h.match_policy.clone(),
                namespace_selector: selector(h.namespace_selector),
                object_selector: selector(h.object_selector),
                ignore_failures: h.failure_policy.as_deref() == Some("Ignore"),
                side_effects: Some(h.side_effects.to_owned()).filter(|s| !s.is_empty()),
                timeout: h
                    .timeout_seconds
                    .map_or(DEFAULT_TIMEOUT, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0).max(1))),
                review_versions: h.review_versions.to_vec(),
                reinvoke_if_needed: h.reinvocation_policy == Some("IfNeeded"),
                client_config: h.client_config.clone(),
                match_conditions: Arc::new(MatchConditions::compile(
                    h.match_conditions.as_deref().unwrap_or_default(),
                    activation::DECLARED,
                )),
            }));
        }
    }
    hooks
}

pub(super) fn mutating_hooks_of<'a>(
    configs: impl IntoIterator<Item = &'a MutatingWebhookConfiguration>,
) -> Vec<Arc<Hook>> {
    hooks_of(
        configs,
        |c: &MutatingWebhookConfiguration| c.metadata.name.as_deref().unwrap_or(""),
        |c| c.webhooks.iter().flatten().map(mutating_spec).collect(),
    )
}

pub(super) fn validating_hooks_of<'a>(
    configs: impl IntoIterator<Item = &'a ValidatingWebhookConfiguration>,
) -> Vec<Arc<Hook>> {
    hooks_of(
        configs,
        |c: &ValidatingWebhookConfiguration| c.metadata.name.as_deref().unwrap_or(""),
        |c| c.webhooks.iter().flatten().map(validating_spec).collect(),
    )
}
