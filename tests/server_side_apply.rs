//! Server-side apply and managedFields, compared with kube-apiserver itself: the same sequence of applies,
//! patches and scales goes to a Deployment (kube-apiserver 1.20's own implementation) and to a PodSet (ours,
//! through the aggregator), and the objects and their managedFields must come out the same.

mod common;

use common::cluster::{in_namespace, runtime};
use http::Request;
use kube::api::{Api, Patch, PatchParams};
use podset_apiserver::api::PodSet;
use podset_envtest::Cluster;
use serde_json::{json, Value};

/// The kind a sequence runs on.
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    plural: &'static str,
    /// The name kubectl knows it by.
    resource: &'static str,
}

const DEPLOYMENT: Kind =
    Kind { api_version: "apps/v1", kind: "Deployment", plural: "deployments", resource: "deployment" };
const PODSET_KIND: Kind =
    Kind { api_version: "demo.k8s.io/v1alpha1", kind: "PodSet", plural: "podsets", resource: "podset" };
const PODSET_BETA: Kind =
    Kind { api_version: "demo.k8s.io/v1beta1", kind: "PodSet", plural: "podsets", resource: "podset" };

/// The managers the sequences use; others (kube-controller-manager on the Deployment) are not compared.
const MANAGERS: &[&str] =
    &["alice", "mesh", "bob", "kubectl", "kubectl-patch", "kubectl-scale", "kubectl-client-side-apply"];

struct Container<'a> {
    name: &'a str,
    image: &'a str,
    ports: &'a [u16],
}

fn config(k: &Kind, name: &str, replicas: Option<i32>, labels: &[(&str, &str)], containers: &[Container]) -> Value {
    let mut spec = json!({});
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    if !containers.is_empty() {
        let cs: Vec<Value> = containers
            .iter()
            .map(|c| {
                let mut v = json!({"name": c.name, "image": c.image});
                if !c.ports.is_empty() {
                    v["ports"] = c.ports.iter().map(|p| json!({"containerPort": p})).collect();
                }
                v
            })
            .collect();
        spec["selector"] = json!({"matchLabels": {"app": name}});
        spec["template"] = json!({"metadata": {"labels": {"app": name}}, "spec": {"containers": cs}});
    }
    let mut meta = json!({"name": name});
    if !labels.is_empty() {
        meta["labels"] =
            labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>().into();
    }
    json!({"apiVersion": k.api_version, "kind": k.kind, "metadata": meta, "spec": spec})
}

fn path(k: &Kind, name: &str, sub: &str) -> String {
    let group = if k.api_version.contains('/') { "apis" } else { "api" };
    format!("/{group}/{}/namespaces/default/{}/{name}{sub}", k.api_version, k.plural)
}

/// Fields kube-apiserver defaults in a Deployment (so an update by a client that sent none still owns them) and
/// PodSet does not default.
const DEFAULTED: &[&str] = &[
    "f:progressDeadlineSeconds",
    "f:revisionHistoryLimit",
    "f:strategy",
    "f:dnsPolicy",
    "f:restartPolicy",
    "f:schedulerName",
    "f:securityContext",
    "f:terminationGracePeriodSeconds",
    "f:imagePullPolicy",
    "f:resources",
    "f:terminationMessagePath",
    "f:terminationMessagePolicy",
];

fn without_defaulted(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|k, _| !DEFAULTED.contains(&k.as_str()));
        m.values_mut().for_each(without_defaulted);
    }
}

/// What a step leaves behind, with the kind's own API version replaced so both kinds can be compared.
fn normalize(k: &Kind, v: Value) -> Value {
    let text = v.to_string().replace(k.api_version, "<version>").replace(k.kind, "<Kind>");
    serde_json::from_str(&text).unwrap()
}

