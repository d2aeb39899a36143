//! The manifests under deploy/: every overlay renders with kubectl's kustomize, in a namespace of the admin's
//! choosing (nothing left in `podset-system`, the auth-reader RoleBinding still in kube-system), its Pods meet the
//! "restricted" Pod Security Standard, and kube-apiserver (the local control plane, 1.20) accepts the whole overlay
//! with `kubectl apply --dry-run=server -k` in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
//! 1.20 has no Pod Security admission, so the standard's fields are checked here, one by one. The HA overlay
//! (ha-etcd) is also checked for what makes it one: 3 replicas on etcd, the StatefulSet's Pod otherwise, a
//! PodDisruptionBudget, spread across nodes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cluster::in_namespace;
use serde_json::Value;

const OVERLAYS: [&str; 3] = ["self-signed", "cert-manager", "ha-etcd"];
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
        for version in ["v1beta1", "v1alpha1"] {
            let apiservice = find(&objects, "APIService", &format!("{version}.demo.k8s.io"));
            assert_eq!(apiservice["spec"]["service"]["namespace"], NAMESPACE);
            assert_eq!(apiservice["spec"]["version"], version);
            match overlay {
                "self-signed" => assert_eq!(apiservice["spec"]["insecureSkipTLSVerify"], true),
                _ => assert_eq!(
                    apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                    format!("{NAMESPACE}/podset-apiserver-serving")
                ),
            }
        }
        let apiservice = find(&objects, "APIService", "v1alpha1.demo.k8s.io");

        let workload = workload_of(overlay, &objects);
        // v1beta1's Service selects this build's Pods, and only Pods that say they serve v1beta1: an older build's
        // Pods (which do not) never get its requests during a rolling upgrade.
        let pod_labels = &workload["spec"]["template"]["metadata"]["labels"];
        for (version, service) in [("v1alpha1", "podset-apiserver"), ("v1beta1", "podset-apiserver-v1beta1")] {
            let apiservice = find(&objects, "APIService", &format!("{version}.demo.k8s.io"));
            assert_eq!(apiservice["spec"]["service"]["name"], service, "{overlay}: {apiservice}");
            let selector = &find(&objects, "Service", service)["spec"]["selector"];
            assert!(
                has_labels(pod_labels, selector),
                "{overlay}: {service} selects {selector}, Pods have {pod_labels}"
            );
        }
        let beta_selector = &find(&objects, "Service", "podset-apiserver-v1beta1")["spec"]["selector"];
        assert_eq!(beta_selector["demo.k8s.io/serves-v1beta1"], "true", "{overlay}: {beta_selector}");
        let pod = &workload["spec"]["template"]["spec"];
        assert_restricted(overlay, pod);
        assert_operable(overlay, pod);
        match overlay {
            "self-signed" => assert_eq!(apiservice["spec"]["insecureSkipTLSVerify"], true),
            // One certificate for every replica: HA takes cert-manager's too.
            _ => {
                let certificate = find(&objects, "Certificate", "podset-apiserver-serving");
                let names: Vec<String> = ["podset-apiserver", "podset-apiserver-v1beta1"]
                    .iter()
                    .flat_map(|s| [format!("{s}.{NAMESPACE}.svc"), format!("{s}.{NAMESPACE}.svc.cluster.local")])
                    .collect();
                assert_eq!(certificate["spec"]["dnsNames"], serde_json::json!(names), "{certificate}");
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
                assert_eq!(volume(pod, "tls")["secret"]["secretName"], certificate["spec"]["secretName"]);
            }
        }
        match overlay {
            "ha-etcd" => {
                let single = render(copy.path(), "cert-manager");
                assert_highly_available(&objects, workload, workload_of("cert-manager", &single));
            }
            _ => {
                assert_eq!(workload["spec"]["replicas"], 1, "{overlay}: sled has one writer");
                assert!(!args(pod).iter().any(|a| a.starts_with("--storage-backend") || a.starts_with("--etcd")));
            }
        }
    }
}

