//! ValidatingAdmissionPolicy on the local 1.20 control plane, through kube-apiserver's aggregator with kubectl
//! 1.37: policies from `staticManifestsDir` (kube-apiserver 1.20 serves no policy API, so manifests are how this
//! cluster gets policies), for `v1beta1` and `v1alpha1` requests alike; each validation action; a
//! messageExpression, a variable, the namespace object and the authorizer deciding a case each; failure policies;
//! and a manifest edited while serving. The server starts and stays ready though the cluster has no policy API.

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

/// The cluster's own policies (`admissionregistration.k8s.io/v1`, served by envtest's front for kube-apiserver 1.20
/// by its wire contract, as a 1.30+ kube-apiserver serves them): a policy created while serving is enforced, a
/// `paramRef` to a ConfigMap of the real 1.20 cluster supplies the limit (and a changed ConfigMap a new one), and
/// deleting the binding stops enforcement.
#[test]
fn the_clusters_policies_hold_for_podsets() {
    in_namespace("the_clusters_policies_hold_for_podsets", || {
        let c = Cluster::start_with_policy_api(podset_envtest::ServerCommand {
            program: common::BIN.into(),
            args: Vec::new(),
        });
        c.wait_for("the server watching the cluster's policies", Duration::from_secs(30), |c| {
            c.podset_log().contains("watching the cluster's policies and bindings")
        });
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
