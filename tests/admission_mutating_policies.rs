//! MutatingAdmissionPolicy in the admission chain, policies and bindings given directly or read from a
//! `staticManifestsDir` (no main API server): apply configurations merged by PodSet's schema (labels kept,
//! containers merged by name, atomic lists refused), JSON patches, the version a policy matches in, variables and
//! match conditions, failure policies, reinvocation, a ValidatingAdmissionPolicy seeing the mutated object,
//! reinvocation after a real HTTPS webhook's patch, metrics, and manifests loaded and refused. tests/admission_policy_cluster.rs runs them through kube-apiserver's
//! aggregator with kubectl.

#[path = "common/webhook.rs"]
mod webhook;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::Status;
use podset_apiserver::admission::policy::{manifests, MutatingKind};
use podset_apiserver::admission::{
    recommended, Admission, Attributes, Chain, Error, MutatingPolicies, Namespaces, Outcome, PluginConfig,
    RequestOptions, Sources, ValidatingPolicies, WebhookConfigurations, WriteKind,
};
use podset_apiserver::api::{Operation, Subresource, UserInfo};
use podset_apiserver::apiserver::error::ApiError;
use podset_apiserver::resources::podset::{PodSetStrategy, Version};
use serde_json::{json, Value};

fn namespaces() -> Namespaces {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}})).unwrap();
    Namespaces::fixed(vec![ns])
}

/// A policy on podsets' creates and updates; `spec` adds to or overrides the defaults.
fn policy(name: &str, spec: Value) -> MutatingAdmissionPolicy {
    let mut full = json!({
        "matchConstraints": {"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"],
            "resources": ["podsets"], "operations": ["CREATE", "UPDATE"]}]},
        "reinvocationPolicy": "Never",
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": full})).unwrap()
}

fn apply(name: &str, expression: &str) -> MutatingAdmissionPolicy {
    policy(
        name,
        json!({"mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}]}),
    )
}

fn json_patch(name: &str, expression: &str) -> MutatingAdmissionPolicy {
    policy(name, json!({"mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}]}))
}

fn binding(policy: &str) -> MutatingAdmissionPolicyBinding {
    serde_json::from_value(json!({"metadata": {"name": format!("{policy}-binding")}, "spec": {"policyName": policy}}))
        .unwrap()
}

fn chain_with(mutating: MutatingPolicies, validating: Option<ValidatingPolicies>) -> Chain {
    let sources = Sources {
        namespaces: namespaces(),
        configurations: None,
        quotas: None,
        policies: validating.map(|v| (v, Default::default())),
        mutating_policies: Some((mutating, Default::default())),
    };
    recommended().with_sources(sources, PluginConfig::default()).unwrap()
}

fn chain(policies: Vec<MutatingAdmissionPolicy>) -> Chain {
    let bindings: Vec<_> = policies.iter().map(|p| binding(p.metadata.name.as_deref().unwrap())).collect();
    chain_with(MutatingPolicies::fixed(&policies, &bindings), None)
}

/// A create of `web` in `default`, made in `version`.
fn create(version: Version) -> Attributes {
    let user = UserInfo::named("jane", vec!["system:authenticated".into()]);
    let options = RequestOptions::write(WriteKind::Create, false, Some("kubectl"));
    podset_apiserver::registry::admission_attributes::<PodSetStrategy>(
        version,
        Operation::Create,
        Subresource::Main,
        "default",
        "web",
        user,
        options,
    )
}

fn podset(api_version: &str, replicas: i64) -> Value {
    json!({"apiVersion": api_version, "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default", "labels": {"team": "a"}},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "main", "image": "registry.example.com/web:1"},
            {"name": "proxy", "image": "registry.example.com/proxy:1", "ports": [{"containerPort": 8080}]}]}}}})
}

async fn admit(c: &Chain, a: &Attributes, object: &mut Value) -> (Result<(), Error>, Outcome) {
    let mut out = Outcome::default();
    let result = match c.admit(a, Some(object), None, &mut out).await {
        Ok(()) => c.validate(a, Some(object), None, &mut out).await,
        e => e,
    };
    (result, out)
}

fn status_of(e: &Error) -> Status {
    *ApiError::from(e).status
}

