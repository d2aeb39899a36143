//! A ReplicaSet and a PodSet side by side on the local node (a real kubelet: the Pods run the demo workload and are
//! Ready by their probe), made from the same template and driven through the same steps: scale 0→5, two Pods made
//! unready by their probe, deletion costs on two Pods, scale 5→2, a Pod deleted by hand, a ResourceQuota that refuses
//! the third Pod and is changed to refuse it otherwise, a template whose Pod the API refuses, the namespace deleted while scaling. Each lives in a
//! namespace of its own (`theirs`, `ours`), so a quota or a namespace's deletion touches each alike. After each step
//! both are compared: which Pods remain, by their role in the steps (names are random); the events about each, by
//! type, reason and message with generated Pod names as `web-*`; and the status fields both have.
//!
//! What still differs is named below ([`DELETION_COST`], [`THEIR_STATUS_ONLY`], [`OUR_STATUS_ONLY`],
//! [`EVENT_SOURCE`], [`EVENT_COUNTS`], [`THEIR_RECORDER`]) and asserted where it shows, so a change on either side
//! fails the test.
//!
//! One cluster for the whole test: its start is most of the cost.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::cluster::{self, in_namespace, runtime, wait, Cluster};
use common::node::{demo_template, http_get, phase, pod_ip, ready, POD_WAIT};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::ResourceExt;
use serde_json::{json, Value};

/// kube-controller-manager here is 1.20, older than `controller.kubernetes.io/pod-deletion-cost` (alpha in 1.21, on
/// by default from 1.22): its scale-down deletes the Pod ready last whatever its cost; ours keeps the costlier Pod,
/// as today's ReplicaSet controller does.
const DELETION_COST: &str = "deletion cost: kube-controller-manager 1.20 ranks Pods without it";
/// A ReplicaSet's status fields a PodSet's has not.
const THEIR_STATUS_ONLY: [&str; 0] = [];
/// A PodSet's status fields a ReplicaSet's has not: the counted Pods' names, the `Ready` and `Reconciling`
/// conditions `kubectl wait` and kstatus read of a workload that is not built in, and `terminatingReplicas`, which
/// kube-controller-manager 1.20 predates (kube 1.33).
const OUR_STATUS_ONLY: [&str; 3] = ["conditions", "podNames", "terminatingReplicas"];
const OUR_CONDITIONS_ONLY: [&str; 2] = ["Ready", "Reconciling"];
/// Who reports: the ReplicaSet controller writes core/v1 Events (`source.component`); ours are events.k8s.io/v1
/// Events (`reportingController`, `reportingComponent` through core/v1).
const EVENT_SOURCE: [&str; 2] = ["replicaset-controller", "podset-controller"];
/// A message repeated (a create refused again on retry) counts on, on an Event of the same message: client-go's
/// correlator as a count, ours as a series; and the two controllers retry on backoffs of their own. So events are
/// compared as sets, not counts.
const EVENT_COUNTS: &str = "events are compared as sets: repeats are counted differently";
/// client-go's recorder, the ReplicaSet controller's, lets [`THEIR_EVENT_BUDGET`] events about one object through,
/// then one every five minutes (`EventSourceObjectSpamFilter`); and after ten different messages of one reason it
/// writes the rest as one Event, its message marked [`COMBINED`] (`EventAggregator`). Every refused create is an
/// event, retried within milliseconds at first, so after the quota and the refused template a ReplicaSet may have
/// spent its events, and what it does next goes unrecorded. Our recorder does neither: our events are
/// all there. The ReplicaSet's may fall short of the expected ones only once those it recorded count up to the
/// budget.
const THEIR_RECORDER: &str = "client-go's recorder drops a ReplicaSet's events past 25 and combines similar ones";
const THEIR_EVENT_BUDGET: i32 = 25;
const COMBINED: &str = "(combined from similar events): ";

const NAME: &str = "web";
const COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The roles Pods take in the steps.
const UNREADY: &str = "made unready by its probe";
const UNREADY_COSTLY: &str = "made unready by its probe, deletion cost 1000";
const READY_COSTLY: &str = "ready, deletion cost 100, restarted so it is the one ready last";
const READY: &str = "ready";
const REPLACEMENT: &str = "replacement of the Pod deleted by hand";
const FIXED: &str = "made from the fixed template";