/// The HA overlay's objects and Deployment, against `statefulset`: cert-manager's, the same server on one replica.
fn assert_highly_available(objects: &[Value], deployment: &Value, statefulset: &Value) {
    let pod = &deployment["spec"]["template"]["spec"];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 3);
    let rolling = &deployment["spec"]["strategy"]["rollingUpdate"];
    assert_eq!((&rolling["maxUnavailable"], &rolling["maxSurge"]), (&0.into(), &1.into()), "{rolling}");
    assert!(selects(&deployment["spec"]["selector"], labels));
    assert!(has_labels(labels, &find(objects, "Service", "podset-apiserver")["spec"]["selector"]));

    // The StatefulSet's Pod but for the storage: same image, probes, security context, resources, priority.
    let single = &statefulset["spec"]["template"]["spec"];
    let single_args = args(single);
    let args = args(pod);
    assert_eq!(args[..single_args.len()], single_args[..], "the StatefulSet's arguments first");
    let mounts = container(pod)["volumeMounts"].as_array().unwrap();
    for mount in container(single)["volumeMounts"].as_array().unwrap() {
        assert!(mounts.contains(mount), "{mount} not in {mounts:?}");
    }
    let without = |pod: &Value| {
        let mut pod = pod.clone();
        for field in ["volumes", "topologySpreadConstraints"] {
            pod.as_object_mut().unwrap().remove(field);
        }
        for field in ["args", "volumeMounts"] {
            pod["containers"][0].as_object_mut().unwrap().remove(field);
        }
        pod
    };
    assert_eq!(without(pod), without(single), "the Pod differs from the StatefulSet's beyond storage and spread");
    assert_eq!(deployment["spec"]["template"]["metadata"], statefulset["spec"]["template"]["metadata"]);

    // etcd, with the client's TLS files from the admin's Secret, read-only.
    assert!(args.contains(&"--storage-backend=etcd"), "{args:?}");
    let servers = flag(&args, "--etcd-servers").expect("--etcd-servers");
    assert!(servers.split(',').all(|url| url.starts_with("https://")), "{servers}");
    let secret = volume(pod, "etcd-client");
    assert_eq!(secret["secret"]["secretName"], "podset-apiserver-etcd-client");
    let mount = mounts.iter().find(|m| m["name"] == "etcd-client").expect("etcd-client mounted");
    assert_eq!(mount["readOnly"], true);
    for (flag_name, key) in [("--etcd-cafile", "ca.crt"), ("--etcd-certfile", "tls.crt"), ("--etcd-keyfile", "tls.key")]
    {
        let expected = format!("{}/{key}", mount["mountPath"].as_str().unwrap());
        assert_eq!(flag(&args, flag_name), Some(expected.as_str()), "{flag_name}");
    }
    // Nothing kept on the node: no claim, and --data-dir (which the server creates) is an emptyDir.
    assert!(deployment["spec"].get("volumeClaimTemplates").is_none());
    let data_dir = flag(&args, "--data-dir").expect("--data-dir");
    let data = mounts.iter().find(|m| m["mountPath"] == data_dir).expect("a volume at --data-dir");
    assert!(volume(pod, data["name"].as_str().unwrap()).get("emptyDir").is_some());
    assert!(pod["volumes"].as_array().unwrap().iter().all(|v| v.get("persistentVolumeClaim").is_none()));

    // Voluntary disruptions take one replica at a time.
    let pdb = find(objects, "PodDisruptionBudget", "podset-apiserver");
    assert_eq!(pdb["apiVersion"], "policy/v1", "policy/v1beta1 is gone since Kubernetes 1.25");
    assert!(selects(&pdb["spec"]["selector"], labels), "{pdb}");
    let allowed = match (pdb["spec"]["maxUnavailable"].as_i64(), pdb["spec"]["minAvailable"].as_i64()) {
        (Some(max_unavailable), None) => max_unavailable,
        (None, Some(min_available)) => 3 - min_available,
        _ => panic!("one of maxUnavailable and minAvailable, as a number: {pdb}"),
    };
    assert_eq!(allowed, 1, "{pdb}");

    // One replica per node (a hard constraint), and across zones where there are several (a soft one).
    let spread = pod["topologySpreadConstraints"].as_array().expect("topologySpreadConstraints");
    let on =
        |key: &str| spread.iter().find(|c| c["topologyKey"] == key).unwrap_or_else(|| panic!("no spread on {key}"));
    for (key, when) in [("kubernetes.io/hostname", "DoNotSchedule"), ("topology.kubernetes.io/zone", "ScheduleAnyway")]
    {
        let c = on(key);
        assert_eq!((&c["maxSkew"], &c["whenUnsatisfiable"]), (&1.into(), &when.into()), "{c}");
        assert!(selects(&c["labelSelector"], labels), "{c}");
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

        // 1.20 predates policy/v1 (1.21); the manifests name it since 1.25 removed policy/v1beta1.
        let old_cluster = !c.kubectl(&["api-versions"]).lines().any(|v| v == "policy/v1");
        for overlay in OVERLAYS {
            let dir = copy.path().join("overlays").join(overlay);
            let rendered = render(copy.path(), overlay);
            let objects: Vec<Value> =
                rendered.iter().map(|o| if old_cluster { for_1_20(o) } else { o.clone() }).collect();
            let out = if objects == rendered {
                c.kubectl(&["apply", "--dry-run=server", "-k", dir.to_str().unwrap()])
            } else {
                let path = copy.path().join(format!("{overlay}-for-1.20.json"));
                let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
                std::fs::write(&path, list.to_string()).unwrap();
                c.kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
            };
            for line in out.lines() {
                assert!(line.ends_with("(server dry run)"), "{overlay}: {line}\n{out}");
            }
            let kind = workload_of(overlay, &objects)["kind"].as_str().unwrap().to_lowercase();
            assert!(out.contains(&format!("{kind}.apps/podset-apiserver")), "{overlay}:\n{out}");
            if overlay == "ha-etcd" {
                assert!(out.contains("poddisruptionbudget.policy/podset-apiserver"), "{overlay}:\n{out}");
            }

            // The workload's Pod as the kubelet would get it: admission (priority class, service account) and
            // validation of the Pod spec run on a dry-run create.
            let workload = workload_of(overlay, &objects);
            if c.kubectl_try(&["-n", NAMESPACE, "get", "serviceaccount", "podset-apiserver"]).is_err() {
                c.kubectl(&["-n", NAMESPACE, "create", "serviceaccount", "podset-apiserver"]);
            }
            // As the StatefulSet controller makes it: a volume for each claim template.
            let mut spec = workload["spec"]["template"]["spec"].clone();
            for claim in workload["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
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
                             "labels": workload["spec"]["template"]["metadata"]["labels"]},
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
    let args = args(pod);
    let shutdown: i64 = flag(&args, "--shutdown-timeout").expect("--shutdown-timeout set").parse().unwrap();
    // Serving on after SIGTERM (a Go duration, whole seconds here), then the shutdown proper.
    let delay: i64 = flag(&args, "--shutdown-delay-duration")
        .map_or(0, |d| d.strip_suffix('s').expect("--shutdown-delay-duration in seconds").parse().unwrap());
    let grace = pod["terminationGracePeriodSeconds"].as_i64().expect("terminationGracePeriodSeconds");
    assert!(
        grace > delay + shutdown,
        "{overlay}: SIGKILL ({grace}s) before the server's own shutdown ({delay}s + {shutdown}s) ends"
    );
    assert_eq!(c["env"][0]["name"], "POD_NAMESPACE");
}

fn container(pod: &Value) -> &Value {
    &pod["containers"][0]
}

/// The server's StatefulSet, or the HA overlay's Deployment; the only workload rendered.
fn workload_of<'a>(overlay: &str, objects: &'a [Value]) -> &'a Value {
    let workloads: Vec<&Value> = objects.iter().filter(|o| o["apiVersion"] == "apps/v1").collect();
    assert_eq!(workloads.len(), 1, "{overlay}: one workload, not {workloads:?}");
    let kind = if overlay == "ha-etcd" { "Deployment" } else { "StatefulSet" };
    find(objects, kind, "podset-apiserver")
}

