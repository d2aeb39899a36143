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
fn reinvocation_reruns_only_earlier_ifneeded_invocations_once_and_each_plugin_keeps_its_own() {
    let mut r = Reinvocation::default();
    let object = serde_json::json!({"a": 1});
    let mut p = r.plugin("P");
    p.begin(Some(&object));
    p.invoked("a", false, true);
    p.invoked("b", false, false);
    p.end(Some(&object));
    assert!(!r.start_next_round(), "nothing changed the object");
    // A later plugin changes it: P's IfNeeded invocation runs again in the second round, once.
    let mut q = r.plugin("Q");
    q.begin(Some(&object));
    q.invoked("a", true, false);
    let changed = serde_json::json!({"a": 2});
    q.end(Some(&changed));
    assert!(r.start_next_round());
    let mut p = r.plugin("P");
    assert!(p.is_reinvoke());
    p.begin(Some(&changed));
    assert!(!p.skips("a") && p.skips("b"), "only the IfNeeded invocation reruns");
    // Q's bookkeeping is its own: its "a" is not P's.
    let q = r.plugin("Q");
    assert!(q.skips("a"));
    assert!(!r.start_next_round(), "one extra round at most");

    // A plugin whose own output nothing changed after it sits the second round out, though another plugin's
    // change started it: the first round's output is what its turn compares.
    let mut r = Reinvocation::default();
    let mut q = r.plugin("Q");
    q.begin(Some(&object));
    q.invoked("a", true, false);
    q.end(Some(&changed));
    let mut p = r.plugin("P");
    p.begin(Some(&changed));
    p.invoked("a", false, true);
    p.end(Some(&changed));
    assert!(r.start_next_round());
    let mut p = r.plugin("P");
    p.begin(Some(&changed));
    assert!(p.skips("a"), "nothing changed the object since P returned it");

    // A change with no IfNeeded invocation anywhere: a second round would run nothing, and is not started.
    let mut r = Reinvocation::default();
    let mut q = r.plugin("Q");
    q.begin(Some(&object));
    q.invoked("a", true, false);
    q.end(Some(&changed));
    assert!(!r.start_next_round());
}
