//! ValidatingAdmissionPolicy and MutatingAdmissionPolicy on the local 1.20 control plane, through kube-apiserver's
//! aggregator with kubectl 1.37: policies from `staticManifestsDir` (kube-apiserver 1.20 serves no policy API, so manifests are how this
//! cluster gets policies), for `v1beta1` and `v1alpha1` requests alike; each validation action; a
//! messageExpression, a variable, the namespace object and the authorizer deciding a case each; failure policies;
//! and a manifest edited while serving; mutations (a label and a sidecar merged by name, replicas capped) seen by a
//! validating policy, in dry runs, refused when invalid, and under each failure policy. The server starts and
//! stays ready though the cluster has no policy API; envtest's front serves the cluster's policies, with params.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{in_namespace, Cluster};
use serde_json::Value;

/// The policies an admin of this cluster writes for PodSets (docs/admission.md shows them).
const POLICIES: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: no-privileged.static.k8s.io}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: [v1beta1], resources: [podsets], operations: [CREATE, UPDATE]}
  variables:
  - name: containers
    expression: object.spec.template.spec.containers
  validations:
  - expression: >-
      variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) ||
      !c.securityContext.privileged)
    messageExpression: "'privileged containers are not allowed: ' + variables.containers.filter(c, has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged).map(c, c.name).join(', ')"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-privileged-binding.static.k8s.io}
spec: {policyName: no-privileged.static.k8s.io, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  validations:
  - expression: "object.spec.replicas <= 10"
    message: more than 10 replicas
  - expression: >-
      !has(namespaceObject.metadata.labels) || !('env' in namespaceObject.metadata.labels) ||
      namespaceObject.metadata.labels.env != 'prod' || object.spec.replicas >= 2
    message: production PodSets run at least 2 replicas
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas-warn.static.k8s.io}
spec: {policyName: replicas.static.k8s.io, validationActions: [Warn, Audit]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: big-needs-approval.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
  validations:
  - expression: >-
      object.spec.replicas <= 20 ||
      authorizer.group('demo.k8s.io').resource('podsets').namespace(request.namespace).check('approve').allowed()
    message: more than 20 replicas needs the approve verb on podsets
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: big-needs-approval-binding.static.k8s.io}
spec: {policyName: big-needs-approval.static.k8s.io, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: broken.static.k8s.io}
spec:
  failurePolicy: FAILURE
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
    objectSelector: {matchLabels: {broken: "yes"}}
  validations:
  - expression: object.spec.paused == false
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: broken-binding.static.k8s.io}
spec: {policyName: broken.static.k8s.io, validationActions: [Deny]}
"#;

fn podset(api_version: &str, name: &str, namespace: &str, replicas: i64, privileged: bool, labels: Value) -> Value {
    serde_json::json!({"apiVersion": api_version, "kind": "PodSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
            {"name": "main", "image": "registry.example.com/web:1", "securityContext": {"privileged": privileged}},
            {"name": "sidecar", "image": "registry.example.com/proxy:1"}]}}}})
}

