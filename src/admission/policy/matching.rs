//! Whether a policy's `matchConstraints` (or a binding's `matchResources`) select a request, as k8s.io/apiserver's
//! `policy/matching` decides: namespaceSelector, objectSelector (the object's or the old object's labels), then
//! `excludeResourceRules`, then `resourceRules` (with `resourceNames`), in the request's version or, under
//! `matchPolicy: Equivalent` (the default), another served version of the same resource. Selector errors count
//! only when the rules match.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{MatchResources, NamedRuleWithOperations, RuleWithOperations};
use serde_json::Value;

use crate::admission::webhook::rules::rule_matches;
use crate::admission::{Attributes, Namespaces};
use crate::api::selector::Selector;

#[derive(Debug)]
struct Rule {
    rule: RuleWithOperations,
    names: Vec<String>,
}

impl Rule {
    fn new(r: &NamedRuleWithOperations) -> Self {
        Self {
            rule: RuleWithOperations {
                api_groups: r.api_groups.clone(),
                api_versions: r.api_versions.clone(),
                operations: r.operations.clone(),
                resources: r.resources.clone(),
                scope: r.scope.clone(),
            },
            names: r.resource_names.clone().unwrap_or_default(),
        }
    }

    fn matches(&self, a: &Attributes, version: &str) -> bool {
        rule_matches(&self.rule, a, version) && (self.names.is_empty() || self.names.contains(&a.name))
    }
}

/// Compiled match resources.
#[derive(Debug)]
pub(crate) struct Matcher {
    namespace_selector: Result<Selector, String>,
    object_selector: Result<Selector, String>,
    rules: Vec<Rule>,
    excluded: Vec<Rule>,
    equivalent: bool,
}

fn selector(s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>) -> Result<Selector, String> {
    s.as_ref().map_or(Ok(Selector::default()), Selector::from_label_selector)
}

fn labels(object: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let labels = object?.get("metadata")?.get("labels");
    Some(labels.and_then(|l| serde_json::from_value(l.clone()).ok()).unwrap_or_default())
}

impl Matcher {
    pub(crate) fn new(m: &MatchResources) -> Self {
        let rules = |r: &Option<Vec<NamedRuleWithOperations>>| r.iter().flatten().map(Rule::new).collect();
        Self {
            namespace_selector: selector(&m.namespace_selector),
            object_selector: selector(&m.object_selector),
            rules: rules(&m.resource_rules),
            excluded: rules(&m.exclude_resource_rules),
            equivalent: m.match_policy.as_deref() != Some("Exact"),
        }
    }

    /// The version of the resource a list of rules selects the request in: its own, else (Equivalent) the first
    /// other served version a rule names.
    fn version_in(&self, rules: &[Rule], a: &Attributes) -> Option<String> {
        let requested = a.resource.version.as_str();
        if rules.iter().any(|r| r.matches(a, requested)) {
            return Some(requested.to_owned());
        }
        if !self.equivalent {
            return None;
        }
        let others = a.interfaces.versions().iter().map(|v| v.name).filter(|v| *v != requested);
        others.into_iter().find(|v| rules.iter().any(|r| r.matches(a, v))).map(|v| v.to_string())
    }

    /// Whether the rules (not the selectors, which need the objects) select the request in some version.
    pub(crate) fn may_select(&self, a: &Attributes) -> bool {
        (self.rules.is_empty() || self.version_in(&self.rules, a).is_some())
            && self.version_in(&self.excluded, a).is_none()
    }