const LABEL_AND_SIDECAR: &str = "Object{metadata: Object.metadata{labels: {'injected': 'yes'}}, \
     spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{containers: [\
       Object.spec.template.spec.containers{name: 'proxy', image: 'registry.example.com/proxy:2'},\
       Object.spec.template.spec.containers{name: 'log', image: 'registry.example.com/log:1'}]}}}}";

#[tokio::test]
async fn an_apply_configuration_merges_by_the_schema_in_either_version() {
    let c = chain(vec![apply("sidecar", LABEL_AND_SIDECAR)]);
    for (version, api_version) in
        [(Version::V1alpha1, "demo.k8s.io/v1alpha1"), (Version::V1beta1, "demo.k8s.io/v1beta1")]
    {
        let mut object = podset(api_version, 2);
        let (result, _) = admit(&c, &create(version), &mut object).await;
        result.unwrap();
        assert_eq!(object["apiVersion"], api_version);
        // Labels merge: the object's stay.
        assert_eq!(object["metadata"]["labels"], json!({"team": "a", "injected": "yes"}));
        // Containers merge by name: the existing one is updated in place (its ports kept), the new one appended.
        let containers = &object["spec"]["template"]["spec"]["containers"];
        let names: Vec<&str> = containers.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["main", "proxy", "log"], "{api_version}");
        assert_eq!(containers[1]["image"], "registry.example.com/proxy:2");
        assert_eq!(containers[1]["ports"][0]["containerPort"], 8080);
        // Defaulted after the patch, as kube defaults it: v1alpha1 defaults the selector from the template.
        let selector = object["spec"].get("selector").cloned();
        match version {
            Version::V1alpha1 => assert_eq!(selector, Some(json!({"matchLabels": {"app": "web"}}))),
            _ => assert_eq!(selector, None),
        }
    }
}

#[tokio::test]
async fn a_json_patch_caps_replicas_and_sees_the_version_its_rules_match() {
    let cap = "object.spec.replicas > 5 ? [JSONPatch{op: 'replace', path: '/spec/replicas', value: 5}] : []";
    let c = chain(vec![json_patch("cap", cap)]);
    let mut object = podset("demo.k8s.io/v1alpha1", 9);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["spec"]["replicas"], 5);
    let mut small = podset("demo.k8s.io/v1alpha1", 3);
    admit(&c, &create(Version::V1alpha1), &mut small).await.0.unwrap();
    assert_eq!(small["spec"]["replicas"], 3);

    // A policy for v1beta1 only mutates a v1alpha1 request in v1beta1 (matchPolicy Equivalent): it sees
    // `apiVersion` v1beta1, and the result comes back in v1alpha1.
    let mut p = json_patch(
        "beta",
        "[JSONPatch{op: 'add', path: '/metadata/labels/seen', value: object.apiVersion.split('/')[1]}]",
    );
    p.spec.as_mut().unwrap().match_constraints.as_mut().unwrap().resource_rules.as_mut().unwrap()[0].api_versions =
        Some(vec!["v1beta1".into()]);
    let c = chain(vec![p]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["labels"]["seen"], "v1beta1");
    assert_eq!(object["apiVersion"], "demo.k8s.io/v1alpha1");
}

#[tokio::test]
async fn variables_and_match_conditions_as_kube_reads_them() {
    let p = policy(
        "owner",
        json!({
            "variables": [{"name": "team", "expression": "object.metadata.labels.team"}],
            "matchConditions": [{"name": "has-team", "expression": "has(object.metadata.labels) && has(object.metadata.labels.team)"}],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                "Object{metadata: Object.metadata{annotations: {'owner': 'team-' + variables.team}}}"}}],
        }),
    );
    let c = chain(vec![p]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["annotations"]["owner"], "team-a");
    // The condition is false: nothing changes.
    let mut unlabelled = podset("demo.k8s.io/v1alpha1", 1);
    unlabelled["metadata"].as_object_mut().unwrap().remove("labels");
    let before = unlabelled.clone();
    admit(&c, &create(Version::V1alpha1), &mut unlabelled).await.0.unwrap();
    assert_eq!(unlabelled, before);
}

