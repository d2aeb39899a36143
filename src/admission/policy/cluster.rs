//! The cluster's ValidatingAdmissionPolicies and bindings (`admissionregistration.k8s.io/v1`, GA in 1.30), watched
//! from the main API server. Before it watches, the source checks that the API is served and that RBAC lets this
//! server list and watch both resources (a watch that cannot succeed would only retry and log); where either
//! fails, it says so once, leaves only manifests in force, keeps the server ready, and checks again every few
//! minutes, so an upgraded control plane or a late RBAC grant is picked up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use super::compiled::{Binding, Origin, Policy};
use super::params::Params;
use super::{hooks, Policies};

const POLICY_GROUP: &str = "admissionregistration.k8s.io";
const RESOURCES: [&str; 2] = ["validatingadmissionpolicies", "validatingadmissionpolicybindings"];

/// How long the source waits before it asks again whether the API is served and allowed.
pub const RECHECK: Duration = Duration::from_secs(180);

/// Why the cluster's policies are not watched, or that they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Watching,
    NotServed,
    Forbidden(String),
    Unreachable(String),
}

impl State {
    fn label(&self) -> &'static str {
        match self {
            State::Watching => "watching",
            State::NotServed => "not_served",
            State::Forbidden(_) => "forbidden",
            State::Unreachable(_) => "unreachable",
        }
    }
}

fn set_gauge(state: &State) {
    let g = &crate::admission::metrics::metrics().policy_source;
    for s in ["watching", "not_served", "forbidden", "unreachable"] {
        let labels = crate::admission::metrics::PolicySourceLabels {
            plugin: "ValidatingAdmissionPolicy".into(),
            state: s.into(),
        };
        g.get_or_create(&labels).set(i64::from(s == state.label()));
    }
}

/// Whether the main API server serves both resources, and this server may list and watch them.
async fn check(client: &kube::Client) -> State {
    match client.list_api_group_resources(&format!("{POLICY_GROUP}/v1")).await {
        Ok(list) => {
            if !RESOURCES.iter().all(|r| list.resources.iter().any(|x| x.name == *r)) {
                return State::NotServed;
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => return State::NotServed,
        Err(e) => return State::Unreachable(e.to_string()),
    }
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    for resource in RESOURCES {
        for verb in ["list", "watch"] {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(POLICY_GROUP.into()),
                        resource: Some(resource.into()),
                        verb: Some(verb.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&Default::default(), &review).await {
                Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
                Ok(_) => return State::Forbidden(format!("{verb} {resource}.{POLICY_GROUP}")),
                Err(e) => return State::Unreachable(e.to_string()),
            }
        }
    }
    State::Watching
}

/// Watches the cluster's policies into `policies` until `stop`; `params` resolves their `paramRef`s.
pub fn watch(client: kube::Client, policies: Policies, params: Params, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let state = check(&client).await;
            set_gauge(&state);
            if last.as_ref() != Some(&state) {
                match &state {
                    State::Watching => tracing::info!("ValidatingAdmissionPolicy: watching the cluster's policies and bindings"),
                    State::NotServed => tracing::warn!(
                        "ValidatingAdmissionPolicy: the main API server does not serve {POLICY_GROUP}/v1 validatingadmissionpolicies \
                         (Kubernetes before 1.30): only policies from staticManifestsDir are enforced; checking again every {}s",
                        RECHECK.as_secs()
                    ),
                    State::Forbidden(what) => tracing::warn!(
                        "ValidatingAdmissionPolicy: RBAC does not allow this server to {what}: only policies from \
                         staticManifestsDir are enforced (deploy/base/rbac.yaml grants it); checking again every {}s",
                        RECHECK.as_secs()
                    ),
                    State::Unreachable(e) => tracing::warn!(error = %e,
                        "ValidatingAdmissionPolicy: cannot ask the main API server about validatingadmissionpolicies; checking again"),
                }
            }
            last = Some(state.clone());
            if state != State::Watching {
                policies.cluster_absent();
                let wait = if matches!(state, State::Unreachable(_)) { Duration::from_secs(10) } else { RECHECK };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
            run(&client, &policies, &params, &stop).await;
            return;
        }
    });
}

/// Keeps `policies` equal to what watches of both resources see, compiling only policies that changed.
async fn run(client: &kube::Client, policies: &Policies, params: &Params, stop: &CancellationToken) {
    let (policy_store, policy_writer) = reflector::store::<ValidatingAdmissionPolicy>();
    let (binding_store, binding_writer) = reflector::store::<ValidatingAdmissionPolicyBinding>();
    let p = watcher::watcher(kube::Api::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(policy_writer)
        .map(|e| e.map(|_| ()));
    let b = watcher::watcher(kube::Api::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(binding_writer)
        .map(|e| e.map(|_| ()));
    let mut events = std::pin::pin!(futures::stream::select(p, b));
    let mut compiled: HashMap<String, Arc<Policy>> = HashMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "ValidatingAdmissionPolicy: watching policies and bindings");
                continue;
            }
            Some(Ok(())) => {}
        }
        // Both first lists in before anything is enforced, so a binding never runs without its policy.
        let ready = |r: Option<Result<(), reflector::store::WriterDropped>>| matches!(r, Some(Ok(())));
        if ready(policy_store.wait_until_ready().now_or_never())
            && ready(binding_store.wait_until_ready().now_or_never())
        {
            rebuild(&policy_store, &binding_store, &mut compiled, policies, params);
        }
    }
}

fn rebuild(
    policy_store: &Store<ValidatingAdmissionPolicy>,
    binding_store: &Store<ValidatingAdmissionPolicyBinding>,
    compiled: &mut HashMap<String, Arc<Policy>>,
    policies: &Policies,
    params: &Params,
) {
    let mut now = HashMap::new();
    for p in policy_store.state() {
        let name = p.metadata.name.clone().unwrap_or_default();
        let version = p.metadata.resource_version.clone().unwrap_or_default();
        let policy = match compiled.get(&name) {
            Some(c) if c.resource_version == version => c.clone(),
            _ => Arc::new(Policy::compile(&p, Origin::Cluster)),
        };
        now.insert(name, policy);
    }
    *compiled = now;
    params.track(compiled.values().filter_map(|p| p.param_kind.clone()));
    let bindings = binding_store.state().iter().map(|b| Arc::new(Binding::compile(b))).collect();
    policies.set_cluster(hooks(compiled.values().cloned().collect(), bindings));
}
