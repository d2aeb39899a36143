//! The test control plane's front for kube-apiserver (`podset_envtest::PolicyApi`, started by
//! `Cluster::start_with_policy_api`): it serves `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicies and
//! bindings, which kube-apiserver 1.20 lacks, by their wire contract, and forwards everything else to
//! kube-apiserver as the caller. One cluster, with podset-apiserver's `--kubeconfig` pointing at the front:
//!
//! - the two resources through a kube-rs client: create, get, list, watch (a watcher sees a new policy within a
//!   second), update conflicts, the status subresource, delete, bookmarks, `410 Gone` after a compaction;
//! - kubectl 1.37 through the front: discovery (it asks for aggregated discovery and falls back), `apply`
//!   client- and server-side, `get` as a table, `delete`;
//! - forwarding: lists and watches of ConfigMaps, podset-apiserver's own requests, a token's requests;
//! - authorization: a user without RBAC gets kube-apiserver's 403 from the front and from kube-apiserver alike,
//!   and a grant in RBAC lets them in.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{in_namespace, runtime, Cluster};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use podset_envtest::{Credential, FrontRequest, ServerCommand};
use serde_json::{json, Value};

fn policy(name: &str, team: &str) -> ValidatingAdmissionPolicy {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {"team": team}},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["demo.k8s.io"], "apiVersions": ["*"],
                                                     "operations": ["CREATE", "UPDATE"], "resources": ["podsets"]}]},
            "validations": [{"expression": "object.spec.replicas <= 5"}]
        }
    }))
    .unwrap()
}

fn binding(name: &str, policy: &str) -> ValidatingAdmissionPolicyBinding {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": ["Deny"]}
    }))
    .unwrap()
}

/// The Status of a failed call.
fn status(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("not an API error: {other:?}"),
    }
}

fn rv(meta: &kube::api::ObjectMeta) -> String {
    meta.resource_version.clone().expect("a resourceVersion")
}

/// The next event of a watch within `within`.
async fn next<K, S>(events: &mut S, within: Duration) -> WatchEvent<K>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    tokio::time::timeout(within, events.next())
        .await
        .expect("an event in time")
        .expect("the watch goes on")
        .expect("a watch event")
}

#[test]
fn policy_api_front() {
    in_namespace("policy_api_front", || {
        let c = Cluster::start_with_policy_api(ServerCommand { program: common::BIN.into(), args: Vec::new() });
        runtime().block_on(async {
            served_resources(&c).await;
            kubectl_through_the_front(&c);
            forwarded(&c).await;
            authorization(&c).await;
        });
    });
}