/// The messages the API refuses the Pods with, generated names as `web-*`.
const QUOTA_REFUSAL: &str =
    "pods \"web-*\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2";
const CPU_QUOTA_REFUSAL: &str = "pods \"web-*\" is forbidden: failed quota: pods: must specify requests.cpu";
const TEMPLATE_REFUSAL: &str = "pods \"web-\" is forbidden: no PriorityClass with name missing was found";

/// The demo workload, Ready two seconds after it starts and unready after one failed probe.
fn template(image: &str) -> Value {
    let mut t = demo_template(image, NAME, 2);
    t["spec"]["containers"][0]["readinessProbe"]["failureThreshold"] = json!(1);
    t
}

/// One of the two workloads, named `web` in a namespace of its own.
struct Side {
    kind: &'static str,
    namespace: &'static str,
    workloads: Api<DynamicObject>,
    pods: Api<Pod>,
    events: Api<Event>,
}

impl Side {
    fn new(client: &kube::Client, kind: &'static str, namespace: &'static str) -> Self {
        let gvk = match kind {
            "ReplicaSet" => GroupVersionKind::gvk("apps", "v1", kind),
            _ => GroupVersionKind::gvk("demo.k8s.io", "v1alpha1", kind),
        };
        Self {
            kind,
            namespace,
            workloads: Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk)),
            pods: Api::namespaced(client.clone(), namespace),
            events: Api::namespaced(client.clone(), namespace),
        }
    }

    /// `kubectl` with `verb`, this workload, and `args`.
    fn kubectl(&self, cluster: &Cluster, verb: &str, args: &[&str]) -> String {
        let resource = format!("{}/{NAME}", self.kind.to_lowercase());
        let mut all = vec![verb, "-n", self.namespace, &resource];
        all.extend_from_slice(args);
        cluster.kubectl(&all)
    }

    fn scale(&self, cluster: &Cluster, replicas: i32) {
        self.kubectl(cluster, "scale", &[&format!("--replicas={replicas}")]);
    }

    fn patch(&self, cluster: &Cluster, patch: Value) {
        self.kubectl(cluster, "patch", &["--type=merge", "-p", &patch.to_string()]);
    }
}

/// The status fields a ReplicaSet and a PodSet both have, with the generation they were observed at; of the
/// conditions, `ReplicaFailure` (status, reason, message with generated names as `web-*`).
#[derive(Debug, Clone, PartialEq)]
struct Status {
    replicas: i64,
    fully_labeled_replicas: i64,
    ready_replicas: i64,
    available_replicas: i64,
    generation: i64,
    observed_generation: i64,
    replica_failure: Option<[String; 3]>,
}

impl Status {
    /// `replicas` Pods, `ready` of them ready (and so available), generation `generation` observed.
    fn settled(replicas: i64, ready: i64, generation: i64) -> Self {
        // The template's labels are the selector's: every Pod is fully labelled.
        Self {
            replicas,
            fully_labeled_replicas: replicas,
            ready_replicas: ready,
            available_replicas: ready,
            generation,
            observed_generation: generation,
            replica_failure: None,
        }
    }

    fn failing(self, reason: &str, message: &str) -> Self {
        Self { replica_failure: Some(["True".into(), reason.into(), message.into()]), ..self }
    }

    fn of(obj: &DynamicObject) -> Self {
        let status = &obj.data["status"];
        let int = |field: &str| status[field].as_i64().unwrap_or(0);
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let failure = conditions
            .iter()
            .find(|c| c["type"] == "ReplicaFailure")
            .map(|c| ["status", "reason", "message"].map(|k| normalise(c[k].as_str().unwrap_or_default())));
        Self {
            replicas: int("replicas"),
            fully_labeled_replicas: int("fullyLabeledReplicas"),
            ready_replicas: int("readyReplicas"),
            available_replicas: int("availableReplicas"),
            generation: obj.metadata.generation.unwrap_or(0),
            observed_generation: int("observedGeneration"),
            replica_failure: failure,
        }
    }
}