/// `kubectl create -f` of `object` (as a user, with `--as`), its stdout and stderr either way.
fn create(c: &Cluster, object: &Value, as_user: Option<&str>) -> Result<String, String> {
    let file = c.dir.path().join(format!("{}.json", object["metadata"]["name"].as_str().unwrap()));
    std::fs::write(&file, serde_json::to_vec(object).unwrap()).unwrap();
    let mut args = vec!["create".to_owned(), "-f".to_owned(), file.display().to_string()];
    if let Some(u) = as_user {
        args.push(format!("--as={u}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c.kubectl_command(&args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn admission_config(dir: &Path, manifests: &Path) -> String {
    let file = dir.join("admission.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: ValidatingAdmissionPolicy\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: ValidatingAdmissionPolicyConfiguration\n    staticManifestsDir: {}\n",
            manifests.display()
        ),
    )
    .unwrap();
    format!("--admission-control-config-file={}", file.display())
}

const AUDIT_POLICY: &str =
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  resources:\n  - group: demo.k8s.io\n";

#[test]
fn manifest_policies_hold_for_podsets_through_the_aggregator() {
    in_namespace("manifest_policies_hold_for_podsets_through_the_aggregator", || {
        let mut c = common::cluster::start();
        let manifests = c.dir.path().join("policies");
        std::fs::create_dir(&manifests).unwrap();
        // The broken policy's failurePolicy is fixed below; the file must load first.
        std::fs::write(manifests.join("podsets.yaml"), POLICIES.replace("FAILURE", "Ignore")).unwrap();
        let (mut flags, log) = common::audit_flags(c.dir.path(), AUDIT_POLICY);
        flags.push(admission_config(c.dir.path(), &manifests));
        c.restart_podset_apiserver_with(&flags);

        // No policy API in kube-apiserver 1.20: the server says so and serves.
        let said = c.podset_log();
        assert!(said.contains("does not serve admissionregistration.k8s.io/v1 validatingadmissionpolicies"), "{said}");
        assert!(c.apiservice_available());

        // Deny: a privileged container is refused, in v1beta1 (the rules' version) and v1alpha1 (Equivalent).
        for version in ["demo.k8s.io/v1beta1", "demo.k8s.io/v1alpha1"] {
            let name = format!("priv-{}", &version[12..]);
            let e = create(&c, &podset(version, &name, "default", 1, true, serde_json::json!({})), None).unwrap_err();
            assert!(
                e.contains(&format!(
                    "Error from server (Forbidden): error when creating \"{}\": podsets.demo.k8s.io \"{name}\" is \
                     forbidden: ValidatingAdmissionPolicy 'no-privileged.static.k8s.io' with binding \
                     'no-privileged-binding.static.k8s.io' denied request: privileged containers are not allowed: main",
                    c.dir.path().join(format!("{name}.json")).display()
                )),
                "{e}"
            );
            let ok = format!("ok-{}", &version[12..]);
            create(&c, &podset(version, &ok, "default", 1, false, serde_json::json!({})), None).unwrap();
        }

        // Warn and Audit: kubectl prints the warning and the create succeeds; the audit log has the failure.
        let out = create(&c, &podset("demo.k8s.io/v1beta1", "big", "default", 12, false, serde_json::json!({})), None)
            .unwrap();
        assert!(
            out.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'replicas.static.k8s.io' with binding 'replicas-warn.static.k8s.io': more than 10 replicas"),
            "{out}"
        );
        let events = common::audit_events(&log, |all| {
            all.iter().any(|e| e["objectRef"]["name"] == "big" && e["stage"] == "ResponseComplete")
        });
        let big = events
            .iter()
            .find(|e| e["objectRef"]["name"] == "big" && e["stage"] == "ResponseComplete" && e["verb"] == "create")
            .expect("the create's event");
        let failures: Value = serde_json::from_str(
            big["annotations"]["validation.policy.admission.k8s.io/validation_failure"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(
            failures,
            serde_json::json!([{"message": "more than 10 replicas", "policy": "replicas.static.k8s.io",
                "binding": "replicas-warn.static.k8s.io", "expressionIndex": 0, "validationActions": ["Warn", "Audit"]}])
        );
        let sources = big["annotations"]["source.admission.k8s.io/manifest-policies"].as_str().unwrap_or_default();
        assert!(sources.split(',').any(|p| p == "replicas.static.k8s.io"), "{sources:?}");

        // The namespace object: a label on the namespace decides.
        c.kubectl(&["create", "namespace", "prod"]);
        c.kubectl(&["label", "namespace", "prod", "env=prod"]);
        let out =
            create(&c, &podset("demo.k8s.io/v1beta1", "solo", "prod", 1, false, serde_json::json!({})), None).unwrap();
        assert!(out.contains("production PodSets run at least 2 replicas"), "{out}");
        let out = create(&c, &podset("demo.k8s.io/v1beta1", "solo", "default", 1, false, serde_json::json!({})), None)
            .unwrap();
        assert!(!out.contains("Warning"), "{out}");

        // The authorizer: asked as the request's user through kube-apiserver's SubjectAccessReview.
        c.kubectl(&["create", "clusterrole", "podset-writer", "--verb=create,get", "--resource=podsets.demo.k8s.io"]);
        c.kubectl(&["create", "clusterrole", "podset-approver", "--verb=approve", "--resource=podsets.demo.k8s.io"]);
        for user in ["jane", "joe"] {
            c.kubectl(&[
                "create",
                "clusterrolebinding",
                &format!("{user}-writes"),
                "--clusterrole=podset-writer",
                &format!("--user={user}"),
            ]);
        }
        c.kubectl(&["create", "clusterrolebinding", "joe-approves", "--clusterrole=podset-approver", "--user=joe"]);
        let huge = |name: &str| podset("demo.k8s.io/v1beta1", name, "default", 25, false, serde_json::json!({}));
        let e = create(&c, &huge("jane-huge"), Some("jane")).unwrap_err();
        assert!(e.contains("more than 20 replicas needs the approve verb on podsets"), "{e}");
        create(&c, &huge("joe-huge"), Some("joe")).unwrap();

        // A runtime error: admitted under Ignore, refused under Fail, once the manifest is edited while serving.
        let broken =
            |name: &str| podset("demo.k8s.io/v1beta1", name, "default", 1, false, serde_json::json!({"broken": "yes"}));
        create(&c, &broken("broken-1"), None).unwrap();
        std::fs::write(manifests.join("podsets.yaml"), POLICIES.replace("FAILURE", "Fail")).unwrap();
        c.wait_for("the edited manifest in force", Duration::from_secs(20), |c| {
            create(c, &broken(&format!("broken-{}", rand_suffix())), None).is_err_and(|e| {
                e.contains("expression 'object.spec.paused == false' resulted in error: no such key: paused")
            })
        });
        // A broken edit keeps the last good set.
        std::fs::write(manifests.join("podsets.yaml"), POLICIES.replace("FAILURE", "Sometimes")).unwrap();
        std::thread::sleep(Duration::from_secs(6));
        assert!(create(&c, &broken("broken-2"), None).is_err(), "the last good set (Fail) is kept");
        let said = c.podset_log();
        assert!(said.contains("keeping the last good set"), "{said}");
    });
}

fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A control plane whose policy API envtest's front serves, once `plugin` of the server watches it.
fn with_policy_api(plugin: &str) -> Cluster {
    let c =
        Cluster::start_with_policy_api(podset_envtest::ServerCommand { program: common::BIN.into(), args: Vec::new() });
    let said = format!("{plugin}: watching the cluster's policies and bindings");
    c.wait_for(&format!("{plugin} watching the cluster's policies"), Duration::from_secs(30), |c| {
        c.podset_log().contains(&said)
    });
    c
}

/// The cluster's own policies (`admissionregistration.k8s.io/v1`, served by envtest's front for kube-apiserver 1.20
/// by its wire contract, as a 1.30+ kube-apiserver serves them): a policy created while serving is enforced, a
/// `paramRef` to a ConfigMap of the real 1.20 cluster supplies the limit (and a changed ConfigMap a new one), and
/// deleting the binding stops enforcement.
#[test]
fn the_clusters_policies_hold_for_podsets() {
    in_namespace("the_clusters_policies_hold_for_podsets", || {
        let c = with_policy_api("ValidatingAdmissionPolicy");
        c.kubectl(&["create", "configmap", "podset-limits", "-n", "default", "--from-literal=maxReplicas=3"]);
        let policy = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas-limit}
spec:
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  validations:
  - expression: object.spec.replicas <= int(params.data.maxReplicas)
    messageExpression: "'at most ' + params.data.maxReplicas + ' replicas'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas-limit-binding}
spec:
  policyName: replicas-limit
  validationActions: [Deny]
  paramRef: {name: podset-limits, namespace: default, parameterNotFoundAction: Deny}
"#;
        let file = c.dir.path().join("cluster-policy.yaml");
        std::fs::write(&file, policy).unwrap();
        let started = std::time::Instant::now();
        c.policy_api_kubectl(&["apply", "-f", file.to_str().unwrap()]);
        let mut n = 0;
        let mut next = |replicas: i64| {
            n += 1;
            podset("demo.k8s.io/v1beta1", &format!("cl-{n}"), "default", replicas, false, serde_json::json!({}))
        };
        c.wait_for("the new policy enforced", Duration::from_secs(10), |c| {
            create(c, &next(5), None).is_err_and(|e| e.contains("at most 3 replicas"))
        });
        eprintln!("a policy created while serving was enforced after {:.2}s", started.elapsed().as_secs_f64());
        let e = create(&c, &next(5), None).unwrap_err();
        assert!(
            e.contains("ValidatingAdmissionPolicy 'replicas-limit' with binding 'replicas-limit-binding' denied request: at most 3 replicas"),
            "{e}"
        );
        create(&c, &next(3), None).unwrap();
        // The ConfigMap in the real cluster gives the limit.
        c.kubectl(&[
            "patch",
            "configmap",
            "podset-limits",
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"data":{"maxReplicas":"6"}}"#,
        ]);
        c.wait_for("the new limit", Duration::from_secs(10), |c| create(c, &next(5), None).is_ok());
        // Deleting the binding stops enforcement.
        c.policy_api_kubectl(&["delete", "validatingadmissionpolicybinding", "replicas-limit-binding"]);
        c.wait_for("enforcement stopped", Duration::from_secs(10), |c| create(c, &next(50), None).is_ok());
    });
}

/// The mutating policies an admin of this cluster writes for PodSets (docs/api.md shows them): a default label and
/// a sidecar in the template (merged by container name), replicas capped at 5, and two that break on purpose.
const MUTATING_POLICIES: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: sidecar.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: [v1beta1], resources: [podsets], operations: [CREATE, UPDATE]}
  reinvocationPolicy: IfNeeded
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >-
        Object{
          metadata: Object.metadata{labels: {"policy.example.com/injected": "true"}},
          spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{
            containers: [Object.spec.template.spec.containers{
              name: "sidecar", image: "registry.example.com/proxy:2",
              env: [Object.spec.template.spec.containers.env{name: "PROXY_MODE", value: "strict"}]}]}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: sidecar-binding.static.k8s.io}
spec: {policyName: sidecar.static.k8s.io}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: cap-replicas.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE, UPDATE]}
  reinvocationPolicy: Never
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: >-
        object.spec.replicas > 5 ? [JSONPatch{op: "replace", path: "/spec/replicas", value: 5}] : []
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: cap-replicas-binding.static.k8s.io}
spec: {policyName: cap-replicas.static.k8s.io}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: invalid.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
    objectSelector: {matchLabels: {make: invalid}}
  reinvocationPolicy: Never
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "replace", path: "/spec/replicas", value: -1}]'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: invalid-binding.static.k8s.io}
spec: {policyName: invalid.static.k8s.io}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: broken.static.k8s.io}
spec:
  failurePolicy: FAILURE
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
    objectSelector: {matchLabels: {broken: "yes"}}
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{annotations: {"paused": object.spec.paused}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: broken-binding.static.k8s.io}
spec: {policyName: broken.static.k8s.io}
"#;