#[tokio::test]
async fn each_mutation_sees_what_the_ones_before_it_made() {
    // Variables are evaluated afresh for each mutation, on the object as the mutations before it left it.
    let p = policy(
        "two-steps",
        json!({
            "variables": [{"name": "count", "expression": "size(object.spec.template.spec.containers)"}],
            "mutations": [
                {"patchType": "JSONPatch", "jsonPatch": {"expression":
                    "[JSONPatch{op: 'add', path: '/metadata/annotations', value: {'before': string(variables.count)}}]"}},
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": LABEL_AND_SIDECAR}},
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                    "Object{metadata: Object.metadata{annotations: {'after': string(variables.count)}}}"}},
            ],
        }),
    );
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&chain(vec![p]), &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["annotations"], json!({"before": "2", "after": "3"}));

    // Which policies apply is decided on the object as it came, before any of them ran (kube's dispatcher): a
    // label a first policy adds does not make a second one's objectSelector select the request.
    let adds = apply("a-adds", "Object{metadata: Object.metadata{labels: {'stage': 'mutated'}}}");
    let mut selects = apply("b-selects", "Object{metadata: Object.metadata{labels: {'b': 'ran'}}}");
    selects.spec.as_mut().unwrap().match_constraints.as_mut().unwrap().object_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"stage": "mutated"}})).unwrap());
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&chain(vec![adds, selects]), &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["labels"]["stage"], "mutated");
    assert!(object["metadata"]["labels"].get("b").is_none(), "{object}");
}

#[tokio::test]
async fn a_json_patch_that_makes_an_unknown_field_is_an_internal_error() {
    let c = chain(vec![json_patch("typo", "[JSONPatch{op: 'add', path: '/spec/replica', value: 3}]")]);
    let e = admit(&c, &create(Version::V1alpha1), &mut podset("demo.k8s.io/v1alpha1", 1)).await.0.unwrap_err();
    let status = status_of(&e);
    assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"));
    assert_eq!(status.message, "Internal error occurred: strict decoding error: unknown field \"spec.replica\"");
}

#[tokio::test]
async fn a_failing_policy_follows_its_failure_policy_after_all_ran() {
    let broken = |name: &str, failure: &str| {
        let mut p = apply(name, "Object{metadata: Object.metadata{labels: {'x': object.spec.nope}}}");
        p.spec.as_mut().unwrap().failure_policy = Some(failure.into());
        p
    };
    let label = apply("z-label", "Object{metadata: Object.metadata{labels: {'z': 'yes'}}}");

    // Ignore: admitted, the later policy still applied.
    let c = chain(vec![broken("ignored", "Ignore"), label.clone()]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["labels"]["z"], "yes");
    assert!(object["metadata"]["labels"].get("x").is_none());

    // Fail (and unset, its default): 403 with kube's message, the failure as the cause, after the others ran.
    let c = chain(vec![broken("failing", "Fail"), label]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    let e = admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap_err();
    let message = "policy 'failing' with binding 'failing-binding' denied request: expression \
                   'Object{metadata: Object.metadata{labels: {'x': object.spec.nope}}}' resulted in error: no such key: nope";
    assert_eq!(
        serde_json::to_value(status_of(&e)).unwrap(),
        json!({"status": "Failure", "code": 403, "reason": "Invalid", "message": message, "metadata": {},
            "details": {"name": "web", "group": "demo.k8s.io", "kind": "podsets", "causes": [{"message": message}]}})
    );

    // A patch that does not apply is the policy's failure too: an atomic list, in kube's words.
    let c = chain(vec![apply(
        "args",
        "Object{spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{containers: \
         [Object.spec.template.spec.containers{name: 'main', args: ['-v']}]}}}}",
    )]);
    let e = admit(&c, &create(Version::V1alpha1), &mut podset("demo.k8s.io/v1alpha1", 1)).await.0.unwrap_err();
    let status = status_of(&e);
    assert_eq!(status.code, 403);
    assert!(
        status.message.contains(
            "error applying patch: invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: \
             .spec.template.spec.containers[0].args"
        ),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn a_validating_policy_sees_the_mutated_object() {
    let vap: ValidatingAdmissionPolicy = serde_json::from_value(json!({"metadata": {"name": "injected"}, "spec": {
        "matchConstraints": {"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"],
            "resources": ["podsets"], "operations": ["CREATE"]}]},
        "validations": [{"expression": "object.metadata.labels.injected == 'yes'"}]}}))
    .unwrap();
    let vb: ValidatingAdmissionPolicyBinding = serde_json::from_value(
        json!({"metadata": {"name": "injected-binding"}, "spec": {"policyName": "injected", "validationActions": ["Deny"]}}),
    )
    .unwrap();
    let validating = ValidatingPolicies::fixed(&[vap], &[vb]);
    let map = apply("sidecar", LABEL_AND_SIDECAR);
    let c = chain_with(MutatingPolicies::fixed(&[map], &[binding("sidecar")]), Some(validating.clone()));
    admit(&c, &create(Version::V1alpha1), &mut podset("demo.k8s.io/v1alpha1", 1)).await.0.unwrap();
    // Without the mutation, the same object is refused.
    let c = chain_with(MutatingPolicies::fixed(&[], &[]), Some(validating));
    let e = admit(&c, &create(Version::V1alpha1), &mut podset("demo.k8s.io/v1alpha1", 1)).await.0.unwrap_err();
    assert_eq!(status_of(&e).code, 422);
}

