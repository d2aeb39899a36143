//! The manifests under deploy/: every overlay renders with kubectl's kustomize, in a namespace of the admin's
//! choosing (nothing left in `podset-system`, the auth-reader RoleBinding still in kube-system), its Pods meet the
//! "restricted" Pod Security Standard, and kube-apiserver (the local control plane, 1.20) accepts the whole overlay
//! with `kubectl apply --dry-run=server -k` in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
//! 1.20 has no Pod Security admission, so the standard's fields are checked here, one by one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cluster::in_namespace;
use serde_json::Value;

const OVERLAYS: [&str; 2] = ["self-signed", "cert-manager"];
/// Not the default, to show the namespace is the admin's choice.
const NAMESPACE: &str = "podsets-ops";

#[test]
fn overlays_render_in_any_namespace_and_meet_the_restricted_standard() {
    for overlay in OVERLAYS {
        let default = render(&repo_deploy(), overlay);
        assert_eq!(namespace_of(&default), "podset-system", "{overlay}: the default namespace");

        let copy = deploy_in_namespace(NAMESPACE);
        let objects = render(copy.path(), overlay);
        let text = serde_json::to_string(&objects).unwrap();
        assert!(!text.contains("podset-system"), "{overlay}: podset-system left after choosing {NAMESPACE}:\n{text}");
        assert_eq!(namespace_of(&objects), NAMESPACE);
        let reader = find(&objects, "RoleBinding", "podset-apiserver-auth-reader");
        assert_eq!(reader["metadata"]["namespace"], "kube-system", "{overlay}: {reader}");
        for binding in objects.iter().filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding") {
            assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE, "{overlay}: {binding}");
        }
        let apiservice = find(&objects, "APIService", "v1alpha1.demo.k8s.io");
        assert_eq!(apiservice["spec"]["service"]["namespace"], NAMESPACE);

        let sts = find(&objects, "StatefulSet", "podset-apiserver");
        let pod = &sts["spec"]["template"]["spec"];
        assert_restricted(overlay, pod);
        assert_operable(overlay, pod);
        match overlay {
            "self-signed" => assert_eq!(apiservice["spec"]["insecureSkipTLSVerify"], true),
            _ => {
                let certificate = find(&objects, "Certificate", "podset-apiserver-serving");
                let svc = format!("podset-apiserver.{NAMESPACE}.svc");
                assert_eq!(certificate["spec"]["dnsNames"][0], svc.as_str(), "{certificate}");
                assert_eq!(
                    apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                    format!("{NAMESPACE}/podset-apiserver-serving")
                );
                assert!(
                    apiservice["spec"].get("caBundle").is_none()
                        && apiservice["spec"].get("insecureSkipTLSVerify").is_none()
                );
                let args = container(pod)["args"].as_array().unwrap();
                assert!(args.iter().any(|a| a == "--tls-cert-file=/etc/podset-apiserver/tls/tls.crt"), "{args:?}");
                assert_eq!(pod["volumes"][0]["secret"]["secretName"], certificate["spec"]["secretName"]);
            }
        }
    }
}