async fn send(client: &kube::Client, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
    let req = Request::builder().method(method).uri(uri).header("content-type", content_type).body(body).unwrap();
    let (code, _, bytes) = common::raw(client, req).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The parts of an object the sequences touch, and the managedFields of the sequences' managers (no times).
async fn observe(client: &kube::Client, k: &Kind, name: &str) -> Value {
    let (code, obj) = send(client, "GET", &path(k, name, ""), "application/json", Vec::new()).await;
    assert_eq!(code, 200, "{obj}");
    let containers: Vec<Value> = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"name": c["name"], "image": c["image"], "ports": c.get("ports").map(|p| p.as_array().unwrap().iter().map(|p| p["containerPort"].clone()).collect::<Vec<_>>())}))
        .collect();
    let mut managed: Vec<Value> = obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| MANAGERS.contains(&e["manager"].as_str().unwrap_or("")))
        .map(|e| {
            let mut fields = e["fieldsV1"].clone();
            without_defaulted(&mut fields);
            json!({"manager": e["manager"], "operation": e["operation"], "apiVersion": e["apiVersion"], "fieldsV1": fields})
        })
        .collect();
    managed.sort_by_key(|e| (e["manager"].to_string(), e["operation"].to_string()));
    let labels = obj["metadata"].get("labels").cloned().unwrap_or(json!({}));
    normalize(
        k,
        json!({"replicas": obj["spec"]["replicas"], "labels": labels, "containers": containers, "managedFields": managed}),
    )
}

/// An apply patch, as `kubectl apply --server-side` sends it; returns the code and, for errors, the Status
/// reduced to what clients read (reason, causes).
async fn apply(client: &kube::Client, k: &Kind, cfg: &Value, manager: &str, force: bool) -> Value {
    let name = cfg["metadata"]["name"].as_str().unwrap();
    let uri = format!("{}?fieldManager={manager}{}", path(k, name, ""), if force { "&force=true" } else { "" });
    let (code, body) =
        send(client, "PATCH", &uri, "application/apply-patch+yaml", serde_json::to_vec(cfg).unwrap()).await;
    outcome(k, code, body)
}

fn outcome(k: &Kind, code: u16, body: Value) -> Value {
    normalize(k, answer(code, &body))
}

/// An answer as clients read it: the code, and for errors the reason and causes (sorted).
fn answer(code: u16, body: &Value) -> Value {
    if code < 300 {
        return json!({"code": code});
    }
    let mut causes: Vec<Value> = body["details"]["causes"].as_array().cloned().unwrap_or_default();
    causes.sort_by_key(|c| c.to_string());
    json!({"code": code, "reason": body["reason"], "causes": causes})
}

/// One sequence of writes by several managers on object `name`; returns what each step answered and left behind.
async fn sequence(client: &kube::Client, k: &Kind, name: &str) -> Vec<Value> {
    let main = |image| Container { name: "main", image, ports: &[80] };
    let mut seen = Vec::new();
    let mut step =
        |what: &str, result: Value, state: Value| seen.push(json!({"step": what, "result": result, "state": state}));

    // alice creates by applying.
    let alice = config(k, name, Some(2), &[("team", "a"), ("tier", "web")], &[main("nginx")]);
    step("alice creates", apply(client, k, &alice, "alice", false).await, observe(client, k, name).await);
    // mesh adds a sidecar container: a keyed list merges.
    let side = Container { name: "side", image: "envoy", ports: &[9901] };
    let mesh = {
        let mut m = config(k, name, None, &[], &[side]);
        m["spec"].as_object_mut().unwrap().remove("selector");
        m["spec"]["template"].as_object_mut().unwrap().remove("metadata");
        m
    };
    step("mesh adds a container", apply(client, k, &mesh, "mesh", false).await, observe(client, k, name).await);
    // bob wants other replicas: conflict with alice, then forced.
    let bob = config(k, name, Some(5), &[], &[]);
    step("bob conflicts", apply(client, k, &bob, "bob", false).await, observe(client, k, name).await);
    step("bob forces", apply(client, k, &bob, "bob", true).await, observe(client, k, name).await);
    // bob applies the same value alice had: shared, no conflict.
    let bob_label = config(k, name, None, &[("tier", "web")], &[]);
    step("bob shares a label", apply(client, k, &bob_label, "bob", false).await, observe(client, k, name).await);
    // alice stops sending both labels and changes her image: team goes, tier stays (bob owns it too).
    let alice2 = config(k, name, None, &[], &[main("nginx:2")]);
    step("alice drops fields", apply(client, k, &alice2, "alice", false).await, observe(client, k, name).await);
    // A merge patch is an update: it takes the field from bob without a conflict.
    let (code, body) = send(
        client,
        "PATCH",
        &format!("{}?fieldManager=kubectl-patch", path(k, name, "")),
        "application/merge-patch+json",
        br#"{"spec":{"replicas":3}}"#.to_vec(),
    )
    .await;
    step("merge patch", outcome(k, code, body), observe(client, k, name).await);
    // Bad applies: a duplicate key, a manager that is too long, no manager at all.
    let dup = config(k, name, None, &[], &[main("a"), main("b")]);
    // kube-apiserver answers this bad request with a 500; podset-apiserver with a 400 BadRequest. Both refuse it
    // and change nothing.
    let refused =
        apply(client, k, &dup, "alice", false).await["code"].as_u64().is_some_and(|c| (400..=500).contains(&c));
    step("duplicate keys", json!({"refused": refused}), observe(client, k, name).await);
    let long = "m".repeat(129);
    step("long manager", apply(client, k, &bob, &long, false).await, observe(client, k, name).await);
    let (code, body) =
        send(client, "PATCH", &path(k, name, ""), "application/apply-patch+yaml", serde_json::to_vec(&bob).unwrap())
            .await;
    step("no manager", outcome(k, code, body), observe(client, k, name).await);
    seen
}

