//! The manifests under deploy/: every overlay renders with kubectl's kustomize, in a namespace of the admin's
//! choosing (nothing left in `podset-system`, the auth-reader RoleBinding still in kube-system), its Pods meet the
//! "restricted" Pod Security Standard, and kube-apiserver (the local control plane, 1.20) accepts the whole overlay
//! with `kubectl apply --dry-run=server -k` in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
//! 1.20 has no Pod Security admission, so the standard's fields are checked here, one by one. The HA overlay
//! (ha-etcd) is also checked for what makes it one: 3 replicas on etcd, the StatefulSet's Pod otherwise, a
//! PodDisruptionBudget, spread across nodes, `--goaway-chance`.
//!
//! The components of deploy/components/ that switch features on (docs/operate.md, "Switching features on") are
//! rendered with every overlay the docs' table names them for, one at a time and all at once: each adds what it is
//! for (flags, the volumes they read, objects) and nothing else, the Pod still meets the standard, and kube-apiserver
//! accepts each overlay with all its components. A copy of deploy/ with a planted breakage shows the checks fail.
//! Rendering is kubectl 1.37's kustomize; `PODSET_EXTRA_KUBECTLS` (paths, `:` between) adds kubectls that must render
//! every combination alike. kubectl 1.20's kustomize (v2.0.3) renders no overlay at all (it knows neither
//! `components:` nor `patches` with a `target`), so it is not among them; 1.22 (kustomize v4.2) is the first that does.

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
    // kube-apiserver's proxy holds one connection to the Service: GOAWAYs make it reconnect, to other replicas.
    assert_eq!(flag(&args(pod), "--goaway-chance"), Some("0.001"), "ha-etcd lists components/goaway");
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
        // Stand-ins for cert-manager's and the Prometheus Operator's CRDs (their schemas are their business, not
        // checked here).
        c.apply_text("cert-manager-crds.json", &stand_in_crds("cert-manager.io", &["Issuer", "Certificate"]));
        let monitoring = stand_in_crds("monitoring.coreos.com", &["ServiceMonitor", "PrometheusRule"]);
        c.apply_text("prometheus-operator-crds.json", &monitoring);
        c.wait_for("the stand-in CRDs", std::time::Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "certificates.cert-manager.io", "-A"]).is_ok()
                && c.kubectl_try(&["get", "servicemonitors.monitoring.coreos.com", "-A"]).is_ok()
        });

        // 1.20 predates policy/v1 (1.21); the manifests name it since 1.25 removed policy/v1beta1.
        let old_cluster = !c.kubectl(&["api-versions"]).lines().any(|v| v == "policy/v1");
        // Each overlay as it is, then with every component the docs name for it.
        let (rows, _) = documented_components(&operate_md(), &repo_deploy());
        let mut cases: Vec<(&str, tempfile::TempDir)> = Vec::new();
        for overlay in OVERLAYS {
            cases.push((overlay, deploy_in_namespace(NAMESPACE)));
            let all = all_components(overlay, &rows);
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            cases.push((overlay, deploy_with(overlay, &all, &all)));
        }
        for (overlay, copy) in &cases {
            let overlay = *overlay;
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
    kustomize(&common::assets_dir().join("kubectl"), deploy, overlay)
        .unwrap_or_else(|e| panic!("kubectl kustomize {overlay}: {e}"))
}