#[test]
fn overlays_are_accepted_by_kube_apiserver_in_a_restricted_namespace() {
    in_namespace("overlays_are_accepted_by_kube_apiserver_in_a_restricted_namespace", || {
        let c = common::cluster::start();
        let copy = deploy_in_namespace(NAMESPACE);
        // The namespace as the overlay makes it (with its pod-security label); the rest is a dry run.
        let objects = render(copy.path(), "self-signed");
        let ns = find(&objects, "Namespace", NAMESPACE);
        assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
        c.apply_text("namespace.json", &ns.to_string());
        // Stand-ins for cert-manager's CRDs (their schemas are cert-manager's business, not checked here).
        c.apply_text("cert-manager-crds.json", &cert_manager_crds());
        c.wait_for("the stand-in cert-manager CRDs", std::time::Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "certificates.cert-manager.io", "-A"]).is_ok()
        });

        for overlay in OVERLAYS {
            let dir = copy.path().join("overlays").join(overlay);
            let out = c.kubectl(&["apply", "--dry-run=server", "-k", dir.to_str().unwrap()]);
            for line in out.lines() {
                assert!(line.ends_with("(server dry run)"), "{overlay}: {line}\n{out}");
            }
            assert!(out.contains("statefulset.apps/podset-apiserver"), "{overlay}:\n{out}");

            // The StatefulSet's Pod as the kubelet would get it: admission (priority class, service account) and
            // validation of the Pod spec run on a dry-run create.
            let objects = render(copy.path(), overlay);
            let sts = find(&objects, "StatefulSet", "podset-apiserver");
            if c.kubectl_try(&["-n", NAMESPACE, "get", "serviceaccount", "podset-apiserver"]).is_err() {
                c.kubectl(&["-n", NAMESPACE, "create", "serviceaccount", "podset-apiserver"]);
            }
            // As the StatefulSet controller makes it: a volume for each claim template.
            let mut spec = sts["spec"]["template"]["spec"].clone();
            for claim in sts["spec"]["volumeClaimTemplates"].as_array().unwrap() {
                let name = claim["metadata"]["name"].as_str().unwrap();
                let volume = serde_json::json!({"name": name,
                    "persistentVolumeClaim": {"claimName": format!("{name}-podset-apiserver-0")}});
                match spec["volumes"].as_array_mut() {
                    Some(volumes) => volumes.push(volume),
                    None => spec["volumes"] = serde_json::json!([volume]),
                }
            }
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "podset-apiserver-0", "namespace": NAMESPACE,
                             "labels": sts["spec"]["template"]["metadata"]["labels"]},
                "spec": spec,
            });
            let path = copy.path().join(format!("pod-{overlay}.json"));
            std::fs::write(&path, pod.to_string()).unwrap();
            let out = c.kubectl(&["create", "--dry-run=server", "-o", "json", "-f", path.to_str().unwrap()]);
            let admitted: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(admitted["spec"]["priorityClassName"], "system-cluster-critical");
            assert!(admitted["spec"]["priority"].as_i64().unwrap() >= 2_000_000_000, "{admitted}");
        }
    });
}

/// The `restricted` Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards), as
/// Pod Security admission checks it, plus the baseline checks it includes.
fn assert_restricted(overlay: &str, pod: &Value) {
    let ctx = &pod["securityContext"];
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[host], true, "{overlay}: {host}");
    }
    assert!(ctx.get("sysctls").is_none(), "{overlay}: sysctls");
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let kind = volume.as_object().unwrap().keys().find(|k| *k != "name").unwrap();
        let allowed = [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ];
        assert!(allowed.contains(&kind.as_str()), "{overlay}: volume type {kind}");
    }
    let containers =
        pod["containers"].as_array().unwrap().iter().chain(pod["initContainers"].as_array().into_iter().flatten());
    for c in containers {
        let name = &c["name"];
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"], true, "{overlay}/{name}: privileged");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{overlay}/{name}: allowPrivilegeEscalation must be false");
        let drop = sc["capabilities"]["drop"].as_array().cloned().unwrap_or_default();
        assert!(drop.iter().any(|d| d == "ALL"), "{overlay}/{name}: capabilities must drop ALL");
        let add = sc["capabilities"]["add"].as_array().cloned().unwrap_or_default();
        assert!(add.iter().all(|a| a == "NET_BIND_SERVICE"), "{overlay}/{name}: adds {add:?}");
        let non_root = sc.get("runAsNonRoot").unwrap_or(&ctx["runAsNonRoot"]);
        assert_eq!(non_root, true, "{overlay}/{name}: runAsNonRoot");
        for user in [&sc["runAsUser"], &ctx["runAsUser"]] {
            assert_ne!(user, 0, "{overlay}/{name}: runAsUser 0");
        }
        let seccomp = sc["seccompProfile"]["type"].as_str().or(ctx["seccompProfile"]["type"].as_str());
        assert!(matches!(seccomp, Some("RuntimeDefault" | "Localhost")), "{overlay}/{name}: seccompProfile");
        for port in c["ports"].as_array().into_iter().flatten() {
            assert!(port.get("hostPort").is_none_or(|p| p == 0), "{overlay}/{name}: hostPort");
        }
        assert!(sc.get("procMount").is_none_or(|p| p == "Default"), "{overlay}/{name}: procMount");
        let selinux = sc["seLinuxOptions"]["type"].as_str().or(ctx["seLinuxOptions"]["type"].as_str());
        assert!(matches!(selinux, None | Some("" | "container_t" | "container_init_t" | "container_kvm_t")));
        assert!(sc["seLinuxOptions"].get("user").is_none() && sc["seLinuxOptions"].get("role").is_none());
        assert_ne!(sc["appArmorProfile"]["type"], "Unconfined", "{overlay}/{name}: AppArmor");
    }
}

