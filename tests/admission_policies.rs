//! ValidatingAdmissionPolicy in the admission chain, policies and bindings given directly or read from a
//! `staticManifestsDir` (no main API server): each validation action, messages and reasons, variables, the
//! namespace object, the authorizer, failure policies, match conditions, equivalent versions, audit annotations,
//! configuration errors, metrics, and manifests loaded, refused and reloaded. tests/admission_policy_cluster.rs
//! runs them through kube-apiserver's aggregator with kubectl.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::Status;
use podset_apiserver::admission::policy::{manifests, ValidatingKind, VALIDATION_FAILURE_ANNOTATION};
use podset_apiserver::admission::{
    recommended, Admission, Attributes, Chain, Error, Namespaces, ObjectReads, Outcome, PluginConfig, RequestOptions,
    Sources, ValidatingPolicies, WriteKind,
};
use podset_apiserver::api::{Operation, Subresource, UserInfo};
use podset_apiserver::apiserver::error::ApiError;
use podset_apiserver::cel::{self, Check, Decision};
use podset_apiserver::resources::podset::admission_attributes;
use serde_json::{json, Value};

fn namespaces() -> Namespaces {
    let ns = |name: &str, labels: Value| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "status": {"phase": "Active"}}))
            .unwrap()
    };
    Namespaces::fixed(vec![ns("default", json!({"env": "test"})), ns("prod", json!({"env": "prod"}))])
}

fn policy(name: &str, spec: Value) -> ValidatingAdmissionPolicy {
    let mut spec = spec;
    if spec.get("matchConstraints").is_none() {
        spec["matchConstraints"] = json!({"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"],
            "resources": ["podsets"], "operations": ["CREATE", "UPDATE"]}]});
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn binding(name: &str, policy: &str, actions: &[&str]) -> ValidatingAdmissionPolicyBinding {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"policyName": policy, "validationActions": actions}}),
    )
    .unwrap()
}

/// Records what is asked; allows `alice` to `approve` podsets.
#[derive(Debug, Default)]
struct Recording(Mutex<Vec<String>>);

impl cel::Authorizer for Recording {
    fn authorize(&self, user: &UserInfo, verb: &str, check: &Check) -> Decision {
        self.0.lock().unwrap().push(format!("{} {verb} {check:?}", user.name));
        let allowed = user.name == "alice" && verb == "approve";
        Decision { allowed, reason: String::new(), error: None }
    }
}

fn chain(policies: ValidatingPolicies, authorizer: Option<Arc<dyn cel::Authorizer>>) -> Chain {
    let sources = Sources {
        namespaces: namespaces(),
        configurations: None,
        quotas: None,
        policies: Some((policies, Default::default())),
        mutating_policies: None,
    };
    recommended().with_sources(sources, PluginConfig { authorizer, ..Default::default() }).unwrap()
}

fn fixed(p: Vec<ValidatingAdmissionPolicy>, b: Vec<ValidatingAdmissionPolicyBinding>) -> Chain {
    chain(ValidatingPolicies::fixed(&p, &b), None)
}

fn jane() -> UserInfo {
    UserInfo::named("jane", vec!["system:authenticated".into()])
}

fn create_as(namespace: &str, user: UserInfo) -> Attributes {
    let options = RequestOptions::write(WriteKind::Create, false, Some("kubectl"));
    admission_attributes(Operation::Create, Subresource::Main, namespace, "web", user, options)
}

fn create(namespace: &str) -> Attributes {
    create_as(namespace, jane())
}