/// `<kubectl> kustomize deploy/overlays/<overlay>`: the objects, or what kustomize said when it failed.
fn kustomize(kubectl: &Path, deploy: &Path, overlay: &str) -> Result<Vec<Value>, String> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy.join("overlays").join(overlay))
        .output()
        .map_err(|e| format!("{}: {e}", kubectl.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(serde_yaml::Deserializer::from_str(&text).map(|doc| serde::Deserialize::deserialize(doc).unwrap()).collect())
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

/// CustomResourceDefinitions that take any object of `kinds` in `group` (namespaced, v1).
fn stand_in_crds(group: &str, kinds: &[&str]) -> String {
    let crd = |kind: &&str| {
        let plural = format!("{}s", kind.to_lowercase());
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        })
    };
    let items: Vec<Value> = kinds.iter().map(crd).collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

// Components: docs/operate.md, "Switching features on".

/// A component that includes another (in its own `components:`): an overlay lists one of the two, not both.
const INCLUDES: [(&str, &str); 2] = [("encryption-kms", "encryption"), ("audit-webhook", "audit")];

/// Components the docs' table does not name: the overlays' own, which each lists itself, and the rollback's
/// (docs/install.md, "To roll back"), which switches nothing on.
const OVERLAY_COMPONENTS: [&str; 3] = ["self-signed", "cert-manager", "v1alpha1-only"];

/// A CA, as an admin puts it in pinned-ca's ca.crt: long enough that its base64 spans several lines.
const PINNED_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBejCCAR+gAwIBAgIUR1dRctUQ5zyxVmOlWJIXQkjLEiUwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAeFw0yNjExMjkxMTEwMjdaFw0yNjExMzAxMTEw
MjdaMBIxEDAOBgNVBAMMB3Rlc3QtY2EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC
AAT/u64UgGE44Q6+PQHsg6yYWjGjUhwqPc0s9shDWQuPjIusLx/TF8aEJ3UNXFBI
T3nASesG6ghfJrnKpBveG23No1MwUTAdBgNVHQ4EFgQUC3FkqWHjAZ00X0CasbnQ
j78JRIQwHwYDVR0jBBgwFoAUC3FkqWHjAZ00X0CasbnQj78JRIQwDwYDVR0TAQH/
BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAhp6bSlBVglCf3fWpEjwV9CJh/ZOp
bcQmJNQUAeq7IK8CIQCCrh7pek5ne72Az/TRmXPVZNSEFakjyw8ZIwPQZqying==
-----END CERTIFICATE-----
";

#[test]
fn components_add_what_they_switch_on_to_every_overlay_the_docs_name() {
    let (rows, wrong) = documented_components(&operate_md(), &repo_deploy());
    assert!(wrong.is_empty(), "docs/operate.md and deploy/components/ disagree: {wrong:#?}");
    let extra: Vec<PathBuf> = std::env::var("PODSET_EXTRA_KUBECTLS")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    // An overlay a thread: rendering is most of the time.
    let problems: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> =
            OVERLAYS.iter().map(|&overlay| s.spawn(|| check_overlay(overlay, &rows, &extra))).collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The problems of `overlay` with each component its rows name, alone, then with all of them.
fn check_overlay(overlay: &'static str, rows: &[(String, Vec<&str>)], extra: &[PathBuf]) -> Vec<String> {
    let mut cases: Vec<Vec<String>> = rows
        .iter()
        .filter(|(_, overlays)| overlays.contains(&overlay))
        .map(|(component, _)| vec![component.clone()])
        .collect();
    cases.push(all_components(overlay, rows));
    let listed = listed_components(&repo_deploy(), overlay);
    let plain = render(deploy_with(overlay, &[], &[]).path(), overlay);
    let mut problems = Vec::new();
    for components in cases {
        let names: Vec<&str> = components.iter().map(String::as_str).collect();
        let label = format!("{overlay} + {}", names.join(" + "));
        // Without them: the overlay as it is, less those it lists already (ha-etcd's goaway).
        let before = match names.iter().any(|c| listed.iter().any(|l| l == c)) {
            true => render(deploy_with(overlay, &[], &names).path(), overlay),
            false => plain.clone(),
        };
        let copy = deploy_with(overlay, &names, &names);
        let after = match kustomize(&common::assets_dir().join("kubectl"), copy.path(), overlay) {
            Ok(objects) => objects,
            Err(e) => {
                problems.push(format!("{label}: the render fails: {e}"));
                continue;
            }
        };
        let pod = &workload_of(overlay, &after)["spec"]["template"]["spec"];
        assert_restricted(&label, pod);
        assert_operable(&label, pod);
        problems.extend(workload_problems(&label, &after));
        for component in &names {
            problems.extend(component_problems(component, overlay, &before, &after, names.len() == 1));
        }
        for kubectl in extra {
            match kustomize(kubectl, copy.path(), overlay) {
                Ok(objects) if objects == after => {}
                Ok(_) => problems.push(format!("{label}: {} renders other objects", kubectl.display())),
                Err(e) => problems.push(format!("{label}: {} fails: {e}", kubectl.display())),
            }
        }
    }
    problems
}

#[test]
fn the_component_checks_fail_on_planted_breakage() {
    let kubectl = common::assets_dir().join("kubectl");
    let edit = |copy: &tempfile::TempDir, component: &str, from: &str, to: &str| {
        let path = copy.path().join("components").join(component).join("kustomization.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{}: no {from:?}", path.display());
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    };
    let workload = "target: {group: apps, name: podset-apiserver}";

    // A target that misses the Deployment (StatefulSet only): kustomize renders without a word, the check does not.
    let copy = deploy_with("ha-etcd", &["tracing"], &[]);
    edit(&copy, "tracing", workload, "target: {kind: StatefulSet, name: podset-apiserver}");
    let before = render(deploy_with("ha-etcd", &[], &[]).path(), "ha-etcd");
    let after = render(copy.path(), "ha-etcd");
    let problems = component_problems("tracing", "ha-etcd", &before, &after, true);
    assert!(problems.iter().any(|p| p.contains("--tracing-config-file given 0 times")), "{problems:#?}");

    // A JSON patch adding to a list the StatefulSet does not have (it has volumeClaimTemplates, no volumes).
    let copy = deploy_with("self-signed", &["goaway"], &[]);
    edit(&copy, "goaway", "/spec/template/spec/containers/0/args/-", "/spec/template/spec/volumes/-");
    let error = kustomize(&kubectl, copy.path(), "self-signed").expect_err("a patch of a missing list renders");
    assert!(error.contains("volumes"), "{error}");

    // A sidecar that may escalate its privileges: not "restricted".
    let copy = deploy_with("cert-manager", &["encryption-kms"], &[]);
    edit(&copy, "encryption-kms", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true");
    let objects = render(copy.path(), "cert-manager");
    let pod = &workload_of("cert-manager", &objects)["spec"]["template"]["spec"];
    let restricted = std::panic::catch_unwind(|| assert_restricted("planted", pod));
    assert!(restricted.is_err(), "a privilege-escalating sidecar passed as restricted");

    // A component beside the one that includes it: audit's policy twice fails the render; encryption's flag twice
    // (which would stop the server) fails the checks.
    let copy = deploy_with("self-signed", &["audit", "audit-webhook"], &[]);
    let error = kustomize(&kubectl, copy.path(), "self-signed").expect_err("audit beside audit-webhook renders");
    assert!(error.contains("podset-apiserver-audit-policy"), "{error}");
    let copy = deploy_with("self-signed", &["encryption", "encryption-kms"], &[]);
    let problems = workload_problems("planted", &render(copy.path(), "self-signed"));
    assert!(problems.iter().any(|p| p.contains("--encryption-provider-config given 2 times")), "{problems:#?}");

    // pinned-ca without its ca.crt: the render fails, naming the file.
    let copy = deploy_with("self-signed", &["pinned-ca"], &[]);
    std::fs::remove_file(copy.path().join("components/pinned-ca/ca.crt")).unwrap();
    let error = kustomize(&kubectl, copy.path(), "self-signed").expect_err("pinned-ca renders without a CA");
    assert!(error.contains("ca.crt"), "{error}");

    // A component the docs do not name, and one they name that is gone.
    let copy = deploy_in_namespace(NAMESPACE);
    std::fs::create_dir(copy.path().join("components/undocumented")).unwrap();
    std::fs::remove_dir_all(copy.path().join("components/tracing")).unwrap();
    let (_, wrong) = documented_components(&operate_md(), copy.path());
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
    assert!(wrong.iter().any(|w| w.contains("undocumented")) && wrong.iter().any(|w| w.contains("tracing")));
}

#[test]
fn the_rollback_component_leaves_out_what_only_a_v1beta1_build_has_and_nothing_else() {
    let beta_only =
        |o: &Value| is(o, "APIService", "v1beta1.demo.k8s.io") || is(o, "Service", "podset-apiserver-v1beta1");
    let label = "demo.k8s.io/serves-v1beta1";
    for (overlay, with) in [("self-signed", &["pinned-ca"][..]), ("cert-manager", &[]), ("ha-etcd", &[])] {
        let before = render(deploy_with(overlay, with, &[]).path(), overlay);
        let after = render(deploy_with(overlay, &[with, &["v1alpha1-only"]].concat(), &[]).path(), overlay);
        assert_eq!(before.iter().filter(|o| beta_only(o)).count(), 2, "{overlay}: v1beta1's objects to leave out");
        let mut expected: Vec<Value> = before.into_iter().filter(|o| !beta_only(o)).collect();
        let workload = expected.iter_mut().find(|o| o["apiVersion"] == "apps/v1").unwrap();
        let labels = workload["spec"]["template"]["metadata"]["labels"].as_object_mut().unwrap();
        assert!(labels.remove(label).is_some(), "{overlay}: the Pods had no {label}");
        assert_eq!(after, expected, "{overlay} with v1alpha1-only");
        let service = find(&after, "Service", "podset-apiserver");
        let pods = &workload_of(overlay, &after)["spec"]["template"]["metadata"]["labels"];
        assert!(has_labels(pods, &service["spec"]["selector"]), "{overlay}: v1alpha1's Service lost the Pods");
    }
}

fn operate_md() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operate.md")).unwrap()
}

/// The components the table under "Switching features on" names, in its order, each with the overlays its row
/// names (in backquotes, in its third column); and where the table and `deploy`'s components/ disagree.
fn documented_components(operate: &str, deploy: &Path) -> (Vec<(String, Vec<&'static str>)>, Vec<String>) {
    let section = operate.split("\n## ").find(|s| s.starts_with("Switching features on")).unwrap_or_default();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let name = cells[0].trim_matches('`').to_owned();
        let overlays: Vec<&'static str> =
            OVERLAYS.iter().copied().filter(|o| cells.get(2).is_some_and(|c| c.contains(&format!("`{o}`")))).collect();
        rows.push((name, overlays));
    }
    let mut wrong = Vec::new();
    if rows.is_empty() {
        wrong.push("no table of components under \"## Switching features on\"".to_owned());
    }
    let dirs: Vec<String> = std::fs::read_dir(deploy.join("components"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for (name, overlays) in &rows {
        if !dirs.contains(name) {
            wrong.push(format!("the docs name the component `{name}`, which is not in deploy/components/"));
        }
        if overlays.is_empty() {
            wrong.push(format!("the docs' row of `{name}` names no overlay"));
        }
    }
    for dir in dirs {
        if !OVERLAY_COMPONENTS.contains(&dir.as_str()) && !rows.iter().any(|(name, _)| *name == dir) {
            wrong.push(format!("deploy/components/{dir} is not in the docs' table"));
        }
    }
    (rows, wrong)
}

/// Every component the docs name for `overlay`, but one another of them includes.
fn all_components(overlay: &str, rows: &[(String, Vec<&str>)]) -> Vec<String> {
    let named: Vec<String> =
        rows.iter().filter(|(_, overlays)| overlays.contains(&overlay)).map(|(c, _)| c.clone()).collect();
    let included = |c: &String| INCLUDES.iter().any(|(by, of)| of == c && named.iter().any(|n| n == by));
    named.iter().filter(|c| !included(c)).cloned().collect()
}

/// The components `overlay`'s kustomization.yaml lists, by directory name.
fn listed_components(deploy: &Path, overlay: &str) -> Vec<String> {
    let path = deploy.join("overlays").join(overlay).join("kustomization.yaml");
    let k: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let list = k["components"].as_sequence().cloned().unwrap_or_default();
    list.iter().filter_map(|c| c.as_str()?.strip_prefix("../../components/").map(String::from)).collect()
}

/// A copy of deploy/ in NAMESPACE whose `overlay` lists `components` after its own, as an admin adds them, and
/// first drops from its list those in `unlisted` (so that one it lists already can be rendered without); with a CA in
/// pinned-ca's ca.crt.
fn deploy_with(overlay: &str, components: &[&str], unlisted: &[&str]) -> tempfile::TempDir {
    let copy = deploy_in_namespace(NAMESPACE);
    std::fs::write(copy.path().join("components/pinned-ca/ca.crt"), PINNED_CA).unwrap();
    let path = copy.path().join("overlays").join(overlay).join("kustomization.yaml");
    let mut k: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let map = k.as_mapping_mut().unwrap();
    let list = map.entry("components".into()).or_insert(serde_yaml::Value::Sequence(Vec::new()));
    let list = list.as_sequence_mut().unwrap();
    let entry = |c: &str| format!("../../components/{c}");
    list.retain(|l| !unlisted.iter().any(|c| l.as_str() == Some(entry(c).as_str())));
    list.extend(components.iter().map(|c| entry(c).into()));
    std::fs::write(&path, serde_yaml::to_string(&k).unwrap()).unwrap();
    copy
}

/// What a flag a component adds is given.
enum Given {
    Value(&'static str),
    /// A file in a Secret of this name, mounted read-only.
    Secret(&'static str),
    /// A file in a ConfigMap generated under this name (and a hash), mounted read-only, holding this kind.
    ConfigMap(&'static str, &'static str),
    /// A path in an emptyDir the server may write.
    EmptyDir,
}

/// What a component adds: flags of the server's container, a container after it, objects (kind and name, or the
/// name a generated one starts with); and which objects it changes.
struct Adds {
    flags: Vec<(&'static str, Given)>,
    sidecar: Option<&'static str>,
    objects: Vec<(&'static str, &'static str)>,
    changes: Vec<(&'static str, &'static str)>,
}

fn adds(component: &str) -> Adds {
    use Given::*;
    let nothing = Adds { flags: Vec::new(), sidecar: None, objects: Vec::new(), changes: Vec::new() };
    match component {
        "encryption" => Adds {
            flags: vec![
                ("--encryption-provider-config", Secret("podset-apiserver-encryption")),
                ("--encryption-provider-config-automatic-reload", Value("true")),
            ],
            ..nothing
        },
        "encryption-kms" => Adds { sidecar: Some("kms-plugin"), ..adds("encryption") },
        "audit" => Adds {
            flags: vec![
                ("--audit-policy-file", ConfigMap("podset-apiserver-audit-policy", "Policy")),
                ("--audit-log-path", EmptyDir),
                ("--audit-log-maxsize", Value("100")),
                ("--audit-log-maxbackup", Value("3")),
            ],
            objects: vec![("ConfigMap", "podset-apiserver-audit-policy")],
            ..nothing
        },
        "audit-webhook" => {
            let mut audit = adds("audit");
            audit.flags.push(("--audit-webhook-config-file", Secret("podset-apiserver-audit-webhook")));
            audit
        }
        "tracing" => Adds {
            flags: vec![("--tracing-config-file", ConfigMap("podset-apiserver-tracing", "TracingConfiguration"))],
            objects: vec![("ConfigMap", "podset-apiserver-tracing")],
            ..nothing
        },
        "goaway" => Adds { flags: vec![("--goaway-chance", Value("0.001"))], ..nothing },
        "pinned-ca" => Adds {
            changes: vec![("APIService", "v1alpha1.demo.k8s.io"), ("APIService", "v1beta1.demo.k8s.io")],
            ..nothing
        },
        "monitoring" => Adds {
            objects: vec![("ServiceMonitor", "podset-apiserver"), ("PrometheusRule", "podset-apiserver")],
            changes: vec![("Service", "podset-apiserver")],
            ..nothing
        },
        "network-policy" => Adds { objects: vec![("NetworkPolicy", "podset-apiserver")], ..nothing },
        other => panic!("no expectations for the component {other}: add them to adds()"),
    }
}

/// Whether `object` is `kind` named `name`, or generated from that name (a hash appended).
fn is(object: &Value, kind: &str, name: &str) -> bool {
    let Some(actual) = object["metadata"]["name"].as_str() else { return false };
    let generated = actual
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|hash| hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()));
    object["kind"] == kind && (actual == name || generated)
}

/// The one apps/v1 object, if there is one.
fn the_workload(objects: &[Value]) -> Option<&Value> {
    let mut workloads = objects.iter().filter(|o| o["apiVersion"] == "apps/v1");
    workloads.next().filter(|_| workloads.next().is_none())
}

/// The mount of the server's container that holds `path`, and its volume (or claim template).
fn mounted<'a>(workload: &'a Value, path: &str) -> Result<(&'a Value, &'a Value), String> {
    let pod = &workload["spec"]["template"]["spec"];
    let mounts = container(pod)["volumeMounts"].as_array().ok_or("no volumeMounts")?;
    let mount = mounts
        .iter()
        .filter(|m| m["mountPath"].as_str().is_some_and(|d| path == d || path.starts_with(&format!("{d}/"))))
        .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
        .ok_or_else(|| format!("{path} is on no volume"))?;
    let volumes = pod["volumes"].as_array().into_iter().flatten();
    let claims = workload["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten();
    let volume = volumes
        .chain(claims)
        .find(|v| v["name"] == mount["name"] || v["metadata"]["name"] == mount["name"])
        .ok_or_else(|| format!("no volume {} for {path}", mount["name"]))?;
    Ok((mount, volume))
}

/// Flags whose value starts with `/` but is not a path.
const NOT_PATHS: [&str; 1] = ["--etcd-prefix"];

/// What is wrong with the workload whatever the components: a flag given twice (the server refuses to start), a
/// file a flag names on no volume, a mount of no volume.
fn workload_problems(label: &str, objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(workload) = the_workload(objects) else { return vec![format!("{label}: not one workload")] };
    let pod = &workload["spec"]["template"]["spec"];
    let args = args(pod);
    for arg in &args {
        let name = arg.split('=').next().unwrap();
        let times = args.iter().filter(|a| a.split('=').next() == Some(name)).count();
        if times > 1 && !problems.iter().any(|p: &String| p.contains(&format!("{name} given"))) {
            problems.push(format!("{label}: {name} given {times} times"));
        }
        if let Some(path) = arg.split_once('=').map(|(_, v)| v).filter(|v| v.starts_with('/')) {
            if let Err(e) = mounted(workload, path).map(drop).or_else(|e| match NOT_PATHS.contains(&name) {
                true => Ok(()),
                false => Err(e),
            }) {
                problems.push(format!("{label}: {name}: {e}"));
            }
        }
    }
    let volumes: Vec<&Value> = pod["volumes"].as_array().into_iter().flatten().collect();
    let claims: Vec<&Value> = workload["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten().collect();
    for c in pod["containers"].as_array().unwrap() {
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            if !volumes.iter().any(|v| v["name"] == m["name"])
                && !claims.iter().any(|v| v["metadata"]["name"] == m["name"])
            {
                problems.push(format!("{label}: {} mounts {}, no volume of the Pod", c["name"], m["name"]));
            }
        }
    }
    problems
}

/// What is wrong with `after`, `overlay` rendered with `component` (and perhaps others), against `before`, the
/// same without them: what the component should add and does not, or adds wrong; with `exact` (it alone was added),
/// anything else that differs too.
fn component_problems(component: &str, overlay: &str, before: &[Value], after: &[Value], exact: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let mut wrong = |what: String| problems.push(format!("{component} on {overlay}: {what}"));
    let adds = adds(component);
    let (Some(old), Some(new)) = (the_workload(before), the_workload(after)) else {
        wrong("not one workload".into());
        return problems;
    };
    let pod = &new["spec"]["template"]["spec"];
    let (old_args, new_args) = (args(&old["spec"]["template"]["spec"]), args(pod));
    for (name, given) in &adds.flags {
        if flag(&old_args, name).is_some() {
            wrong(format!("{name} is there without the component"));
        }
        let times = new_args.iter().filter(|a| a.split('=').next() == Some(name)).count();
        let Some(value) = flag(&new_args, name).filter(|_| times == 1) else {
            wrong(format!("{name} given {times} times"));
            continue;
        };
        let file = value.rsplit('/').next().unwrap();
        match (given, mounted(new, value)) {
            (Given::Value(v), _) if value != *v => wrong(format!("{name}={value}, not {v}")),
            (Given::Value(_), _) => {}
            (_, Err(e)) => wrong(format!("{name}: {e}")),
            (Given::Secret(secret), Ok((mount, volume))) => {
                if volume["secret"]["secretName"] != *secret || mount["readOnly"] != true {
                    wrong(format!("{name}: {value} not in the Secret {secret}, read-only: {mount} {volume}"));
                }
            }
            (Given::ConfigMap(generated, kind), Ok((mount, volume))) => {
                let config_map = after
                    .iter()
                    .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == volume["configMap"]["name"]);
                let held: Option<Value> =
                    config_map.and_then(|c| c["data"][file].as_str()).and_then(|text| serde_yaml::from_str(text).ok());
                let ok = config_map.is_some_and(|c| is(c, "ConfigMap", generated))
                    && held.is_some_and(|h| h["kind"] == *kind)
                    && mount["readOnly"] == true;
                if !ok {
                    wrong(format!("{name}: {value} not a {kind} in the ConfigMap {generated}, read-only: {volume}"));
                }
            }
            (Given::EmptyDir, Ok((mount, volume))) => {
                if volume.get("emptyDir").is_none() || mount["readOnly"] == true {
                    wrong(format!("{name}: {value} not on a writable emptyDir: {mount} {volume}"));
                }
            }
        }
    }
    let containers = pod["containers"].as_array().unwrap();
    let old_containers = old["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    if let Some(sidecar) = adds.sidecar {
        // After the server's; serving its socket on an emptyDir both mount at one path, the server read-only.
        match containers.iter().skip(1).find(|c| c["name"] == sidecar) {
            None => wrong(format!("no container {sidecar} after the server's")),
            Some(side) => {
                let server_mounts = container(pod)["volumeMounts"].as_array().unwrap();
                let shared = side["volumeMounts"].as_array().into_iter().flatten().find_map(|m| {
                    server_mounts.iter().find(|s| s["name"] == m["name"] && s["mountPath"] == m["mountPath"])
                });
                let socket = shared.and_then(|s| s["mountPath"].as_str()).map(|d| format!("unix://{d}/"));
                let serves = socket.as_ref().is_some_and(|s| {
                    args(&serde_json::json!({"containers": [side]})).iter().any(|a| a.contains(s.as_str()))
                });
                let on_empty_dir =
                    shared.is_some_and(|s| volume(pod, s["name"].as_str().unwrap()).get("emptyDir").is_some());
                if !serves || !on_empty_dir || shared.is_none_or(|s| s["readOnly"] != true) {
                    wrong(format!("{sidecar} serves no socket on an emptyDir the server mounts read-only: {side}"));
                }
            }
        }
    } else if exact && containers.len() != old_containers.len() {
        wrong(format!("{} containers, not {}", containers.len(), old_containers.len()));
    }
    for (kind, name) in &adds.objects {
        let found: Vec<&Value> = after.iter().filter(|o| is(o, kind, name)).collect();
        if found.len() != 1 || found[0]["metadata"]["namespace"] != NAMESPACE {
            wrong(format!("not one {kind} {name} in {NAMESPACE}: {found:?}"));
        }
        if before.iter().any(|o| is(o, kind, name)) {
            wrong(format!("{kind} {name} is there without the component"));
        }
    }
    if exact {
        let same = |a: &Value, b: &Value| a["kind"] == b["kind"] && a["metadata"]["name"] == b["metadata"]["name"];
        for object in after {
            let (kind, name) = (object["kind"].as_str().unwrap(), &object["metadata"]["name"]);
            if !before.iter().any(|b| same(b, object)) && !adds.objects.iter().any(|(k, n)| is(object, k, n)) {
                wrong(format!("adds {kind} {name}"));
            }
        }
        let touches_workload = !adds.flags.is_empty() || adds.sidecar.is_some();
        for object in before {
            let (kind, name) = (object["kind"].as_str().unwrap(), &object["metadata"]["name"]);
            let changes = adds.changes.iter().any(|(k, n)| object["kind"] == *k && name == n);
            match after.iter().find(|a| same(a, object)) {
                None => wrong(format!("removes {kind} {name}")),
                Some(a) if a == object || changes => {}
                // Only the server's args and mounts, the Pod's volumes and containers after the server's.
                Some(a) if std::ptr::eq(object, old) && touches_workload => {
                    let strip = |w: &Value| {
                        let mut w = w.clone();
                        let pod = &mut w["spec"]["template"]["spec"];
                        pod.as_object_mut().unwrap().remove("volumes");
                        pod["containers"].as_array_mut().unwrap().truncate(1);
                        let server = pod["containers"][0].as_object_mut().unwrap();
                        server.remove("args");
                        server.remove("volumeMounts");
                        w
                    };
                    if strip(a) != strip(object) {
                        wrong(format!("changes the workload beyond args, mounts, volumes and containers: {a}"));
                    }
                    let kept = old_args.iter().all(|arg| new_args.contains(arg));
                    let mounts = |w: &Value| container(&w["spec"]["template"]["spec"])["volumeMounts"].clone();
                    let kept_mounts =
                        mounts(object).as_array().unwrap().iter().all(|m| mounts(a).as_array().unwrap().contains(m));
                    if !kept || !kept_mounts {
                        wrong("drops arguments or mounts of the server's container".into());
                    }
                }
                Some(a) => wrong(format!("changes {kind} {name}: {a}")),
            }
        }
    }
    match component {
        "audit" | "audit-webhook" => {
            // The rotated log and its kept files fit the emptyDir: the kubelet evicts a Pod over its sizeLimit.
            let number = |name: &str| flag(&new_args, name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let on = flag(&new_args, "--audit-log-path").and_then(|p| mounted(new, p).ok());
            let limit = on.and_then(|(_, v)| v["emptyDir"]["sizeLimit"].as_str()).and_then(|l| l.strip_suffix("Mi"));
            let limit: u64 = limit.and_then(|l| l.parse().ok()).unwrap_or(0);
            let most = number("--audit-log-maxsize") * (number("--audit-log-maxbackup") + 1);
            if most == 0 || most >= limit {
                wrong(format!("the log may grow to {most} MiB, its emptyDir holds {limit} MiB"));
            }
        }
        "pinned-ca" => {
            use base64::Engine;
            for apiservice in after.iter().filter(|o| o["kind"] == "APIService") {
                let bundle: String =
                    apiservice["spec"]["caBundle"].as_str().unwrap_or_default().split_whitespace().collect();
                let ca = base64::engine::general_purpose::STANDARD.decode(bundle).unwrap_or_default();
                if ca != PINNED_CA.as_bytes() || apiservice["spec"].get("insecureSkipTLSVerify").is_some() {
                    wrong(format!("the CA is not pinned alone: {apiservice}"));
                }
            }
            if after.iter().any(|o| o["kind"] == "Secret") {
                wrong("leaves the CA's Secret".into());
            }
        }
        "monitoring" => {
            let alerts: Value =
                serde_yaml::from_str(&std::fs::read_to_string(repo_deploy().join("monitoring/alerts.yaml")).unwrap())
                    .unwrap();
            let rule = after.iter().find(|o| is(o, "PrometheusRule", "podset-apiserver"));
            if rule.is_none_or(|r| r["spec"]["groups"] != alerts["spec"]["groups"]) {
                wrong("the PrometheusRule's groups are not deploy/monitoring/alerts.yaml's".into());
            }
            let monitor =
                after.iter().find(|o| is(o, "ServiceMonitor", "podset-apiserver")).cloned().unwrap_or_default();
            let service = after.iter().find(|o| is(o, "Service", "podset-apiserver")).unwrap();
            let beta = after.iter().find(|o| is(o, "Service", "podset-apiserver-v1beta1")).unwrap();
            let selector = &monitor["spec"]["selector"];
            if !selects(selector, &service["metadata"]["labels"]) || selects(selector, &beta["metadata"]["labels"]) {
                wrong(format!("the ServiceMonitor does not select podset-apiserver alone: {selector}"));
            }
            let endpoint = &monitor["spec"]["endpoints"][0];
            let ports = service["spec"]["ports"].as_array().unwrap();
            let tls = &endpoint["tlsConfig"];
            let server_name = format!("podset-apiserver.{NAMESPACE}.svc");
            let ok = ports.iter().any(|p| p["name"] == endpoint["port"])
                && endpoint["scheme"] == "https"
                && endpoint["path"] == "/metrics"
                && endpoint["bearerTokenFile"].is_string()
                && tls["serverName"] == server_name.as_str();
            if !ok {
                wrong(format!("the ServiceMonitor's endpoint: {endpoint}"));
            }
            // With cert-manager, the CA beside its certificate, which names the server.
            if let Some(certificate) = after.iter().find(|o| is(o, "Certificate", "podset-apiserver-serving")) {
                let names = certificate["spec"]["dnsNames"].as_array().unwrap();
                if tls["ca"]["secret"]["name"] != certificate["spec"]["secretName"]
                    || !names.contains(&tls["serverName"])
                {
                    wrong(format!("the ServiceMonitor does not verify {certificate}: {tls}"));
                }
            }
        }
        "network-policy" => {
            let policy = after.iter().find(|o| is(o, "NetworkPolicy", "podset-apiserver")).cloned().unwrap_or_default();
            let https = container(pod)["ports"].as_array().unwrap().iter().find(|p| p["name"] == "https").unwrap();
            let port = serde_json::json!([{"ports": [{"protocol": "TCP", "port": https["containerPort"]}]}]);
            let ok = selects(&policy["spec"]["podSelector"], &new["spec"]["template"]["metadata"]["labels"])
                && policy["spec"]["policyTypes"] == serde_json::json!(["Ingress"])
                && policy["spec"]["ingress"] == port;
            if !ok {
                wrong(format!("not ingress to {} from anywhere alone: {policy}", https["containerPort"]));
            }
        }
        _ => {}
    }
    problems
}