async fn status(side: &Side) -> Status {
    Status::of(&side.workloads.get(NAME).await.unwrap())
}

/// Both sides' status, once it is `want`.
async fn expect_status(sides: &[Side; 2], want: Status, what: &str) {
    settle(what, &[want.clone(), want], || async { [status(&sides[0]).await, status(&sides[1]).await] }).await;
}

/// Polls `observe` until it gives `want`; after [`POD_WAIT`], fails with the last observation.
async fn settle<T, F, Fut>(what: &str, want: &T, mut observe: F) -> T
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + POD_WAIT;
    loop {
        let got = observe().await;
        if &got == want || Instant::now() > deadline {
            assert_eq!(&got, want, "{what}");
            return got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `message` with each generated Pod name (`web-` and five characters) as `web-*`, and not marked [`COMBINED`].
fn normalise(message: &str) -> String {
    let prefix = format!("{NAME}-");
    let (mut out, mut rest) = (String::new(), message.strip_prefix(COMBINED).unwrap_or(message));
    while let Some(i) = rest.find(&prefix) {
        out.push_str(&rest[..i + prefix.len()]);
        rest = &rest[i + prefix.len()..];
        let suffix = rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit()).count();
        if suffix == 5 {
            out.push('*');
            rest = &rest[5..];
        }
    }
    out + rest
}

fn restarts(p: &Pod) -> i32 {
    let statuses = p.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses.and_then(|s| s.first()).map_or(0, |c| c.restart_count)
}

/// Every Pod of the namespace, terminating and terminated ones too, sorted by name.
async fn all_pods(side: &Side) -> Vec<Pod> {
    let mut pods = side.pods.list(&ListParams::default()).await.unwrap().items;
    pods.sort_by_key(|p| p.name_any());
    pods
}

/// The Pods a controller counts: neither terminated nor being deleted.
async fn live_pods(side: &Side) -> Vec<Pod> {
    let all = all_pods(side).await;
    all.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !matches!(phase(p), "Succeeded" | "Failed"))
        .collect()
}

/// The live Pods, once there are `n`, all Running and Ready.
async fn running_ready(side: &Side, n: usize) -> Vec<Pod> {
    let what = format!("{n} Pods of the {} Running and Ready", side.kind);
    wait(
        POD_WAIT,
        || async {
            let live = live_pods(side).await;
            live.len() == n && live.iter().all(|p| phase(p) == "Running" && ready(p))
        },
        &what,
    )
    .await;
    live_pods(side).await
}

/// Scales both sides to `replicas` (a new generation) and waits until each has that many Pods Running and Ready and
/// its status counts them at that generation: each side's live Pods.
async fn scale_and_settle(
    cluster: &Cluster,
    sides: &[Side; 2],
    replicas: i32,
    generation: &mut i64,
    what: &str,
) -> [Vec<Pod>; 2] {
    for side in sides {
        side.scale(cluster, replicas);
    }
    *generation += 1;
    let live = [running_ready(&sides[0], replicas as usize).await, running_ready(&sides[1], replicas as usize).await];
    let n = i64::from(replicas);
    expect_status(sides, Status::settled(n, n, *generation), what).await;
    live
}

/// One event about a workload, as core/v1 shows it (events.k8s.io's `note` is its `message`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    type_: String,
    reason: String,
    message: String,
}

impl Ev {
    fn new(type_: &str, reason: &str, message: &str) -> Self {
        Self { type_: type_.into(), reason: reason.into(), message: message.into() }
    }

    fn normalised(&self) -> Self {
        Self { message: normalise(&self.message), ..self.clone() }
    }
}

fn created(names: &[String]) -> BTreeSet<Ev> {
    names.iter().map(|n| Ev::new("Normal", "SuccessfulCreate", &format!("Created pod: {n}"))).collect()
}

fn deleted(names: &[String]) -> BTreeSet<Ev> {
    names.iter().map(|n| Ev::new("Normal", "SuccessfulDelete", &format!("Deleted pod: {n}"))).collect()
}