async fn served_resources(c: &Cluster) {
    let client = c.policy_api_admin_client();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());

    // Discovery: kube-apiserver's list for the group version, with the served resources added.
    let resources = client.list_api_group_resources("admissionregistration.k8s.io/v1").await.unwrap();
    let names: Vec<&str> = resources.resources.iter().map(|r| r.name.as_str()).collect();
    for name in [
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicies/status",
        "validatingadmissionpolicybindings",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let vap = resources.resources.iter().find(|r| r.name == "validatingadmissionpolicies").unwrap();
    assert_eq!((vap.kind.as_str(), vap.namespaced), ("ValidatingAdmissionPolicy", false));
    assert_eq!(vap.verbs, ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]);

    // A kube-rs watcher, synced before the policy exists, sees it within a second of its creation.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let stream = watcher(policies.clone(), watcher::Config::default());
    let watching = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let _ = seen_tx.send((Instant::now(), event.map_err(|e| e.to_string())));
        }
    });
    loop {
        let (_, event) = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await.unwrap().unwrap();
        if matches!(event.unwrap(), watcher::Event::InitDone) {
            break;
        }
    }
    let creating = Instant::now();
    let made = policies.create(&PostParams::default(), &policy("replicas-limit", "a")).await.unwrap();
    let meta = &made.metadata;
    assert_eq!(meta.generation, Some(1));
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    let spec = made.spec.as_ref().unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "defaulted");
    let (at, event) =
        tokio::time::timeout(Duration::from_secs(1), seen.recv()).await.expect("within a second").unwrap();
    let watcher::Event::Apply(seen_policy) = event.unwrap() else { panic!("not an Apply") };
    assert_eq!(seen_policy.metadata.uid, made.metadata.uid);
    eprintln!("the watcher saw the policy {:?} after the create call", at.duration_since(creating));
    watching.abort();

    let (code, reason, _) =
        status(policies.create(&PostParams::default(), &policy("replicas-limit", "a")).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(policies.get("replicas-limit").await.unwrap(), made);
    let (code, reason, message) = status(policies.get("nope").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(message, r#"validatingadmissionpolicies.admissionregistration.k8s.io "nope" not found"#);

    policies.create(&PostParams::default(), &policy("other-team", "b")).await.unwrap();
    let list = policies.list(&ListParams::default()).await.unwrap();
    let listed_rv = list.metadata.resource_version.clone().expect("the list's resourceVersion");
    assert_eq!(list.items.len(), 2);
    let team_a = policies.list(&ListParams::default().labels("team=a")).await.unwrap();
    assert_eq!(team_a.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["replicas-limit"]);

    // Updates: optimistic concurrency on the resourceVersion, the generation follows the spec.
    let mut changed = made.clone();
    changed.spec.as_mut().unwrap().validations.as_mut().unwrap()[0].expression = "object.spec.replicas <= 3".into();
    let updated = policies.replace("replicas-limit", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_ne!(rv(&updated.metadata), rv(&made.metadata));
    let (code, reason, message) =
        status(policies.replace("replicas-limit", &PostParams::default(), &changed).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(message.contains("the object has been modified"), "{message}");

    // The status subresource writes status alone.
    let patched = policies
        .patch_status(
            "replicas-limit",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 2}, "spec": {"failurePolicy": "Ignore"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref().unwrap().observed_generation, Some(2));
    assert_eq!(patched.spec.as_ref().unwrap().failure_policy.as_deref(), Some("Fail"));
    assert_eq!(patched.metadata.generation, Some(2));

    // A watch from the list's resourceVersion replays what happened since, then follows: a binding's creation
    // and deletion on the same counter do not show among the policies.
    let mut from_list = policies.watch(&WatchParams::default().timeout(60), &listed_rv).await.unwrap().boxed();
    let WatchEvent::Modified(p) = next(&mut from_list, Duration::from_secs(5)).await else { panic!("MODIFIED") };
    assert_eq!(p.metadata.generation, Some(2));
    let WatchEvent::Modified(p) = next(&mut from_list, Duration::from_secs(5)).await else { panic!("MODIFIED") };
    assert_eq!(p.status.unwrap().observed_generation, Some(2));
    let b =
        bindings.create(&PostParams::default(), &binding("replicas-limit-binding", "replicas-limit")).await.unwrap();
    assert_eq!(b.metadata.generation, Some(1));
    assert_eq!(bindings.get("replicas-limit-binding").await.unwrap().spec.policy_name, "replicas-limit");
    let mut binding_events =
        bindings.watch(&WatchParams::default().timeout(60), &rv(&b.metadata)).await.unwrap().boxed();
    assert!(bindings.delete("replicas-limit-binding", &DeleteParams::default()).await.unwrap().is_right(), "a Status");
    let WatchEvent::Deleted(gone) = next(&mut binding_events, Duration::from_secs(5)).await else { panic!("DELETED") };
    assert_eq!(gone.metadata.uid, b.metadata.uid);
    let deleted = policies.delete("other-team", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_right());
    let WatchEvent::Deleted(gone) = next(&mut from_list, Duration::from_secs(5)).await else { panic!("DELETED") };
    assert_eq!(gone.metadata.name.as_deref(), Some("other-team"));
    // An idle watch that asked for them gets bookmarks.
    let WatchEvent::Bookmark(mark) = next(&mut from_list, Duration::from_secs(5)).await else { panic!("BOOKMARK") };
    assert_eq!(mark.metadata.resource_version, c.policy_api().resource_version().to_string());

    // Once compacted, a watch from an older resourceVersion is told 410 Gone (in the stream, as kube-apiserver's
    // watch cache does), and a kube-rs watcher lists again.
    c.policy_api().compact();
    let mut expired = policies.watch(&WatchParams::default(), &listed_rv).await.unwrap().boxed();
    let WatchEvent::Error(e) = next(&mut expired, Duration::from_secs(5)).await else { panic!("ERROR") };
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}");
    let relisted: Vec<ValidatingAdmissionPolicy> = tokio::time::timeout(
        Duration::from_secs(10),
        watcher(policies.clone(), watcher::Config::default()).applied_objects().take(1).try_collect(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(relisted[0].metadata.name.as_deref(), Some("replicas-limit"));
    // A streaming list (sendInitialEvents): the objects, then the bookmark that ends them.
    let streamed = watcher(policies.clone(), watcher::Config::default().streaming_lists());
    let mut streamed = std::pin::pin!(streamed);
    let mut initial = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), streamed.next()).await.unwrap().unwrap().unwrap();
        match event {
            watcher::Event::InitApply(p) => initial.push(p.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial, ["replicas-limit"]);

    // timeoutSeconds ends a watch; "0" starts it with the objects there are.
    let started = Instant::now();
    let short = policies.watch(&WatchParams::default().timeout(1).disable_bookmarks(), "0").await.unwrap();
    let events: Vec<WatchEvent<ValidatingAdmissionPolicy>> =
        tokio::time::timeout(Duration::from_secs(5), short.try_collect()).await.expect("ended").unwrap();
    assert!(matches!(&events[..], [WatchEvent::Added(p)] if p.metadata.name.as_deref() == Some("replicas-limit")));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // deletecollection, by label.
    for name in ["z1", "z2"] {
        policies.create(&PostParams::default(), &policy(name, "z")).await.unwrap();
    }
    let gone = policies.delete_collection(&DeleteParams::default(), &ListParams::default().labels("team=z")).await;
    let gone = gone.unwrap().left().expect("the deleted objects");
    assert_eq!(gone.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["z1", "z2"]);
    assert!(policies.list(&ListParams::default().labels("team=z")).await.unwrap().items.is_empty());

    policies.delete("replicas-limit", &DeleteParams::default()).await.unwrap();
}

fn kubectl_through_the_front(c: &Cluster) {
    // kube-apiserver 1.20 itself has no such resource.
    let direct = c.kubectl_try(&["get", "validatingadmissionpolicies"]).unwrap_err();
    assert!(direct.contains("the server doesn't have a resource type"), "{direct}");

    let resources = c.policy_api_kubectl(&["api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name"]);
    assert!(resources.contains("validatingadmissionpolicies.admissionregistration.k8s.io"), "{resources}");
    assert!(resources.contains("validatingadmissionpolicybindings.admissionregistration.k8s.io"), "{resources}");

    let yaml = |limit: u32| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: kubectl-policy\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n    - apiGroups: [demo.k8s.io]\n      apiVersions: ['*']\n      operations: [CREATE, UPDATE]\n      resources: [podsets]\n  validations:\n  - expression: object.spec.replicas <= {limit}\n    message: too many\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata:\n  name: kubectl-binding\nspec:\n  policyName: kubectl-policy\n  validationActions: [Deny]\n"
        )
    };
    let file = c.dir.path().join("policy.yaml");
    let path = file.to_str().unwrap();
    std::fs::write(&file, yaml(5)).unwrap();
    let out = c.policy_api_kubectl(&["apply", "-f", path]);
    assert!(out.contains("validatingadmissionpolicy.admissionregistration.k8s.io/kubectl-policy created"), "{out}");
    assert!(
        out.contains("validatingadmissionpolicybinding.admissionregistration.k8s.io/kubectl-binding created"),
        "{out}"
    );
    std::fs::write(&file, yaml(3)).unwrap();
    let out = c.policy_api_kubectl(&["apply", "-f", path]);
    assert!(out.contains("validatingadmissionpolicy.admissionregistration.k8s.io/kubectl-policy configured"), "{out}");
    assert!(
        out.contains("validatingadmissionpolicybinding.admissionregistration.k8s.io/kubectl-binding unchanged"),
        "{out}"
    );
    let expression = c.policy_api_kubectl(&[
        "get",
        "validatingadmissionpolicy",
        "kubectl-policy",
        "-o",
        "jsonpath={.spec.validations[0].expression} {.metadata.generation}",
    ]);
    assert_eq!(expression, "object.spec.replicas <= 3 2");

    let table = c.policy_api_kubectl(&["get", "validatingadmissionpolicies"]);
    eprintln!("kubectl get validatingadmissionpolicies (through the front):\n{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]);
    assert!(table.lines().any(|l| l.split_whitespace().take(3).eq(["kubectl-policy", "1", "<unset>"])), "{table}");
    let table = c.policy_api_kubectl(&["get", "validatingadmissionpolicybindings"]);
    assert!(
        table.lines().any(|l| l.split_whitespace().take(3).eq(["kubectl-binding", "kubectl-policy", "<unset>"])),
        "{table}"
    );

    // Server-side apply: create, then change.
    std::fs::write(&file, yaml(4).replace("kubectl-policy", "ssa-policy").replace("kubectl-binding", "ssa-binding"))
        .unwrap();
    let out = c.policy_api_kubectl(&["apply", "--server-side", "-f", path]);
    assert!(
        out.contains("validatingadmissionpolicy.admissionregistration.k8s.io/ssa-policy serverside-applied"),
        "{out}"
    );
    std::fs::write(&file, yaml(2).replace("kubectl-policy", "ssa-policy").replace("kubectl-binding", "ssa-binding"))
        .unwrap();
    c.policy_api_kubectl(&["apply", "--server-side", "-f", path]);
    let expression = c.policy_api_kubectl(&[
        "get",
        "validatingadmissionpolicy",
        "ssa-policy",
        "-o",
        "jsonpath={.spec.validations[0].expression}",
    ]);
    assert_eq!(expression, "object.spec.replicas <= 2");
    let out = c.policy_api_kubectl(&["delete", "-f", path]);
    assert!(out.contains("validatingadmissionpolicy.admissionregistration.k8s.io \"ssa-policy\" deleted"), "{out}");
    let names =
        c.policy_api_kubectl(&["get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-o", "name"]);
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        [
            "validatingadmissionpolicy.admissionregistration.k8s.io/kubectl-policy",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/kubectl-binding"
        ]
    );
}

async fn forwarded(c: &Cluster) {
    let front = c.policy_api_admin_client();
    let configmaps: Api<ConfigMap> = Api::namespaced(front.clone(), "default");
    let direct: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let listed = configmaps.list(&ListParams::default()).await.unwrap();
    let kube_system: Api<ConfigMap> = Api::namespaced(front, "kube-system");
    kube_system.get("extension-apiserver-authentication").await.unwrap();

    // A watch through the front streams: a ConfigMap made at kube-apiserver shows at once.
    let mut events = configmaps
        .watch(&WatchParams::default().timeout(60), &listed.metadata.resource_version.clone().unwrap())
        .await
        .unwrap()
        .boxed();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "through-the-front"}, "data": {"a": "b"}})).unwrap();
    let creating = Instant::now();
    direct.create(&PostParams::default(), &cm).await.unwrap();
    let WatchEvent::Added(seen) = next(&mut events, Duration::from_secs(1)).await else { panic!("ADDED") };
    assert_eq!(seen.metadata.name.as_deref(), Some("through-the-front"));
    eprintln!("a forwarded watch saw a ConfigMap {:?} after the create call", creating.elapsed());

    // podset-apiserver's own requests go through the front (its kubeconfig): the SubjectAccessReviews for the
    // requests the aggregator sends it, say.
    c.apply_text(
        "podset.yaml",
        "apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata:\n  name: through-the-front\n  namespace: default\nspec:\n  \
         replicas: 0\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - {name: main, image: busybox}\n",
    );
    c.kubectl(&["get", "podset", "through-the-front", "-n", "default"]);
    let server = "system:serviceaccount:podset-system:podset-apiserver";
    let theirs: Vec<FrontRequest> = c.policy_api().requests().into_iter().filter(|r| r.user == server).collect();
    let review = theirs
        .iter()
        .find(|r| r.method == "POST" && r.uri.starts_with("/apis/authorization.k8s.io/v1/subjectaccessreviews"));
    assert_eq!(review.map(|r| r.code), Some(201), "podset-apiserver's requests through the front: {theirs:#?}");
}

