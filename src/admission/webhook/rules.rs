//! Whether a webhook applies to a request: its rules (k8s.io/apiserver `webhook/rules`), objectSelector and
//! namespaceSelector (`webhook/object`, `webhook/namespace`), in the order `generic.Webhook.ShouldCallHook`
//! weighs them.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use serde_json::Value;

use super::Hook;
use crate::admission::{Attributes, Error, Namespaces};

fn exact_or_wildcard(items: Option<&Vec<String>>, requested: &str) -> bool {
    items.into_iter().flatten().any(|i| i == "*" || i == requested)
}

/// One rule against the request, its resource taken in `version`.
pub(crate) fn rule_matches(rule: &RuleWithOperations, a: &Attributes, version: &str) -> bool {
    let namespaced = !a.namespace.is_empty();
    let scope = match rule.scope.as_deref() {
        None | Some("*") => true,
        Some("Namespaced") => namespaced,
        Some("Cluster") => !namespaced,
        Some(_) => false,
    };
    let operation = exact_or_wildcard(rule.operations.as_ref(), a.operation.as_str());
    let group = exact_or_wildcard(rule.api_groups.as_ref(), &a.resource.group);
    let version = exact_or_wildcard(rule.api_versions.as_ref(), version);
    let resource = rule.resources.iter().flatten().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r, ""));
        (res == "*" || res == a.resource.resource) && (sub == "*" || sub == a.subresource.as_str())
    });
    scope && operation && group && version && resource
}

fn labels(object: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let labels = object?.get("metadata")?.get("labels");
    Some(labels.and_then(|l| serde_json::from_value(l.clone()).ok()).unwrap_or_default())
}

/// The version of the resource `hook` is called with, as `ShouldCallHook` finds its invocation: the request's when
/// a rule names it, else, under `matchPolicy: Equivalent` (the default), the first other served version of the same
/// resource a rule names.
fn invocation_version(hook: &Hook, a: &Attributes) -> Option<String> {
    let requested = a.resource.version.as_str();
    if hook.rules.iter().any(|r| rule_matches(r, a, requested)) {
        return Some(requested.to_owned());
    }
    if hook.match_policy.as_deref() == Some("Exact") {
        return None;
    }
    let others = a.interfaces.versions().iter().map(|v| v.name).filter(|v| *v != requested);
    others.into_iter().find(|v| hook.rules.iter().any(|r| rule_matches(r, a, v))).map(|v| v.to_string())
}