    /// None when the request is not selected; else the version of the resource it is selected in. An error is
    /// worded for `failed to configure policy/binding: ...`.
    pub(crate) async fn matches(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        old: Option<&Value>,
        namespaces: &Namespaces,
    ) -> Result<Option<String>, String> {
        let by_namespace = match &self.namespace_selector {
            _ if a.namespace.is_empty() => Ok(true),
            Err(e) => Err(e.clone()),
            Ok(s) if s.is_empty() => Ok(true),
            Ok(s) => match namespaces.get(&a.namespace).await {
                Ok(ns) => Ok(s.matches(ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))),
                Err(e) => Err(e.to_string()),
            },
        };
        if matches!(by_namespace, Ok(false)) {
            return Ok(None);
        }
        let by_object = match &self.object_selector {
            Err(e) => Err(e.clone()),
            Ok(s) if s.is_empty() => Ok(true),
            Ok(s) => Ok([object, old].into_iter().any(|o| labels(o).is_some_and(|l| s.matches(&l)))),
        };
        if matches!(by_object, Ok(false)) {
            return Ok(None);
        }
        if self.version_in(&self.excluded, a).is_some() {
            return Ok(None);
        }
        let version =
            if self.rules.is_empty() { Some(a.resource.version.clone()) } else { self.version_in(&self.rules, a) };
        let Some(version) = version else { return Ok(None) };
        by_namespace?;
        by_object?;
        Ok(Some(version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::testing::attributes;
    use crate::api::{Operation, Subresource, UserInfo};
    use k8s_openapi::api::core::v1::Namespace;
    use serde_json::json;

    fn matcher(v: Value) -> Matcher {
        Matcher::new(&serde_json::from_value(v).unwrap())
    }

    fn namespaces() -> Namespaces {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "prod", "labels": {"env": "prod"}}})).unwrap();
        let other: Namespace = serde_json::from_value(json!({"metadata": {"name": "dev"}})).unwrap();
        Namespaces::fixed(vec![ns, other])
    }

    #[tokio::test]
    async fn rules_names_and_selectors_select_as_kube_does() {
        let ns = namespaces();
        let user = UserInfo::named("u", vec![]);
        let create = attributes(Operation::Create, Subresource::Main, "prod", "web", user.clone());
        let status = attributes(Operation::Update, Subresource::Status, "prod", "web", user.clone());
        let in_dev = attributes(Operation::Create, Subresource::Main, "dev", "web", user);
        let obj = json!({"metadata": {"labels": {"tier": "db"}}});
        let podsets = json!({"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"], "resources": ["podsets"], "operations": ["CREATE", "UPDATE"]}]});
        let m = matcher(podsets.clone());
        assert_eq!(m.matches(&create, Some(&obj), None, &ns).await, Ok(Some("v1alpha1".into())));
        assert_eq!(m.matches(&status, Some(&obj), None, &ns).await, Ok(None), "podsets alone is not podsets/status");
        let all = matcher(
            json!({"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["podsets/*"], "operations": ["*"]}]}),
        );
        assert!(all.matches(&status, Some(&obj), None, &ns).await.unwrap().is_some());
        assert!(
            all.matches(&create, Some(&obj), None, &ns).await.unwrap().is_some(),
            "podsets/* matches the main resource too"
        );

        let mut named = podsets.clone();
        named["resourceRules"][0]["resourceNames"] = json!(["other"]);
        assert_eq!(matcher(named).matches(&create, Some(&obj), None, &ns).await, Ok(None));

        let mut by_ns = podsets.clone();
        by_ns["namespaceSelector"] = json!({"matchLabels": {"env": "prod"}});
        let m = matcher(by_ns);
        assert!(m.matches(&create, Some(&obj), None, &ns).await.unwrap().is_some());
        assert_eq!(m.matches(&in_dev, Some(&obj), None, &ns).await, Ok(None));

        let mut by_obj = podsets.clone();
        by_obj["objectSelector"] = json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]});
        assert_eq!(matcher(by_obj).matches(&create, Some(&obj), None, &ns).await, Ok(None));

        let mut excluded = podsets.clone();
        excluded["excludeResourceRules"] = json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["CREATE"], "resourceNames": ["web"]}]);
        assert_eq!(matcher(excluded).matches(&create, Some(&obj), None, &ns).await, Ok(None));

        let mut gone = podsets;
        gone["namespaceSelector"] = json!({"matchLabels": {"env": "prod"}});
        let missing = attributes(Operation::Create, Subresource::Main, "nowhere", "web", UserInfo::named("u", vec![]));
        assert_eq!(
            matcher(gone).matches(&missing, Some(&obj), None, &ns).await,
            Err("namespaces \"nowhere\" not found".into())
        );
    }
}