/// What the issue asks of the Pod beyond the standard.
fn assert_operable(overlay: &str, pod: &Value) {
    let c = container(pod);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{overlay}");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical", "{overlay}");
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            if kind == "limits" && resource == "cpu" {
                continue; // No CPU limit: throttling an API server slows every client; requests reserve it.
            }
            assert!(c["resources"][kind][resource].is_string(), "{overlay}: resources.{kind}.{resource}");
        }
    }
    for (probe, path) in [("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{overlay}: {probe}");
        assert_eq!(get["port"], "https", "{overlay}: {probe}");
        assert_eq!(get["scheme"], "HTTPS", "{overlay}: {probe}");
    }
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let shutdown: i64 = args
        .iter()
        .find_map(|a| a.strip_prefix("--shutdown-timeout="))
        .expect("--shutdown-timeout set in the StatefulSet")
        .parse()
        .unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_i64().expect("terminationGracePeriodSeconds");
    assert!(grace > shutdown, "{overlay}: SIGKILL ({grace}s) before the server's own shutdown ({shutdown}s) ends");
    assert_eq!(c["env"][0]["name"], "POD_NAMESPACE");
}

fn container(pod: &Value) -> &Value {
    &pod["containers"][0]
}

fn repo_deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// A copy of deploy/ with the overlays' namespace changed, as an admin would edit it.
fn deploy_in_namespace(namespace: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&repo_deploy(), tmp.path());
    for overlay in OVERLAYS {
        let path = tmp.path().join("overlays").join(overlay).join("kustomization.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\nnamespace: podset-system\n"), "{}: no namespace line", path.display());
        std::fs::write(&path, text.replace("\nnamespace: podset-system\n", &format!("\nnamespace: {namespace}\n")))
            .unwrap();
    }
    tmp
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().map(Result::unwrap) {
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// `kubectl kustomize deploy/overlays/<overlay>`, as objects.
fn render(deploy: &Path, overlay: &str) -> Vec<Value> {
    let out = Command::new(common::assets_dir().join("kubectl"))
        .arg("kustomize")
        .arg(deploy.join("overlays").join(overlay))
        .output()
        .expect("kubectl from KUBEBUILDER_ASSETS");
    assert!(out.status.success(), "kubectl kustomize {overlay}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text).map(|doc| serde::Deserialize::deserialize(doc).unwrap()).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn namespace_of(objects: &[Value]) -> String {
    find(objects, "ServiceAccount", "podset-apiserver")["metadata"]["namespace"].as_str().unwrap().to_owned()
}

fn cert_manager_crds() -> String {
    let crd = |kind: &str| {
        let plural = format!("{}s", kind.to_lowercase());
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        })
    };
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [crd("Issuer"), crd("Certificate")]}).to_string()
}