/// A validating policy that must see what the mutating ones made.
const SEES_THE_MUTATION: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: injected.static.k8s.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
  validations:
  - expression: >-
      object.spec.replicas <= 5 && object.spec.template.spec.containers.exists(c, c.name == "sidecar" &&
      c.image == "registry.example.com/proxy:2")
    message: not mutated
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: injected-binding.static.k8s.io}
spec: {policyName: injected.static.k8s.io, validationActions: [Deny]}
"#;

fn mutating_admission_config(dir: &Path, validating: &Path, mutating: &Path) -> String {
    let file = dir.join("admission.yaml");
    let plugin = |name: &str, dir: &Path| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: {name}Configuration\n    \
             staticManifestsDir: {}\n",
            dir.display()
        )
    };
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionPolicy", validating),
        plugin("MutatingAdmissionPolicy", mutating)
    );
    std::fs::write(&file, text).unwrap();
    format!("--admission-control-config-file={}", file.display())
}

fn get(c: &Cluster, name: &str, api_version: &str) -> Value {
    let resource = format!("podsets.{}.demo.k8s.io", &api_version[12..]);
    serde_json::from_str(&c.kubectl(&["get", &resource, name, "-n", "default", "-o", "json"])).unwrap()
}

fn containers(o: &Value) -> Vec<(String, String)> {
    let list = o["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    list.iter().map(|c| (c["name"].as_str().unwrap().to_owned(), c["image"].as_str().unwrap().to_owned())).collect()
}

#[test]
fn manifest_mutating_policies_hold_for_podsets_through_the_aggregator() {
    in_namespace("manifest_mutating_policies_hold_for_podsets_through_the_aggregator", || {
        let mut c = common::cluster::start();
        let (validating, mutating) = (c.dir.path().join("validating"), c.dir.path().join("mutating"));
        std::fs::create_dir(&validating).unwrap();
        std::fs::create_dir(&mutating).unwrap();
        std::fs::write(validating.join("injected.yaml"), SEES_THE_MUTATION).unwrap();
        std::fs::write(mutating.join("podsets.yaml"), MUTATING_POLICIES.replace("FAILURE", "Fail")).unwrap();
        let flags = [mutating_admission_config(c.dir.path(), &validating, &mutating)];
        c.restart_podset_apiserver_with(&flags);

        // No policy API in kube-apiserver 1.20: the server says so and serves.
        let said = c.podset_log();
        assert!(said.contains("does not serve admissionregistration.k8s.io/v1 mutatingadmissionpolicies"), "{said}");
        assert!(c.apiservice_available());

        // The label and the sidecar (the existing one updated by name, not added twice), replicas capped; in
        // v1beta1, the sidecar policy's version, and v1alpha1 (Equivalent); the validating policy saw it all.
        for version in ["demo.k8s.io/v1beta1", "demo.k8s.io/v1alpha1"] {
            let name = format!("web-{}", &version[12..]);
            create(&c, &podset(version, &name, "default", 20, false, serde_json::json!({"team": "a"})), None).unwrap();
            let o = get(&c, &name, version);
            assert_eq!(
                o["metadata"]["labels"],
                serde_json::json!({"team": "a", "policy.example.com/injected": "true"})
            );
            assert_eq!(o["spec"]["replicas"], 5, "{o}");
            assert_eq!(
                containers(&o),
                [
                    ("main".into(), "registry.example.com/web:1".into()),
                    ("sidecar".into(), "registry.example.com/proxy:2".into())
                ]
            );
            assert_eq!(
                o["spec"]["template"]["spec"]["containers"][1]["env"],
                serde_json::json!([{"name": "PROXY_MODE", "value": "strict"}])
            );
        }

        // A dry run shows the mutation and stores nothing.
        let file = c.dir.path().join("dry.json");
        let dry = podset("demo.k8s.io/v1beta1", "dry", "default", 9, false, serde_json::json!({}));
        std::fs::write(&file, serde_json::to_vec(&dry).unwrap()).unwrap();
        let shown: Value = serde_json::from_str(&c.kubectl(&[
            "create",
            "-f",
            file.to_str().unwrap(),
            "--dry-run=server",
            "-o",
            "json",
        ]))
        .unwrap();
        assert_eq!(shown["spec"]["replicas"], 5);
        assert_eq!(shown["metadata"]["labels"]["policy.example.com/injected"], "true");
        let missing = c.kubectl_try(&["get", "podsets", "dry", "-n", "default"]).unwrap_err();
        assert!(missing.contains("NotFound"), "{missing}");

        // A mutation that makes the object invalid is refused as any invalid write: 422.
        let e = create(
            &c,
            &podset("demo.k8s.io/v1beta1", "bad", "default", 1, false, serde_json::json!({"make": "invalid"})),
            None,
        )
        .unwrap_err();
        assert!(e.contains("The PodSet \"bad\" is invalid: spec.replicas: Invalid value: -1"), "{e}");

        // A CEL error under failurePolicy Fail: 403 with kube's message; under Ignore, once the manifest is edited
        // while serving, the create goes through unchanged.
        let broken =
            |name: &str| podset("demo.k8s.io/v1beta1", name, "default", 1, false, serde_json::json!({"broken": "yes"}));
        let e = create(&c, &broken("broken-1"), None).unwrap_err();
        eprintln!("a failing mutation under failurePolicy Fail, as kubectl prints it:\n{e}");
        assert!(
            e.contains(
                "policy 'broken.static.k8s.io' with binding 'broken-binding.static.k8s.io' denied request: expression"
            ) && e.contains("no such key: paused"),
            "{e}"
        );
        std::fs::write(mutating.join("podsets.yaml"), MUTATING_POLICIES.replace("FAILURE", "Ignore")).unwrap();
        c.wait_for("the edited manifest in force", Duration::from_secs(20), |c| {
            create(c, &broken(&format!("broken-{}", rand_suffix() + 2)), None).is_ok()
        });
    });
}

/// The cluster's own mutating policies (served by envtest's front by their wire contract, as a 1.36+
/// kube-apiserver serves them), with a `paramRef` to a ConfigMap of the real 1.20 cluster.
#[test]
fn the_clusters_mutating_policies_hold_for_podsets() {
    in_namespace("the_clusters_mutating_policies_hold_for_podsets", || {
        let c = with_policy_api("MutatingAdmissionPolicy");
        c.kubectl(&["create", "configmap", "podset-defaults", "-n", "default", "--from-literal=team=platform"]);
        let policy = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: default-team}
spec:
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - {apiGroups: [demo.k8s.io], apiVersions: ["*"], resources: [podsets], operations: [CREATE]}
  matchConditions:
  - name: no-team
    expression: "!has(object.metadata.labels) || !('team' in object.metadata.labels)"
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{labels: {"team": params.data.team}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: default-team-binding}
spec:
  policyName: default-team
  paramRef: {name: podset-defaults, namespace: default, parameterNotFoundAction: Deny}
"#;
        let file = c.dir.path().join("cluster-mutating-policy.yaml");
        std::fs::write(&file, policy).unwrap();
        c.policy_api_kubectl(&["apply", "-f", file.to_str().unwrap()]);
        let mut n = 0;
        let mut next = |labels: Value| {
            n += 1;
            let name = format!("team-{n}");
            (name.clone(), podset("demo.k8s.io/v1beta1", &name, "default", 1, false, labels))
        };
        let team_of =
            |c: &Cluster, name: &str| get(c, name, "demo.k8s.io/v1beta1")["metadata"]["labels"]["team"].clone();
        c.wait_for("the new policy applied", Duration::from_secs(10), |c| {
            let (name, o) = next(serde_json::json!({}));
            create(c, &o, None).is_ok() && team_of(c, &name) == "platform"
        });
        // A team of its own is kept (the match condition).
        let (name, o) = next(serde_json::json!({"team": "web"}));
        create(&c, &o, None).unwrap();
        assert_eq!(team_of(&c, &name), "web");
        // The ConfigMap in the real cluster gives the value.
        c.kubectl(&[
            "patch",
            "configmap",
            "podset-defaults",
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"data":{"team":"data"}}"#,
        ]);
        c.wait_for("the new default", Duration::from_secs(10), |c| {
            let (name, o) = next(serde_json::json!({}));
            create(c, &o, None).is_ok() && team_of(c, &name) == "data"
        });
        // Deleting the binding stops it.
        c.policy_api_kubectl(&["delete", "mutatingadmissionpolicybinding", "default-team-binding"]);
        c.wait_for("the policy no longer applied", Duration::from_secs(10), |c| {
            let (name, o) = next(serde_json::json!({}));
            create(c, &o, None).is_ok() && team_of(c, &name).is_null()
        });

        // The manifests' policies, created through the API instead: the same label, sidecar and cap.
        let file = c.dir.path().join("cluster-mutating-policies.yaml");
        std::fs::write(&file, MUTATING_POLICIES.replace(".static.k8s.io", "").replace("FAILURE", "Fail")).unwrap();
        c.policy_api_kubectl(&["apply", "-f", file.to_str().unwrap()]);
        let mut m = 0;
        c.wait_for("the sidecar and cap applied", Duration::from_secs(10), |c| {
            m += 1;
            let name = format!("api-{m}");
            let o = podset("demo.k8s.io/v1beta1", &name, "default", 20, false, serde_json::json!({"team": "a"}));
            if create(c, &o, None).is_err() {
                return false;
            }
            let got = get(c, &name, "demo.k8s.io/v1beta1");
            got["spec"]["replicas"] == 5
                && got["metadata"]["labels"]["policy.example.com/injected"] == "true"
                && containers(&got)
                    == [
                        ("main".to_owned(), "registry.example.com/web:1".to_owned()),
                        ("sidecar".to_owned(), "registry.example.com/proxy:2".to_owned()),
                    ]
        });
    });
}
