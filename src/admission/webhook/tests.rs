use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingWebhook, ValidatingWebhookConfiguration,
};
use serde_json::Value;

use super::hooks::{mutating_hooks_of, validating_hooks_of};
use super::*;
use crate::admission::{Attributes, Reinvocation};
use crate::api::{Operation, Subresource, UserInfo};

pub(crate) fn attrs(op: Operation, sub: Subresource) -> Attributes {
    crate::admission::testing::attributes(op, sub, "default", "web", UserInfo::named("jane", vec![]))
}

/// A validating webhook from its JSON (name and rules at least), as the API server would default it.
pub(crate) fn hook(mut v: Value) -> Hook {
    let m = v.as_object_mut().unwrap();
    m.entry("sideEffects").or_insert("None".into());
    m.entry("admissionReviewVersions").or_insert(serde_json::json!(["v1"]));
    m.entry("clientConfig").or_insert(serde_json::json!({"url": "https://127.0.0.1:1/"}));
    let h: ValidatingWebhook = serde_json::from_value(v).unwrap();
    let c = ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta { name: Some("c".into()), ..Default::default() },
        webhooks: Some(vec![h]),
    };
    Arc::into_inner(validating_hooks_of([&c]).remove(0)).unwrap()
}

#[test]
fn webhooks_run_in_configuration_name_order_with_unique_uids() {
    let config = |name: &str, hooks: &[&str]| MutatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        webhooks: Some(
            hooks
                .iter()
                .map(|h| MutatingWebhook { name: (*h).into(), side_effects: "None".into(), ..Default::default() })
                .collect(),
        ),
    };
    let hooks = mutating_hooks_of(&[config("b", &["x.example.com"]), config("a", &["y.example.com", "y.example.com"])]);
    let uids: Vec<&str> = hooks.iter().map(|h| h.uid.as_str()).collect();
    assert_eq!(uids, ["a/y.example.com/0", "a/y.example.com/1", "b/x.example.com/0"]);
    assert_eq!(hooks[0].timeout, DEFAULT_TIMEOUT);
    assert!(!hooks[0].ignore_failures, "no failurePolicy fails closed");
}

#[test]
fn reinvocation_reruns_only_earlier_ifneeded_webhooks_once() {
    let mut r = Reinvocation::default();
    r.previously_invoked.insert("a".into());
    assert!(!r.start_next_round(), "nothing changed the object");
    r.require_reinvoking_previously_invoked();
    r.should_reinvoke = true;
    assert!(r.start_next_round());
    assert!(r.to_reinvoke.contains("a") && r.previously_invoked.is_empty());
    assert!(!r.start_next_round(), "one extra round at most");
}