async fn authorization(c: &Cluster) {
    let nobody = c.client_cert("ca", "nobody", Some("testers"));
    let client = c.policy_api_client(Credential::Cert(&nobody));
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let (code, reason, message) = status(policies.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        r#"validatingadmissionpolicies.admissionregistration.k8s.io is forbidden: User "nobody" cannot list resource "validatingadmissionpolicies" in API group "admissionregistration.k8s.io" at the cluster scope"#
    );
    let (code, _, message) = status(policies.get("kubectl-policy").await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"validatingadmissionpolicies.admissionregistration.k8s.io "kubectl-policy" is forbidden: User "nobody" cannot get resource "validatingadmissionpolicies" in API group "admissionregistration.k8s.io" at the cluster scope"#
    );
    // kube-apiserver sees the same user when the front forwards.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (code, _, message) = status(configmaps.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"configmaps is forbidden: User "nobody" cannot list resource "configmaps" in API group "" in the namespace "default""#
    );

    // An RBAC grant to the certificate's group decides.
    c.apply_text(
        "policy-reader.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: policy-reader\nrules:\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [validatingadmissionpolicies, validatingadmissionpolicybindings]\n  verbs: [get, list, watch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: policy-reader\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: policy-reader\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: Group\n  name: testers\n",
    );
    common::cluster::wait(
        Duration::from_secs(30),
        || async { policies.list(&ListParams::default()).await.is_ok() },
        "the grant",
    )
    .await;
    assert_eq!(policies.get("kubectl-policy").await.unwrap().metadata.name.as_deref(), Some("kubectl-policy"));
    let (code, _, message) = status(policies.create(&PostParams::default(), &policy("mine", "c")).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains(r#"User "nobody" cannot create resource "validatingadmissionpolicies""#), "{message}");
    let empty_status = Patch::Merge(json!({"status": {}}));
    let status_write = policies.patch_status("kubectl-policy", &PatchParams::default(), &empty_status).await;
    let (code, _, message) = status(status_write.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains(r#"cannot patch resource "validatingadmissionpolicies/status""#), "{message}");

    // A bearer token passes through to kube-apiserver, and is reviewed for the served resources.
    c.kubectl(&["create", "serviceaccount", "policy-reader", "-n", "default"]);
    let token = c.kubectl(&["create", "token", "policy-reader", "-n", "default"]).trim().to_owned();
    let sa = c.policy_api_client(Credential::Token(&token));
    let (code, _, message) =
        status(Api::<ValidatingAdmissionPolicy>::all(sa.clone()).list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains(r#"User "system:serviceaccount:default:policy-reader" cannot list"#), "{message}");
    let (code, _, message) =
        status(Api::<ConfigMap>::namespaced(sa, "default").list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains(r#"User "system:serviceaccount:default:policy-reader" cannot list"#), "{message}");
    let bad = c.policy_api_client(Credential::Token("not-a-token"));
    let (code, reason, _) =
        status(Api::<ValidatingAdmissionPolicy>::all(bad).list(&ListParams::default()).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (401, "Unauthorized"));

    // Raw: a method the collection does not have.
    let request = http::Request::put("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    let answer: Value = match c.policy_api_admin_client().request::<Value>(request).await {
        Err(kube::Error::Api(s)) => serde_json::to_value(&*s).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!((answer["code"].as_u64(), answer["reason"].as_str()), (Some(405), Some("MethodNotAllowed")));
}