fn normalised(events: &BTreeSet<Ev>) -> BTreeSet<Ev> {
    events.iter().map(Ev::normalised).collect()
}

/// The Events about the workload through core/v1, by name and resourceVersion (a repeat updates an Event).
async fn events(side: &Side) -> Vec<((String, String), Event)> {
    let fields = format!("involvedObject.kind={},involvedObject.name={NAME}", side.kind);
    let list = side.events.list(&ListParams::default().fields(&fields)).await.unwrap().items;
    list.into_iter().map(|e| ((e.name_any(), e.resource_version().unwrap_or_default()), e)).collect()
}

/// The Events of both sides seen so far.
type Snapshot = HashSet<(String, String)>;

async fn snapshot(sides: &[Side; 2]) -> Snapshot {
    let mut seen = Snapshot::new();
    for side in sides {
        seen.extend(events(side).await.into_iter().map(|(k, _)| k));
    }
    seen
}

/// The events about the workload since `before`, but for those in `tolerated` (normalised).
async fn events_since(side: &Side, before: &Snapshot, tolerated: &BTreeSet<Ev>) -> BTreeSet<Ev> {
    let events = events(side).await.into_iter().filter(|(k, _)| !before.contains(k)).map(|(_, e)| {
        let text = |s: Option<String>| s.unwrap_or_default();
        Ev { type_: text(e.type_), reason: text(e.reason), message: text(e.message) }
    });
    events.filter(|e| !tolerated.contains(&e.normalised())).collect()
}

/// Whether the recorder of the ReplicaSet controller has spent its events about it ([`THEIR_RECORDER`]): those it
/// recorded, repeats counted, make the budget.
async fn their_events_spent(theirs: &Side) -> bool {
    events(theirs).await.iter().map(|(_, e)| e.count.unwrap_or(1)).sum::<i32>() >= THEIR_EVENT_BUDGET
}

/// How events are compared: with the Pods' names, or with generated names as `web-*`.
#[derive(Clone, Copy)]
enum Names {
    Kept,
    Aside,
}

async fn seen(side: &Side, before: &Snapshot, tolerated: &BTreeSet<Ev>, names: Names) -> BTreeSet<Ev> {
    let got = events_since(side, before, tolerated).await;
    match names {
        Names::Kept => got,
        Names::Aside => normalised(&got),
    }
}