/// Whether `hook` is called for this request, and with which version of the resource (see
/// [`invocation_version`]). Errors (a namespace that does not exist, a selector that does not parse) count only
/// for a webhook whose rules match, and not when the other selector already excludes it.
pub(crate) async fn should_call(
    hook: &Hook,
    a: &Attributes,
    object: Option<&Value>,
    old: Option<&Value>,
    namespaces: &Namespaces,
) -> Result<Option<String>, Error> {
    let Some(version) = invocation_version(hook, a) else { return Ok(None) };
    let by_object = match &hook.object_selector {
        Err(e) => Err(hook.configuration_error(e)),
        Ok(s) if s.is_empty() => Ok(true),
        Ok(s) => Ok([object, old].into_iter().any(|o| labels(o).is_some_and(|l| s.matches(&l)))),
    };
    if matches!(by_object, Ok(false)) {
        return Ok(None);
    }
    let by_namespace = match &hook.namespace_selector {
        _ if a.namespace.is_empty() => Ok(true),
        Err(e) => Err(hook.configuration_error(e)),
        Ok(s) if s.is_empty() => Ok(true),
        Ok(s) => namespaces.get(&a.namespace).await.map(|ns| {
            let empty = BTreeMap::new();
            s.matches(ns.metadata.labels.as_ref().unwrap_or(&empty))
        }),
    };
    Ok((by_namespace? && by_object?).then_some(version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::webhook::tests::{attrs, hook};
    use crate::api::{Operation, Subresource};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::ObjectMeta;
    use serde_json::json;

    fn rule(v: Value) -> RuleWithOperations {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rules_match_groups_versions_resources_subresources_operations_and_scope() {
        let create = attrs(Operation::Create, Subresource::Main);
        let scale = attrs(Operation::Update, Subresource::Scale);
        let status = attrs(Operation::Update, Subresource::Status);
        let cases = [
            (
                json!({"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1alpha1"], "resources": ["podsets"], "operations": ["CREATE"]}),
                [true, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}),
                [true, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"]}),
                [true, true, true],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["podsets/*"], "operations": ["UPDATE"]}),
                [false, true, true],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["podsets/scale"], "operations": ["*"]}),
                [false, true, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/status"], "operations": ["*"]}),
                [false, false, true],
            ),
            (
                json!({"apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"]}),
                [false, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["v1"], "resources": ["*/*"], "operations": ["*"]}),
                [false, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["configmaps"], "operations": ["*"]}),
                [false, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["DELETE"]}),
                [false, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"], "scope": "Namespaced"}),
                [true, true, true],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"], "scope": "Cluster"}),
                [false, false, false],
            ),
            (
                json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"], "scope": "*"}),
                [true, true, true],
            ),
        ];
        for (r, want) in cases {
            let r = rule(r);
            let got = [&create, &scale, &status].map(|a| rule_matches(&r, a, &a.resource.version));
            assert_eq!(got, want, "{r:?}");
        }
        let mut cluster_wide = attrs(Operation::Create, Subresource::Main);
        cluster_wide.namespace.clear();
        let r = rule(
            json!({"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"], "scope": "Cluster"}),
        );
        assert!(rule_matches(&r, &cluster_wide, "v1alpha1"));
    }

    fn namespace(name: &str, labels: Value) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: serde_json::from_value(labels).unwrap(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn selectors_look_at_the_namespace_and_at_the_object_or_the_old_object() {
        let namespaces =
            Namespaces::fixed(vec![namespace("default", json!({"env": "prod"})), namespace("dev", json!({}))]);
        let mut a = attrs(Operation::Update, Subresource::Main);
        let labelled = json!({"metadata": {"labels": {"app": "web"}}});
        let bare = json!({"metadata": {}});
        let all = json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"]}]);

        let h = hook(
            json!({"name": "ns.example.com", "rules": all, "namespaceSelector": {"matchLabels": {"env": "prod"}}}),
        );
        assert!(should_call(&h, &a, Some(&bare), None, &namespaces).await.unwrap().is_some());
        a.namespace = "dev".into();
        assert!(should_call(&h, &a, Some(&bare), None, &namespaces).await.unwrap().is_none());
        a.namespace = "gone".into();
        let e = should_call(&h, &a, Some(&bare), None, &namespaces).await.unwrap_err();
        assert!(matches!(&e, Error::NamespaceNotFound { namespace } if namespace == "gone"), "{e:?}");

        let h = hook(
            json!({"name": "obj.example.com", "rules": all, "objectSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}),
        );
        a.namespace = "default".into();
        assert!(should_call(&h, &a, Some(&labelled), Some(&bare), &namespaces).await.unwrap().is_some());
        assert!(
            should_call(&h, &a, Some(&bare), Some(&labelled), &namespaces).await.unwrap().is_some(),
            "oldObject counts"
        );
        assert!(should_call(&h, &a, Some(&bare), Some(&bare), &namespaces).await.unwrap().is_none());
        assert!(should_call(&h, &a, None, None, &namespaces).await.unwrap().is_none());

        // Both selectors: an object that does not match hides a missing namespace, as in kube-apiserver.
        let h = hook(json!({"name": "both.example.com", "rules": all,
            "namespaceSelector": {"matchLabels": {"env": "prod"}}, "objectSelector": {"matchLabels": {"app": "web"}}}));
        a.namespace = "gone".into();
        assert!(should_call(&h, &a, Some(&bare), None, &namespaces).await.unwrap().is_none());
        assert!(should_call(&h, &a, Some(&labelled), None, &namespaces).await.is_err());

        let h = hook(json!({"name": "bad.example.com", "rules": all,
            "objectSelector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}}));
        let e = should_call(&h, &a, Some(&labelled), None, &namespaces).await.unwrap_err();
        assert!(matches!(&e, Error::Configuration { .. }), "{e:?}");
        let h = hook(
            json!({"name": "other.example.com", "rules": [{"apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}],
            "objectSelector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}}),
        );
        assert!(should_call(&h, &a, Some(&labelled), None, &namespaces).await.unwrap().is_none(), "rules first");
    }
}