/// An IfNeeded policy counting its runs in an annotation.
fn counting(name: &str, reinvocation: &str, condition: Option<&str>) -> MutatingAdmissionPolicy {
    let mut spec = json!({
        "reinvocationPolicy": reinvocation,
        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
            "Object{metadata: Object.metadata{annotations: {'runs': \
             string(int(object.metadata.?annotations['runs'].orValue('0')) + 1)}}}"}}],
    });
    if let Some(c) = condition {
        spec["matchConditions"] = json!([{"name": "when", "expression": c}]);
    }
    policy(name, spec)
}

#[tokio::test]
async fn an_ifneeded_policy_runs_once_more_when_a_later_one_changes_the_object() {
    let runs = |o: &Value| o["metadata"]["annotations"]["runs"].as_str().map(str::to_owned);
    let later = apply("z-later", "Object{metadata: Object.metadata{labels: {'later': 'yes'}}}");

    // Alone: its own change marks the object changed (kube's `Dirty`), and the IfNeeded policies that ran run
    // again, itself included, once.
    let c = chain(vec![counting("a-count", "IfNeeded", None)]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(runs(&object).as_deref(), Some("2"));

    // A later policy changes it: exactly one more run.
    let c = chain(vec![counting("a-count", "IfNeeded", None), later.clone()]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(runs(&object).as_deref(), Some("2"));
    assert_eq!(object["metadata"]["labels"]["later"], "yes");

    // Never: once.
    let c = chain(vec![counting("a-count", "Never", None), later.clone()]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(runs(&object).as_deref(), Some("1"));

    // Left out by its matchConditions in the first round, it is not run for the first time in the second, even
    // though the later change makes them hold (kube's order: the conditions, then the reinvocation set).
    let c = chain(vec![counting("a-count", "IfNeeded", Some("has(object.metadata.labels.later)")), later]);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(runs(&object), None);
}

/// The policy `counting` runs, recording in an annotation what it saw of the webhook's label `mutated`.
fn seeing(condition: &str) -> MutatingAdmissionPolicy {
    policy(
        "seeing",
        json!({
            "reinvocationPolicy": "IfNeeded",
            "matchConditions": [{"name": "when", "expression": condition}],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                "Object{metadata: Object.metadata{annotations: {\
                   'runs': string(int(object.metadata.?annotations['runs'].orValue('0')) + 1), \
                   'saw': object.metadata.labels.?mutated.orValue('no')}}}"}}],
        }),
    )
}