/// Each side's events since `before` (but for `tolerated`), once they are `want` (theirs, ours); the ReplicaSet's
/// may be fewer once its recorder has spent its events ([`THEIR_RECORDER`]). The same, Pod names aside.
async fn expect_events(
    sides: &[Side; 2],
    before: &Snapshot,
    tolerated: &BTreeSet<Ev>,
    want: [BTreeSet<Ev>; 2],
    names: Names,
) {
    let deadline = Instant::now() + POD_WAIT;
    let [theirs, ours] = loop {
        let got = [seen(&sides[0], before, tolerated, names).await, seen(&sides[1], before, tolerated, names).await];
        let theirs_done = got[0] == want[0] || got[0].is_subset(&want[0]) && their_events_spent(&sides[0]).await;
        if theirs_done && got[1] == want[1] || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(ours, want[1], "the PodSet's events since the step began ({EVENT_COUNTS})");
    if theirs != want[0] {
        let spent = their_events_spent(&sides[0]).await;
        assert!(theirs.is_subset(&want[0]) && spent, "the ReplicaSet's events {theirs:?}, not {:?}", want[0]);
        let unrecorded: Vec<&Ev> = want[0].difference(&theirs).collect();
        eprintln!("{THEIR_RECORDER}: the ReplicaSet's {unrecorded:?} unrecorded");
    }
    assert_eq!(want[0].len(), want[1].len(), "as many events expected of each");
    assert_eq!(normalised(&want[0]), normalised(&want[1]), "the same events, Pod names aside");
}

/// Once each side has `n` Pods Running and Ready, exactly one of them new to the steps: it takes `role`. The new
/// Pod's name, per side.
async fn one_new_pod_each(
    sides: &[Side; 2],
    roles: &mut [HashMap<String, &'static str>; 2],
    n: usize,
    role: &'static str,
) -> [Vec<String>; 2] {
    let mut made: [Vec<String>; 2] = Default::default();
    for ((side, roles), made) in sides.iter().zip(roles.iter_mut()).zip(&mut made) {
        let pods = running_ready(side, n).await;
        let new: Vec<String> = names(&pods).into_iter().filter(|n| !roles.contains_key(n)).collect();
        assert_eq!(new.len(), 1, "{}: {:?}", side.kind, names(&pods));
        roles.insert(new[0].clone(), role);
        *made = new;
    }
    made
}

/// The roles of the live Pods, sorted; a Pod the steps gave none is `new`.
async fn roles(side: &Side, roles: &HashMap<String, &'static str>) -> Vec<&'static str> {
    let mut got: Vec<&str> =
        live_pods(side).await.iter().map(|p| *roles.get(&p.name_any()).unwrap_or(&"new")).collect();
    got.sort();
    got
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| p.name_any()).collect()
}

/// The fields of `a` that `b` has not.
fn only_in(a: &Value, b: &Value) -> Vec<String> {
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<BTreeSet<_>>()).unwrap_or_default();
    keys(a).difference(&keys(b)).cloned().collect()
}

fn condition_types(status: &Value) -> BTreeSet<String> {
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    conditions.iter().filter_map(|c| c["type"].as_str().map(str::to_owned)).collect()
}

#[test]
fn a_podset_goes_through_a_replicasets_steps_as_a_replicaset() {
    in_namespace("a_podset_goes_through_a_replicasets_steps_as_a_replicaset", || {
        let cluster = cluster::start_with_node();
        let started = Instant::now();
        let mut step_began = Instant::now();
        let mut step = |what: &str| {
            eprintln!("{what}: {:.0}s", step_began.elapsed().as_secs_f64());
            step_began = Instant::now();
        };
        runtime().block_on(async {
            let client = cluster.client().await;
            let sides = [Side::new(&client, "ReplicaSet", "theirs"), Side::new(&client, "PodSet", "ours")];
            let [theirs, ours] = &sides;
            let pp = PostParams::default();
            let namespaces: Api<Namespace> = Api::all(client.clone());
            for side in &sides {
                let ns = json!({"metadata": {"name": side.namespace}});
                namespaces.create(&pp, &serde_json::from_value(ns).unwrap()).await.unwrap();
            }
            // ServiceAccount admission refuses Pods until the namespace's `default` ServiceAccount is there.
            for side in &sides {
                let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), side.namespace);
                let what = format!("the default ServiceAccount in {}", side.namespace);
                wait(POD_WAIT, || async { accounts.get_opt("default").await.unwrap().is_some() }, &what).await;
            }
            let mut generation = 1;
            for side in &sides {
                let api_version = match side.kind {
                    "ReplicaSet" => "apps/v1",
                    _ => "demo.k8s.io/v1alpha1",
                };
                let spec = json!({"replicas": 0, "selector": {"matchLabels": {"app": NAME}},
                    "template": template(cluster.demo_image())});
                let obj =
                    json!({"apiVersion": api_version, "kind": side.kind, "metadata": {"name": NAME}, "spec": spec});
                side.workloads.create(&pp, &serde_json::from_value(obj).unwrap()).await.unwrap();
            }
            expect_status(&sides, Status::settled(0, 0, generation), "created with no replicas").await;
            step("created with 0 replicas");

            // Scale 0→5: five Pods each, an event per Pod naming it.
            let before = snapshot(&sides).await;
            let made = scale_and_settle(&cluster, &sides, 5, &mut generation, "scaled 0→5").await;
            let none = BTreeSet::new();
            expect_events(&sides, &before, &none, [created(&names(&made[0])), created(&names(&made[1]))], Names::Kept)
                .await;
            // `kubectl describe` shows them, as for a ReplicaSet.
            for (side, pods) in sides.iter().zip(&made) {
                let describe = side.kubectl(&cluster, "describe", &[]);
                for name in names(pods) {
                    assert!(describe.contains(&format!("Created pod: {name}")), "{}:\n{describe}", side.kind);
                }
            }
            for (side, source) in sides.iter().zip(EVENT_SOURCE) {
                for (_, e) in events(side).await {
                    let component = e.source.and_then(|s| s.component).filter(|c| !c.is_empty());
                    let from = component.or(e.reporting_component).unwrap_or_default();
                    assert_eq!(from, source, "{}'s events: {EVENT_SOURCE:?}", side.kind);
                }
            }
            let (their_status, our_status) = (
                theirs.workloads.get(NAME).await.unwrap().data["status"].clone(),
                ours.workloads.get(NAME).await.unwrap().data["status"].clone(),
            );
            assert_eq!(only_in(&their_status, &our_status), THEIR_STATUS_ONLY, "{their_status} against {our_status}");
            assert_eq!(only_in(&our_status, &their_status), OUR_STATUS_ONLY, "{our_status} against {their_status}");
            assert_eq!(condition_types(&our_status), BTreeSet::from(OUR_CONDITIONS_ONLY.map(String::from)));
            assert!(condition_types(&their_status).is_empty(), "{their_status}");
            step("scaled 0→5");

            // Two Pods made unready by their probe: counted, not ready, not replaced, no event.
            let before = snapshot(&sides).await;
            let mut role: [HashMap<String, &'static str>; 2] = Default::default();
            for (pods, role) in made.iter().zip(&mut role) {
                for p in pods {
                    role.insert(p.name_any(), READY);
                }
                for p in &pods[..2] {
                    assert_eq!(http_get(&pod_ip(p), "/unready"), (200, "not ready from now on".to_owned()));
                    role.insert(p.name_any(), UNREADY);
                }
            }
            expect_status(&sides, Status::settled(5, 3, generation), "two Pods unready").await;
            expect_events(&sides, &before, &none, [BTreeSet::new(), BTreeSet::new()], Names::Kept).await;
            for (side, role) in sides.iter().zip(&role) {
                assert_eq!(roles(side, role).await, [UNREADY, UNREADY, READY, READY, READY], "{}", side.kind);
            }
            step("two Pods made unready");

            // Deletion costs: 1000 on an unready Pod, 100 on a ready one. That one is restarted, so it is also the
            // one ready last: kube-controller-manager 1.20, which ranks by ready time and not by cost, deletes it
            // first of the ready ones, and its choice is the same every run.
            for (side, (pods, role)) in sides.iter().zip(made.iter().zip(&mut role)) {
                let cost = |c: &str| Patch::Merge(json!({"metadata": {"annotations": {COST: c}}}));
                side.pods.patch(&pods[1].name_any(), &PatchParams::default(), &cost("1000")).await.unwrap();
                side.pods.patch(&pods[2].name_any(), &PatchParams::default(), &cost("100")).await.unwrap();
                assert_eq!(http_get(&pod_ip(&pods[2]), "/exit?code=0").0, 200);
                role.insert(pods[1].name_any(), UNREADY_COSTLY);
                role.insert(pods[2].name_any(), READY_COSTLY);
            }
            for (side, pods) in sides.iter().zip(&made) {
                let name = pods[2].name_any();
                let what = format!("{}'s Pod {name} restarted and ready again", side.kind);
                wait(
                    POD_WAIT,
                    || async {
                        let p = side.pods.get(&name).await.unwrap();
                        restarts(&p) == 1 && ready(&p)
                    },
                    &what,
                )
                .await;
            }
            expect_status(&sides, Status::settled(5, 3, generation), "costs set, the restarted Pod ready").await;
            step("deletion costs set");

            // Scale 5→2: the unready Pods go first whatever their cost; of the ready ones, kube-controller-manager
            // 1.20 deletes the one ready last (the costly one), ours the cheaper ones.
            let before = snapshot(&sides).await;
            let kept = scale_and_settle(&cluster, &sides, 2, &mut generation, "scaled 5→2").await;
            assert_eq!(roles(theirs, &role[0]).await, [READY, READY], "{DELETION_COST}");
            assert_eq!(roles(ours, &role[1]).await, [READY, READY_COSTLY], "{DELETION_COST}");
            let gone = |all: &[Pod], kept: &[Pod]| {
                let kept = names(kept);
                names(all).into_iter().filter(|n| !kept.contains(n)).collect::<Vec<_>>()
            };
            expect_events(
                &sides,
                &before,
                &none,
                [deleted(&gone(&made[0], &kept[0])), deleted(&gone(&made[1], &kept[1]))],
                Names::Kept,
            )
            .await;
            step("scaled 5→2");

            // A Pod deleted by hand (a ready one without cost, on both sides): replaced at once.
            let before = snapshot(&sides).await;
            for (side, (pods, role)) in sides.iter().zip(kept.iter().zip(&role)) {
                let victim = pods.iter().find(|p| role[&p.name_any()] == READY).unwrap();
                side.pods.delete(&victim.name_any(), &DeleteParams::default()).await.unwrap();
            }
            let replaced = one_new_pod_each(&sides, &mut role, 2, REPLACEMENT).await;
            expect_status(&sides, Status::settled(2, 2, generation), "a Pod deleted by hand, replaced").await;
            assert_eq!(roles(theirs, &role[0]).await, [READY, REPLACEMENT], "{DELETION_COST}");
            assert_eq!(roles(ours, &role[1]).await, [READY_COSTLY, REPLACEMENT], "{DELETION_COST}");
            expect_events(&sides, &before, &none, [created(&replaced[0]), created(&replaced[1])], Names::Kept).await;
            step("a Pod deleted by hand");

            // A ResourceQuota of two Pods, then scale 2→3: the third is refused, again and again.
            for side in &sides {
                let what = format!("only the two live Pods left in {}", side.namespace);
                wait(POD_WAIT, || async { all_pods(side).await.len() == 2 }, &what).await;
            }
            let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
                "spec": {"hard": {"pods": "2"}}});
            let quotas = |side: &Side| {
                let gvk = GroupVersionKind::gvk("", "v1", "ResourceQuota");
                Api::<DynamicObject>::namespaced_with(client.clone(), side.namespace, &ApiResource::from_gvk(&gvk))
            };
            for side in &sides {
                quotas(side).create(&pp, &serde_json::from_value(quota.clone()).unwrap()).await.unwrap();
            }
            for side in &sides {
                let what = format!("the quota in {} to count its two Pods", side.namespace);
                wait(
                    POD_WAIT,
                    || async { quotas(side).get("pods").await.unwrap().data["status"]["used"]["pods"] == "2" },
                    &what,
                )
                .await;
            }
            let before = snapshot(&sides).await;
            for side in &sides {
                side.scale(&cluster, 3);
            }
            generation += 1;
            let quota_refused = Status::settled(2, 2, generation).failing("FailedCreate", QUOTA_REFUSAL);
            expect_status(&sides, quota_refused.clone(), "the third Pod refused by the quota").await;
            let refusal =
                BTreeSet::from([Ev::new("Warning", "FailedCreate", &format!("Error creating: {QUOTA_REFUSAL}"))]);
            expect_events(&sides, &before, &none, [refusal.clone(), refusal.clone()], Names::Aside).await;
            assert_eq!(roles(theirs, &role[0]).await, [READY, REPLACEMENT]);
            assert_eq!(roles(ours, &role[1]).await, [READY_COSTLY, REPLACEMENT]);
            step("the third Pod refused by a quota");

            // The quota changed while it still refuses (it now wants CPU requests the template has not): the new
            // message is a new event, as client-go's recorder keys events on their message, and ReplicaFailure
            // keeps the first.
            let before = snapshot(&sides).await;
            let cpu = Patch::Merge(json!({"spec": {"hard": {"pods": "2", "requests.cpu": "1"}}}));
            for side in &sides {
                quotas(side).patch("pods", &PatchParams::default(), &cpu).await.unwrap();
            }
            let cpu_refusal =
                BTreeSet::from([Ev::new("Warning", "FailedCreate", &format!("Error creating: {CPU_QUOTA_REFUSAL}"))]);
            expect_events(&sides, &before, &refusal, [cpu_refusal.clone(), cpu_refusal.clone()], Names::Aside).await;
            expect_status(&sides, quota_refused, "the first refusal kept in ReplicaFailure").await;
            step("the quota changed while it refuses");

            // Back to 2: nothing to create, and ReplicaFailure is gone. A refusal retried meanwhile is tolerated.
            let before = snapshot(&sides).await;
            for side in &sides {
                side.scale(&cluster, 2);
            }
            generation += 1;
            expect_status(&sides, Status::settled(2, 2, generation), "back to 2 under the quota").await;
            let refusals = refusal.union(&cpu_refusal).cloned().collect();
            expect_events(&sides, &before, &refusals, [BTreeSet::new(), BTreeSet::new()], Names::Kept).await;
            for side in &sides {
                quotas(side).delete("pods", &DeleteParams::default()).await.unwrap();
            }
            step("back to 2, quota removed");

            // A template whose Pod the API refuses (its PriorityClass does not exist), scaled 2→3.
            let before = snapshot(&sides).await;
            for side in &sides {
                side.patch(
                    &cluster,
                    json!({"spec": {"replicas": 3, "template": {"spec": {"priorityClassName": "missing"}}}}),
                );
            }
            generation += 1;
            let template_refused = Status::settled(2, 2, generation).failing("FailedCreate", TEMPLATE_REFUSAL);
            expect_status(&sides, template_refused, "the template's Pod refused").await;
            let refusal =
                BTreeSet::from([Ev::new("Warning", "FailedCreate", &format!("Error creating: {TEMPLATE_REFUSAL}"))]);
            expect_events(&sides, &before, &none, [refusal.clone(), refusal.clone()], Names::Aside).await;
            step("a template whose Pod the API refuses");

            // The template fixed: the third Pod is made, ReplicaFailure goes.
            let before = snapshot(&sides).await;
            for side in &sides {
                side.patch(&cluster, json!({"spec": {"template": {"spec": {"priorityClassName": null}}}}));
            }
            generation += 1;
            let fixed = one_new_pod_each(&sides, &mut role, 3, FIXED).await;
            expect_status(&sides, Status::settled(3, 3, generation), "the template fixed").await;
            expect_events(&sides, &before, &refusal, [created(&fixed[0]), created(&fixed[1])], Names::Kept).await;
            step("the template fixed");

            // The namespace deleted while scaling 3→5: creates are refused as the namespace terminates, which is
            // neither an event nor a ReplicaFailure; the namespaces go, with everything in them.
            let before = snapshot(&sides).await;
            for side in &sides {
                side.scale(&cluster, 5);
            }
            for side in &sides {
                namespaces.delete(side.namespace, &DeleteParams::default()).await.unwrap();
            }
            #[derive(Debug, Default, PartialEq)]
            struct Terminating {
                replica_failure: bool,
                warnings: BTreeSet<Ev>,
            }
            let mut terminating = [Terminating::default(), Terminating::default()];
            let deadline = Instant::now() + POD_WAIT;
            loop {
                let mut remaining = Vec::new();
                for (side, seen) in sides.iter().zip(&mut terminating) {
                    if namespaces.get_opt(side.namespace).await.unwrap().is_none() {
                        continue;
                    }
                    remaining.push(side.namespace);
                    if let Ok(Some(obj)) = side.workloads.get_opt(NAME).await {
                        seen.replica_failure |= Status::of(&obj).replica_failure.is_some();
                    }
                    let events = events_since(side, &before, &none).await;
                    seen.warnings.extend(events.iter().filter(|e| e.type_ == "Warning").map(Ev::normalised));
                }
                if remaining.is_empty() {
                    break;
                }
                assert!(Instant::now() < deadline, "namespaces {remaining:?} still there: {terminating:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            assert_eq!(terminating, [Terminating::default(), Terminating::default()]);
            step("the namespaces deleted while scaling");
        });
        eprintln!("the whole differential: {:.0}s after the cluster started", started.elapsed().as_secs_f64());
    });
}