fn podset(replicas: i64, privileged: bool) -> Value {
    json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default", "labels": {"team": "a"}},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "main", "image": "registry.example.com/web:1", "securityContext": {"privileged": privileged}}]}}}})
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

const NOT_PRIVILEGED: &str = "object.spec.template.spec.containers.all(c, !has(c.securityContext) || \
                              !has(c.securityContext.privileged) || !c.securityContext.privileged)";

#[tokio::test]
async fn deny_refuses_with_kubes_status_and_a_compliant_object_passes() {
    let c = fixed(
        vec![policy("no-privileged", json!({"validations": [{"expression": NOT_PRIVILEGED}]}))],
        vec![binding("no-privileged-binding", "no-privileged", &["Deny"])],
    );
    admit(&c, &create("default"), &mut podset(2, false)).await.0.unwrap();
    let e = admit(&c, &create("default"), &mut podset(2, true)).await.0.unwrap_err();
    let status = serde_json::to_value(status_of(&e)).unwrap();
    let message = format!(
        "ValidatingAdmissionPolicy 'no-privileged' with binding 'no-privileged-binding' denied request: failed \
         expression: {NOT_PRIVILEGED}"
    );
    assert_eq!(
        status,
        json!({"status": "Failure", "code": 422, "reason": "Invalid", "metadata": {},
            "message": format!("podsets.demo.k8s.io \"web\" is forbidden: {message}"),
            "details": {"name": "web", "group": "demo.k8s.io", "kind": "podsets", "causes": [{"message": message}]}})
    );
}

#[tokio::test]
async fn warn_and_audit_report_without_refusing() {
    let p = policy(
        "replicas-cap",
        json!({"validations": [{"expression": "object.spec.replicas <= 5", "message": "at most 5 replicas"}]}),
    );
    let c = fixed(
        vec![p.clone()],
        vec![binding("warn", "replicas-cap", &["Warn"]), binding("audit", "replicas-cap", &["Audit"])],
    );
    let (result, out) = admit(&c, &create("default"), &mut podset(9, false)).await;
    result.unwrap();
    assert_eq!(
        out.warnings,
        ["Validation failed for ValidatingAdmissionPolicy 'replicas-cap' with binding 'warn': at most 5 replicas"]
    );
    let failures: Value = serde_json::from_str(&out.audit_annotations[VALIDATION_FAILURE_ANNOTATION]).unwrap();
    assert_eq!(
        failures,
        json!([{"message": "at most 5 replicas", "policy": "replicas-cap", "binding": "audit", "expressionIndex": 0,
            "validationActions": ["Audit"]}])
    );
    let (result, out) = admit(&c, &create("default"), &mut podset(3, false)).await;
    result.unwrap();
    assert!(out.warnings.is_empty() && out.audit_annotations.is_empty(), "{out:?}");
}

#[tokio::test]
async fn message_expressions_reasons_variables_and_the_namespace_decide() {
    let p = policy(
        "rules",
        json!({
            "variables": [
                {"name": "images", "expression": "object.spec.template.spec.containers.map(c, c.image)"},
                {"name": "trusted", "expression": "variables.images.all(i, i.startsWith('registry.example.com/'))"},
            ],
            "validations": [
                {"expression": "variables.trusted", "reason": "Forbidden",
                 "messageExpression": "'untrusted images: ' + variables.images.filter(i, !i.startsWith('registry.example.com/')).join(', ')"},
                {"expression": "namespaceObject.metadata.labels.env != 'prod' || object.spec.replicas >= 2",
                 "message": "production PodSets run at least 2 replicas"},
            ],
        }),
    );
    let c = fixed(vec![p], vec![binding("rules-binding", "rules", &["Deny"])]);
    let mut untrusted = podset(2, false);
    untrusted["spec"]["template"]["spec"]["containers"][0]["image"] = json!("docker.io/evil:1");
    let status = status_of(&admit(&c, &create("default"), &mut untrusted).await.0.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(status.message.ends_with("denied request: untrusted images: docker.io/evil:1"), "{}", status.message);

    admit(&c, &create("default"), &mut podset(1, false)).await.0.unwrap();
    let status = status_of(&admit(&c, &create("prod"), &mut podset(1, false)).await.0.unwrap_err());
    assert_eq!(status.code, 422);
    assert!(
        status.message.ends_with("denied request: production PodSets run at least 2 replicas"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn the_authorizer_asks_for_the_requests_user() {
    let p = policy(
        "approval",
        json!({"validations": [{"expression": "object.spec.replicas <= 10 || authorizer.group('demo.k8s.io').resource('podsets').namespace(object.metadata.namespace).check('approve').allowed()",
            "message": "more than 10 replicas needs approve"}]}),
    );
    let recording = Arc::new(Recording::default());
    let c = chain(
        ValidatingPolicies::fixed(&[p], &[binding("approval-binding", "approval", &["Deny"])]),
        Some(recording.clone()),
    );
    let alice = UserInfo::named("alice", vec![]);
    admit(&c, &create_as("default", alice), &mut podset(20, false)).await.0.unwrap();
    let e = admit(&c, &create("default"), &mut podset(20, false)).await.0.unwrap_err();
    assert!(status_of(&e).message.ends_with("more than 10 replicas needs approve"));
    admit(&c, &create("default"), &mut podset(3, false)).await.0.unwrap();
    let asked = recording.0.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[0].starts_with("alice approve Resource(ResourceCheck { group: \"demo.k8s.io\""), "{asked:?}");
}

#[tokio::test]
async fn a_runtime_error_admits_under_ignore_and_refuses_under_fail() {
    let broken = |name: &str, failure: &str| {
        policy(name, json!({"failurePolicy": failure, "validations": [{"expression": "object.spec.paused == false"}]}))
    };
    let c = fixed(vec![broken("lenient", "Ignore")], vec![binding("lenient-binding", "lenient", &["Deny"])]);
    admit(&c, &create("default"), &mut podset(2, false)).await.0.unwrap();
    let c = fixed(vec![broken("strict", "Fail")], vec![binding("strict-binding", "strict", &["Deny"])]);
    let status = status_of(&admit(&c, &create("default"), &mut podset(2, false)).await.0.unwrap_err());
    assert_eq!(status.code, 422);
    assert!(
        status.message.ends_with(
            "ValidatingAdmissionPolicy 'strict' with binding 'strict-binding' denied request: expression \
             'object.spec.paused == false' resulted in error: no such key: paused"
        ),
        "{}",
        status.message
    );
    // An expression over the cost limit is an error of its own.
    let costly = policy(
        "costly",
        json!({"validations": [{"expression":
        "lists.range(200).all(a, lists.range(200).all(b, lists.range(200).all(c, a + b + c >= 0)))"}]}),
    );
    let c = fixed(vec![costly], vec![binding("costly-binding", "costly", &["Deny"])]);
    let status = status_of(&admit(&c, &create("default"), &mut podset(2, false)).await.0.unwrap_err());
    assert!(
        status.message.ends_with("resulted in error: operation cancelled: actual cost limit exceeded"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn match_conditions_and_bindings_match_resources_select_requests() {
    let p = policy(
        "cap",
        json!({"matchConditions": [{"name": "not-admins", "expression": "!('system:masters' in request.userInfo.groups)"}],
            "validations": [{"expression": "object.spec.replicas <= 5"}]}),
    );
    let mut b = binding("cap-prod", "cap", &["Deny"]);
    b.spec.match_resources =
        serde_json::from_value(json!({"namespaceSelector": {"matchLabels": {"env": "prod"}}})).unwrap();
    let c = fixed(vec![p], vec![b]);
    admit(&c, &create("default"), &mut podset(9, false)).await.0.unwrap();
    let admin = UserInfo::named("admin", vec!["system:masters".into()]);
    admit(&c, &create_as("prod", admin), &mut podset(9, false)).await.0.unwrap();
    assert!(admit(&c, &create("prod"), &mut podset(9, false)).await.0.is_err());
}

#[tokio::test]
async fn an_equivalent_policy_sees_the_object_in_the_version_its_rules_name() {
    // Rules name v1beta1 only; the request is v1alpha1: the policy sees the v1beta1 object (spec.minReadySeconds
    // is v1beta1's field, an annotation in v1alpha1).
    let p = policy(
        "ready-time",
        json!({"matchConstraints": {"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["v1beta1"],
                "resources": ["podsets"], "operations": ["CREATE"]}]},
            "validations": [{"expression": "object.apiVersion == 'demo.k8s.io/v1beta1' && request.kind.version == 'v1beta1' && request.requestKind.version == 'v1alpha1' && object.spec.minReadySeconds <= 60"}]}),
    );
    let c = fixed(vec![p], vec![binding("ready-time-binding", "ready-time", &["Deny"])]);
    let mut ps = podset(2, false);
    ps["metadata"]["annotations"] = json!({"demo.k8s.io/v1beta1-min-ready-seconds": "30"});
    admit(&c, &create("default"), &mut ps).await.0.unwrap();
    ps["metadata"]["annotations"] = json!({"demo.k8s.io/v1beta1-min-ready-seconds": "90"});
    assert!(admit(&c, &create("default"), &mut ps).await.0.is_err());
}

#[tokio::test]
async fn audit_annotations_are_published_under_the_policys_name() {
    let p = policy(
        "annotate",
        json!({"auditAnnotations": [{"key": "replicas", "valueExpression": "'replicas: ' + string(object.spec.replicas)"},
                                    {"key": "absent", "valueExpression": "null"}]}),
    );
    let c = fixed(vec![p], vec![binding("annotate-binding", "annotate", &["Audit"])]);
    let (result, out) = admit(&c, &create("default"), &mut podset(4, false)).await;
    result.unwrap();
    assert_eq!(out.audit_annotations.get("annotate/replicas").map(String::as_str), Some("replicas: 4"));
    assert!(!out.audit_annotations.contains_key("annotate/absent"));
}

#[tokio::test]
async fn checks_are_counted_under_kubes_metric_names() {
    let p = policy("metered", json!({"validations": [{"expression": "object.spec.replicas <= 1"}]}));
    let c = fixed(vec![p], vec![binding("metered-binding", "metered", &["Deny", "Audit"])]);
    assert!(admit(&c, &create("default"), &mut podset(3, false)).await.0.is_err());
    let text = podset_apiserver::metrics::encode();
    for action in ["deny", "audit"] {
        let line = format!(
            "apiserver_validating_admission_policy_check_total{{policy=\"metered\",policy_binding=\"metered-binding\",error_type=\"invalid_error\",enforcement_action=\"{action}\"}} 1"
        );
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

fn write(dir: &std::path::Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

const MANIFEST: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  validations:
  - expression: object.spec.replicas <= MAX
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas-binding.static.k8s.io}
spec: {policyName: replicas.static.k8s.io, validationActions: [Deny]}
"#;

#[tokio::test]
async fn manifests_are_loaded_refused_with_the_file_and_reason_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "policy.yaml", &MANIFEST.replace("MAX", "3"));
    write(dir.path(), "notes.txt", "not read");
    let policies = ValidatingPolicies::default();
    let stop = tokio_util::sync::CancellationToken::new();
    manifests::start(dir.path().to_owned(), &policies, "test".into(), stop.clone()).unwrap();
    policies.cluster_absent();
    let c = chain(policies.clone(), None);
    let (result, out) = admit(&c, &create("default"), &mut podset(3, false)).await;
    result.unwrap();
    // The audit event names the manifest policies evaluated.
    assert_eq!(out.audit_annotations["source.admission.k8s.io/manifest-policies"], "replicas.static.k8s.io");
    let status = status_of(&admit(&c, &create("default"), &mut podset(4, false)).await.0.unwrap_err());
    assert!(status.message.contains("ValidatingAdmissionPolicy 'replicas.static.k8s.io' with binding 'replicas-binding.static.k8s.io' denied request"));

    // An edit takes effect without a restart; a broken one keeps the last good set.
    write(dir.path(), "policy.yaml", &MANIFEST.replace("MAX", "5"));
    wait_until(|| policies_allow(&c, 4)).await;
    write(dir.path(), "policy.yaml", &MANIFEST.replace("MAX", "5").replace("validations:", "validationz:"));
    tokio::time::sleep(manifests_interval() * 3).await;
    admit(&c, &create("default"), &mut podset(5, false)).await.0.unwrap();
    assert!(admit(&c, &create("default"), &mut podset(6, false)).await.0.is_err(), "the last good set is kept");
    let text = podset_apiserver::metrics::encode();
    assert!(text.contains("apiserver_manifest_admission_config_controller_automatic_reloads_total{status=\"failure\",plugin=\"ValidatingAdmissionPolicy\",apiserver_id_hash=\"test\"} 1"), "{text}");
    stop.cancel();
}

fn manifests_interval() -> std::time::Duration {
    podset_apiserver::admission::manifest::RELOAD_INTERVAL
}

async fn policies_allow(c: &Chain, replicas: i64) -> bool {
    admit(c, &create("default"), &mut podset(replicas, false)).await.0.is_ok()
}

async fn wait_until<F: std::future::Future<Output = bool>>(mut f: impl FnMut() -> F) {
    for _ in 0..100 {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("not within 10 s");
}

#[test]
fn bad_manifests_are_refused_with_the_file_and_the_reason() {
    let cases: &[(&str, &str)] = &[
        (
            &MANIFEST
                .replace("replicas.static.k8s.io}", "replicas}")
                .replace("policyName: replicas.static.k8s.io", "policyName: replicas"),
            "\"replicas\" in file",
        ),
        (
            &MANIFEST
                .replace("MAX", "3")
                .replace("  validations:", "  paramKind: {apiVersion: v1, kind: ConfigMap}\n  validations:"),
            "spec.paramKind is not supported for static manifests",
        ),
        (
            &MANIFEST
                .replace("MAX", "3")
                .replace("spec:\n  matchConstraints", "spec:\n  matchConstraintz: {}\n  matchConstraints"),
            "strict decoding error: unknown field \"spec.matchConstraintz\"",
        ),
        (&MANIFEST.replace("MAX", "nope"), "undeclared reference to 'nope'"),
        (
            &MANIFEST
                .replace("MAX", "3")
                .replace("policyName: replicas.static.k8s.io", "policyName: other.static.k8s.io"),
            "binding \"replicas-binding.static.k8s.io\" references policy \"other.static.k8s.io\" which does not exist",
        ),
        (&MANIFEST.replace("MAX", "3").replace("[Deny]", "[Deny, Warn]"), "must not contain both Deny and Warn"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x.static.k8s.io}\n",
            "unsupported resource type v1, Kind=ConfigMap",
        ),
    ];
    for (text, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "p.yaml", text);
        let e = manifests::load::<ValidatingKind>(dir.path()).unwrap_err();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }
    // A List, JSON, and two files load together.
    let dir = tempfile::tempdir().unwrap();
    let (policy, binding) =
        MANIFEST.replace("MAX", "3").split_once("---").map(|(a, b)| (a.to_owned(), b.to_owned())).unwrap();
    let as_json = |y: &str| serde_json::to_string(&serde_yaml::from_str::<Value>(y).unwrap()).unwrap();
    write(
        dir.path(),
        "a.json",
        &format!("{{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [{}]}}", as_json(&policy)),
    );
    write(dir.path(), "b.yml", &binding);
    let loaded = manifests::load::<ValidatingKind>(dir.path()).unwrap();
    assert_eq!((loaded.policies, loaded.bindings, loaded.hooks.len()), (1, 1, 1));
    assert!(loaded.hash.starts_with("sha256:"));
    assert!(podset_apiserver::admission::manifest::validate_dir(std::path::Path::new("relative"))
        .unwrap_err()
        .contains("must be an absolute file path"));
}

/// A write builds no objects for admission unless a policy's rules could select it: policies for other resources
/// cost a PodSet write nothing.
#[tokio::test]
async fn policies_for_other_resources_make_podset_writes_read_nothing() {
    let configmaps = policy(
        "configmaps-only",
        json!({"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE"]}]},
            "validations": [{"expression": "false"}]}),
    );
    let c = fixed(vec![configmaps.clone()], vec![binding("configmaps-only-binding", "configmaps-only", &["Deny"])]);
    assert_eq!(c.reads_objects(&create("default")), ObjectReads::default());
    admit(&c, &create("default"), &mut podset(1, false)).await.0.unwrap();
    let podsets = policy("podsets", json!({"validations": [{"expression": "true"}]}));
    let c = fixed(vec![configmaps, podsets], vec![binding("podsets-binding", "podsets", &["Deny"])]);
    assert_eq!(c.reads_objects(&create("default")), ObjectReads { admit: false, validate: true });
}