#[tokio::test]
async fn a_webhooks_patch_reinvokes_an_ifneeded_policy_once() {
    let s = webhook::WebhookServer::start(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).await;
    use base64::Engine as _;
    let labeller: MutatingWebhookConfiguration = serde_json::from_value(json!({"metadata": {"name": "labeller"},
        "webhooks": [{"name": "label.test.io",
            "clientConfig": {"url": s.url("/label"), "caBundle": base64::engine::general_purpose::STANDARD.encode(&s.ca_pem)},
            "rules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"], "resources": ["podsets"],
                       "operations": ["CREATE"], "scope": "*"}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"]}]}))
    .unwrap();
    let chain_for = |p: MutatingAdmissionPolicy| {
        let sources = Sources {
            namespaces: namespaces(),
            configurations: Some(WebhookConfigurations::fixed(std::slice::from_ref(&labeller), &[])),
            quotas: None,
            policies: None,
            mutating_policies: Some((MutatingPolicies::fixed(&[p], &[binding("seeing")]), Default::default())),
        };
        recommended().with_sources(sources, PluginConfig::default()).unwrap()
    };

    // Its conditions hold from the start: it runs, the webhook (after it) adds the label, and it runs once more,
    // seeing the label. The webhook, not IfNeeded, is called once.
    let c = chain_for(seeing("has(object.metadata.labels) && 'team' in object.metadata.labels"));
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert_eq!(object["metadata"]["annotations"], json!({"runs": "2", "saw": "yes"}));
    assert_eq!(object["metadata"]["labels"]["mutated"], "yes");
    assert_eq!(s.received("/label").len(), 1);

    // Its conditions look for the webhook's label: false in the first round, so it is not run for the first time
    // in the second, as kube's dispatcher checks the conditions before the reinvocation set.
    s.clear();
    let c = chain_for(seeing("has(object.metadata.labels) && 'mutated' in object.metadata.labels"));
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    admit(&c, &create(Version::V1alpha1), &mut object).await.0.unwrap();
    assert!(object["metadata"].get("annotations").is_none(), "{object}");
    assert_eq!(object["metadata"]["labels"]["mutated"], "yes");
}

#[tokio::test]
async fn mutations_are_counted_under_kubes_metric_names() {
    let c = chain(vec![apply("metered-map", "Object{metadata: Object.metadata{labels: {'m': 'yes'}}}")]);
    admit(&c, &create(Version::V1alpha1), &mut podset("demo.k8s.io/v1alpha1", 1)).await.0.unwrap();
    let text = podset_apiserver::metrics::encode();
    let line = "apiserver_mutating_admission_policy_check_total{policy=\"metered-map\",policy_binding=\"metered-map-binding\",error_type=\"no_error\"} 1";
    assert!(text.contains(line), "{line} not in\n{text}");
    let count = "apiserver_mutating_admission_policy_check_duration_seconds_count{policy=\"metered-map\",policy_binding=\"metered-map-binding\",error_type=\"no_error\"} 1";
    assert!(text.contains(count), "{count} not in\n{text}");
}

const MANIFEST: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: team.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  reinvocationPolicy: IfNeeded
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: "Object{metadata: Object.metadata{labels: {'team': 'platform'}}}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: team-binding.static.k8s.io}
spec: {policyName: team.static.k8s.io}
"#;

#[tokio::test]
async fn manifests_load_apply_and_refuse_what_kube_refuses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("team.yaml"), MANIFEST).unwrap();
    let loaded = manifests::load::<MutatingKind>(dir.path()).unwrap();
    assert_eq!((loaded.policies, loaded.bindings), (1, 1));
    let policies = MutatingPolicies::default();
    policies.set_manifests(loaded.hooks);
    policies.cluster_absent();
    let c = chain_with(policies, None);
    let mut object = podset("demo.k8s.io/v1alpha1", 1);
    let (result, out) = admit(&c, &create(Version::V1alpha1), &mut object).await;
    result.unwrap();
    assert_eq!(object["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        out.audit_annotations.get("source.admission.k8s.io/manifest-policies").map(String::as_str),
        Some("team.static.k8s.io")
    );

    let cases = [
        (
            MANIFEST.replace("Object{metadata", "Object{spec: Object.wrong{}, metadata"),
            "type mismatch: unexpected type name \"Object.wrong\", expected \"Object.spec\"",
        ),
        (
            MANIFEST.replace("Object{metadata: Object.metadata{labels: {'team': 'platform'}}}", "{'metadata': 1}"),
            "must evaluate to Object but got map(dyn, dyn)",
        ),
        (MANIFEST.replace("  reinvocationPolicy: IfNeeded\n", ""), "spec.reinvocationPolicy: Required value"),
        (
            MANIFEST.replace("patchType: ApplyConfiguration", "patchType: Merge"),
            "spec.mutations[0].patchType: Unsupported value: \"Merge\"",
        ),
        (
            MANIFEST.replace("{policyName: team.static.k8s.io}", "{policyName: team}"),
            "must end with \".static.k8s.io\"",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(dir.path().join("team.yaml"), &text).unwrap();
        let e = manifests::load::<MutatingKind>(dir.path()).unwrap_err();
        assert!(e.contains(want), "{e} does not say {want}");
    }
}