fn compare(deployment: &[Value], podset: &[Value]) {
    for (d, p) in deployment.iter().zip(podset) {
        assert_eq!(
            d,
            p,
            "step {} differs\nkube-apiserver:\n{}\npodset-apiserver:\n{}",
            d["step"],
            serde_json::to_string_pretty(d).unwrap(),
            serde_json::to_string_pretty(p).unwrap()
        );
    }
    assert_eq!(deployment.len(), podset.len());
}

#[test]
fn apply_sequences_match_kube_apiserver() {
    in_namespace("apply_sequences_match_kube_apiserver", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let d = sequence(&client, &DEPLOYMENT, "web").await;
            for (k, name) in [(&PODSET_KIND, "web"), (&PODSET_BETA, "web-beta")] {
                compare(&d, &sequence(&client, k, name).await);
            }
        });
    });
}

/// The same through kubectl: scale, client-side apply taken over by server-side apply, status apply, diff.
fn kubectl_sequence(c: &Cluster, k: &Kind, name: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, v: &Value| {
        let p = dir.path().join(name);
        std::fs::write(&p, serde_json::to_string(v).unwrap()).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let rt = runtime();
    let client = rt.block_on(c.client());
    let observe = |name: &str| rt.block_on(observe(&client, k, name));
    let mut seen = Vec::new();
    let main = Container { name: "main", image: "nginx", ports: &[] };
    // Client-side apply, then the same file with a change applied server-side by kubectl: taken over.
    let v1 = config(k, name, Some(1), &[("team", "a")], &[main]);
    c.kubectl(&["apply", "-f", &file("csa.json", &v1)]);
    seen.push(json!({"step": "client-side apply", "state": observe(name)}));
    let v2 = config(k, name, Some(2), &[("team", "a")], &[Container { name: "main", image: "nginx", ports: &[] }]);
    let out = c.kubectl_try(&["apply", "--server-side", "-f", &file("csa2.json", &v2)]);
    seen.push(json!({"step": "server-side takeover", "ok": out.is_ok(), "state": observe(name)}));
    // kubectl scale: kube-apiserver 1.20 did not yet record scale writes (1.22 added `subresource: scale`
    // entries, which podset-apiserver_scale_is_a_manager checks), so only the object is compared here.
    c.kubectl(&["scale", k.resource, name, "--replicas=4"]);
    let mut state = observe(name);
    state.as_object_mut().unwrap().remove("managedFields");
    seen.push(json!({"step": "scale", "state": state}));
    // An apply by someone else now conflicts with the scaler; --force-conflicts takes it.
    let v3 = config(k, name, Some(1), &[], &[]);
    let f3 = file("v3.json", &v3);
    let conflict = c.kubectl_try(&["apply", "--server-side", "--validate=false", "--field-manager=alice", "-f", &f3]);
    let mut state = observe(name);
    state.as_object_mut().unwrap().remove("managedFields");
    seen.push(json!({"step": "apply conflicts with scale", "ok": conflict.is_ok(), "state": state}));
    c.kubectl(&["apply", "--server-side", "--validate=false", "--field-manager=alice", "--force-conflicts", "-f", &f3]);
    seen.push(json!({"step": "forced", "state": observe(name)}));
    // diff --server-side shows the change and changes nothing.
    let v4 = config(k, name, Some(7), &[], &[]);
    let diff = c
        .kubectl_command(&[
            "diff",
            "--server-side",
            "--field-manager=alice",
            "--force-conflicts",
            "-f",
            &file("v4.json", &v4),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    seen.push(json!({"step": "diff", "exit": diff.status.code(), "shows": text.contains("+  replicas: 7"), "state": observe(name)}));
    seen
}

#[test]
fn kubectl_server_side_apply_matches_kube_apiserver() {
    in_namespace("kubectl_server_side_apply_matches_kube_apiserver", || {
        let c = common::cluster::start();
        let d = kubectl_sequence(&c, &DEPLOYMENT, "csa");
        compare(&d, &kubectl_sequence(&c, &PODSET_KIND, "csa"));
        compare(&d, &kubectl_sequence(&c, &PODSET_BETA, "csa-beta"));
        // Newer than 1.20: kubectl scale is recorded on the scale subresource, and the forced apply took it over.
        c.kubectl(&["scale", "podset", "csa", "--replicas=6"]);
        let ps: Value =
            serde_json::from_str(&c.kubectl(&["get", "podset", "csa", "-o", "json", "--show-managed-fields"])).unwrap();
        let scale = ps["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["subresource"] == "scale")
            .unwrap_or_else(|| panic!("no scale entry: {ps}"));
        assert_eq!((scale["manager"].as_str(), scale["operation"].as_str()), (Some("kubectl"), Some("Update")));
        assert_eq!(scale["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
        let shown = c.kubectl(&["get", "podset", "csa", "-o", "yaml", "--show-managed-fields"]);
        assert!(shown.contains("subresource: scale"), "{shown}");
        // kubectl apply --subresource=status: owned on the status subresource; the spec in the file is ignored.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("status.yaml");
        std::fs::write(
            &file,
            "apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata: {name: csa}\nspec: {replicas: 42}\n\
             status:\n  conditions:\n  - {type: Audited, status: 'True', reason: Checked, message: ok, \
             lastTransitionTime: '2026-01-01T00:00:00Z'}\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        c.kubectl(&["apply", "--server-side", "--field-manager=auditor", "--subresource=status", "-f", f]);
        let ps: Value =
            serde_json::from_str(&c.kubectl(&["get", "podset", "csa", "-o", "json", "--show-managed-fields"])).unwrap();
        assert_eq!(ps["spec"]["replicas"], 6);
        assert!(ps["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Audited"), "{ps}");
        let auditor =
            ps["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == "auditor").unwrap();
        assert_eq!((auditor["operation"].as_str(), auditor["subresource"].as_str()), (Some("Apply"), Some("status")));
        assert!(auditor["fieldsV1"].get("f:spec").is_none(), "{auditor}");
    });
}

#[test]
fn kube_rs_apply_and_controller_status_are_managers() {
    in_namespace("kube_rs_apply_and_controller_status_are_managers", || {
        let c = common::cluster::start();
        runtime().block_on(async {
            let client = c.client().await;
            let api: Api<PodSet> = Api::namespaced(client.clone(), "default");
            let cfg = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "rs"},
                "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "rs"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}});
            let ps = api.patch("rs", &PatchParams::apply("my-operator"), &Patch::Apply(&cfg)).await.unwrap();
            let mf = ps.metadata.managed_fields.clone().unwrap();
            assert_eq!(mf.len(), 1);
            assert_eq!((mf[0].manager.as_deref(), mf[0].operation.as_deref()), (Some("my-operator"), Some("Apply")));
            // The embedded controller writes status as its own manager, on the status subresource.
            common::cluster::eventually("the controller's status entry", || async {
                let ps = api.get("rs").await.unwrap();
                ps.metadata.managed_fields.unwrap_or_default().iter().any(|e| {
                    e.manager.as_deref() == Some("podset-controller")
                        && e.subresource.as_deref() == Some("status")
                        && e.fields_v1.as_ref().is_some_and(|f| f.0.get("f:status").is_some())
                })
            })
            .await;
            // A second apply of a changed config by the same manager needs no force; another manager's does.
            let mut cfg2 = cfg.clone();
            cfg2["spec"]["replicas"] = json!(2);
            api.patch("rs", &PatchParams::apply("my-operator"), &Patch::Apply(&cfg2)).await.unwrap();
            let err = api.patch("rs", &PatchParams::apply("other"), &Patch::Apply(&cfg)).await.unwrap_err();
            let kube::Error::Api(status) = err else { panic!("{err}") };
            assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
            assert!(status.message.contains("conflict with \"my-operator\": .spec.replicas"), "{}", status.message);
            // Dry run answers the merged object and stores nothing.
            let dry =
                api.patch("rs", &PatchParams::apply("other").force().dry_run(), &Patch::Apply(&cfg)).await.unwrap();
            assert_eq!(dry.spec.replicas, Some(1));
            assert_eq!(api.get("rs").await.unwrap().spec.replicas, Some(2));
            // Apply to the status subresource.
            let status_cfg = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "rs"},
                "status": {"conditions": [{"type": "Checked", "status": "True", "reason": "Test", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
            let ps = api
                .patch_status("rs", &PatchParams::apply("checker").force(), &Patch::Apply(&status_cfg))
                .await
                .unwrap();
            let entry = ps
                .metadata
                .managed_fields
                .unwrap()
                .into_iter()
                .find(|e| e.manager.as_deref() == Some("checker"))
                .unwrap();
            assert_eq!(entry.subresource.as_deref(), Some("status"));
            let _ = &c;
            let (code, body) = send(
                &client,
                "PATCH",
                "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets/rs",
                "application/strategic-merge-patch+json",
                b"{}".to_vec(),
            )
            .await;
            assert_eq!((code, body["reason"].as_str()), (415, Some("UnsupportedMediaType")));
        });
    });
}

/// A kind served at two versions that differ in nothing these writes touch: PodSet, or a CRD whose versions share
/// one schema with a conversion of `None` (kube-apiserver then records field ownership exactly as for a built-in
/// type with two versions: the machinery is the same, only the conversion differs). The fields the versions name
/// differently (`spec.minReadySeconds`) cannot be compared so: tests/versions.rs checks them.
struct Twin {
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
}

const TWIN_CRD: Twin = Twin { group: "cmp.example.com", plural: "twins", kind: "Twin" };
const TWIN_PODSET: Twin = Twin { group: "demo.k8s.io", plural: "podsets", kind: "PodSet" };

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: twins.cmp.example.com}
spec:
  group: cmp.example.com
  names: {plural: twins, singular: twin, kind: Twin}
  scope: Namespaced
  conversion: {strategy: None}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema: &schema
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - {name: v1beta1, served: true, storage: false, schema: *schema}
";

/// Four managers write one object through both versions: applies that conflict across versions and are forced,
/// updates by one manager in each version (one entry per version, as kube keeps them), an applier moving to the
/// other version. What each step answered and left in managedFields (the entries' versions included).
async fn two_version_sequence(client: &kube::Client, k: &Twin) -> Vec<Value> {
    let path = |v: &str| format!("/apis/{}/{v}/namespaces/default/{}/twin", k.group, k.plural);
    let object = |v: &str, spec: Value, labels: Value| {
        json!({"apiVersion": format!("{}/{v}", k.group), "kind": k.kind,
               "metadata": {"name": "twin", "labels": labels}, "spec": spec})
    };
    let normalize = |v: Value| -> Value {
        let text = v.to_string().replace(k.group, "<group>").replace(k.kind, "<Kind>");
        serde_json::from_str(&text).unwrap()
    };
    let observe = || async {
        let (code, obj) = send(client, "GET", &path("v1beta1"), "application/json", Vec::new()).await;
        assert_eq!(code, 200, "{obj}");
        let mut entries: Vec<Value> = obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| ["alice", "bob", "carol", "dave"].contains(&e["manager"].as_str().unwrap()))
            .map(|e| {
                // The fields these writes own; PodSet's defaults (a selector from the labels) are left out.
                let mut fields = e["fieldsV1"].clone();
                if let Some(spec) = fields.get_mut("f:spec").and_then(Value::as_object_mut) {
                    spec.remove("f:selector");
                    if spec.is_empty() {
                        fields.as_object_mut().unwrap().remove("f:spec");
                    }
                }
                json!({"manager": e["manager"], "operation": e["operation"], "apiVersion": e["apiVersion"],
                       "fieldsV1": fields})
            })
            .collect();
        entries.sort_by_key(|e| e.to_string());
        json!({"replicas": obj["spec"]["replicas"], "labels": obj["metadata"]["labels"], "managedFields": entries})
    };
    let apply = |v: &'static str, manager: &'static str, force: bool, body: Value| {
        let uri = format!("{}?fieldManager={manager}&force={force}", path(v));
        async move { send(client, "PATCH", &uri, "application/apply-patch+yaml", body.to_string().into_bytes()).await }
    };
    let update = |v: &'static str, manager: &'static str, body: Value| {
        let uri = format!("{}?fieldManager={manager}", path(v));
        async move { send(client, "PATCH", &uri, "application/merge-patch+json", body.to_string().into_bytes()).await }
    };
    let (a, b) = ("v1alpha1", "v1beta1");
    let mut seen = Vec::new();
    let mut step = |what: &str, answered: (u16, Value), state: Value| {
        seen.push(normalize(json!({"step": what, "answer": answer(answered.0, &answered.1), "state": state})))
    };
    let r = apply(a, "alice", false, object(a, json!({"replicas": 2}), json!({"team": "a"}))).await;
    step("alice applies in v1alpha1", r, observe().await);
    let r = apply(b, "bob", false, object(b, json!({"replicas": 3}), json!({}))).await;
    step("bob applies in v1beta1: conflict", r, observe().await);
    let r = apply(b, "bob", true, object(b, json!({"replicas": 3}), json!({}))).await;
    step("bob forces", r, observe().await);
    let r = update(a, "carol", json!({"metadata": {"labels": {"env": "x"}}})).await;
    step("carol updates in v1alpha1", r, observe().await);
    let r = update(b, "carol", json!({"spec": {"replicas": 4}})).await;
    step("carol updates in v1beta1", r, observe().await);
    let r = apply(a, "dave", false, object(a, json!({"replicas": 5}), json!({"env": "z"}))).await;
    step("dave applies in v1alpha1: conflict", r, observe().await);
    let r = apply(b, "alice", false, object(b, json!({}), json!({"team": "a"}))).await;
    step("alice applies in v1beta1", r, observe().await);
    let r = update(a, "carol", json!({"metadata": {"labels": {"env": "y"}}})).await;
    step("carol updates in v1alpha1 again", r, observe().await);
    let r = apply(a, "dave", true, object(a, json!({"replicas": 5}), json!({"env": "z"}))).await;
    step("dave forces", r, observe().await);
    seen
}

#[test]
fn apply_across_two_versions_matches_kube_apiserver() {
    in_namespace("apply_across_two_versions_matches_kube_apiserver", || {
        let c = common::cluster::start();
        c.apply_text("crd.yaml", CRD);
        c.kubectl(&["wait", "--for=condition=Established", "crd/twins.cmp.example.com", "--timeout=60s"]);
        runtime().block_on(async {
            let client = c.client().await;
            let theirs = two_version_sequence(&client, &TWIN_CRD).await;
            let ours = two_version_sequence(&client, &TWIN_PODSET).await;
            compare(&theirs, &ours);
        });
    });
}