fn volume<'a>(pod: &'a Value, name: &str) -> &'a Value {
    let volumes = pod["volumes"].as_array().unwrap_or_else(|| panic!("no volumes, looking for {name}"));
    volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name} in {volumes:?}"))
}

fn args(pod: &Value) -> Vec<&str> {
    container(pod)["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect()
}

/// The value of `--name=value` in `args`.
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter().find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
}

/// Whether a label selector (matchLabels only) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    assert!(selector.get("matchExpressions").is_none(), "matchExpressions not handled here: {selector}");
    has_labels(labels, &selector["matchLabels"])
}

/// Whether `labels` has each of `wanted` (not none: an empty selector selects everything or nothing).
fn has_labels(labels: &Value, wanted: &Value) -> bool {
    let wanted = wanted.as_object().expect("labels");
    !wanted.is_empty() && wanted.iter().all(|(k, v)| &labels[k] == v)
}

/// An object as kube-apiserver 1.20 takes it: the PodDisruptionBudget in policy/v1beta1, whose spec has the fields
/// the manifest uses (v1 changed what an empty selector means, and the manifest's is not empty); topology spread
/// without nodeTaintsPolicy (1.26), which kubectl's validation against 1.20's schema rejects as unknown.
fn for_1_20(object: &Value) -> Value {
    let mut object = object.clone();
    if object["kind"] == "PodDisruptionBudget" && object["apiVersion"] == "policy/v1" {
        assert!(object["spec"]["selector"]["matchLabels"].as_object().is_some_and(|l| !l.is_empty()));
        object["apiVersion"] = "policy/v1beta1".into();
    }
    let spread = object.pointer_mut("/spec/template/spec/topologySpreadConstraints").and_then(Value::as_array_mut);
    for constraint in spread.into_iter().flatten() {
        constraint.as_object_mut().unwrap().remove("nodeTaintsPolicy");
    }
    object
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
