//! The cluster's policies and bindings of a kind (`admissionregistration.k8s.io/v1`: ValidatingAdmissionPolicies GA
//! in 1.30, MutatingAdmissionPolicies in 1.36), watched from the main API server. Before it watches, the source checks that the API is served and that RBAC lets this
//! server list and watch both resources (a watch that cannot succeed would only retry and log); where either
//! fails, it says so once, leaves only manifests in force, keeps the server ready, and checks again every few
//! minutes, so an upgraded control plane or a late RBAC grant is picked up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use kube::Resource;

use super::params::Params;
use super::{hooks, Policy, PolicyKind, PolicySet};

const POLICY_GROUP: &str = "admissionregistration.k8s.io";

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

fn set_gauge(plugin: &str, state: &State) {
    let g = &crate::admission::metrics::metrics().policy_source;
    for s in ["watching", "not_served", "forbidden", "unreachable"] {
        let labels = crate::admission::metrics::PolicySourceLabels { plugin: plugin.into(), state: s.into() };
        g.get_or_create(&labels).set(i64::from(s == state.label()));
    }
}

/// Whether the main API server serves both resources, and this server may list and watch them.
async fn check<K: PolicyKind>(client: &kube::Client) -> State {
    let resources = [K::POLICY.1, K::BINDING.1];
    match client.list_api_group_resources(&format!("{POLICY_GROUP}/v1")).await {
        Ok(list) => {
            if !resources.iter().all(|r| list.resources.iter().any(|x| x.name == *r)) {
                return State::NotServed;
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => return State::NotServed,
        Err(e) => return State::Unreachable(e.to_string()),
    }
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    for resource in resources {
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
pub fn watch<K: PolicyKind>(client: kube::Client, policies: PolicySet<K>, params: Params, stop: CancellationToken) {
    let (plugin, resource) = (K::PLUGIN, K::POLICY.1);
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let state = check::<K>(&client).await;
            set_gauge(plugin, &state);
            if last.as_ref() != Some(&state) {
                match &state {
                    State::Watching => tracing::info!("{plugin}: watching the cluster's policies and bindings"),
                    State::NotServed => tracing::warn!(
                        "{plugin}: the main API server does not serve {POLICY_GROUP}/v1 {resource} \
                         (Kubernetes before {}): only policies from staticManifestsDir are enforced; checking again every {}s",
                        K::SINCE,
                        RECHECK.as_secs()
                    ),
                    State::Forbidden(what) => tracing::warn!(
                        "{plugin}: RBAC does not allow this server to {what}: only policies from \
                         staticManifestsDir are enforced (deploy/base/rbac.yaml grants it); checking again every {}s",
                        RECHECK.as_secs()
                    ),
                    State::Unreachable(e) => tracing::warn!(error = %e,
                        "{plugin}: cannot ask the main API server about {resource}; checking again"),
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
            run::<K>(&client, &policies, &params, &stop).await;
            return;
        }
    });
}

/// Keeps `policies` equal to what watches of both resources see, compiling only policies that changed.
async fn run<K: PolicyKind>(client: &kube::Client, policies: &PolicySet<K>, params: &Params, stop: &CancellationToken) {
    let (policy_store, policy_writer) = reflector::store::<K::Policy>();
    let (binding_store, binding_writer) = reflector::store::<K::Binding>();
    let p = watcher::watcher(kube::Api::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(policy_writer)
        .map(|e| e.map(|_| ()));
    let b = watcher::watcher(kube::Api::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(binding_writer)
        .map(|e| e.map(|_| ()));
    let mut events = std::pin::pin!(futures::stream::select(p, b));
    let mut compiled: HashMap<String, Arc<Policy<K::Body>>> = HashMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "{}: watching policies and bindings", K::PLUGIN);
                continue;
            }
            Some(Ok(())) => {}
        }
        // Both first lists in before anything is enforced, so a binding never runs without its policy.
        let ready = |r: Option<Result<(), reflector::store::WriterDropped>>| matches!(r, Some(Ok(())));
        if ready(policy_store.wait_until_ready().now_or_never())
            && ready(binding_store.wait_until_ready().now_or_never())
        {
            rebuild::<K>(&policy_store, &binding_store, &mut compiled, policies, params);
        }
    }
}

fn rebuild<K: PolicyKind>(
    policy_store: &Store<K::Policy>,
    binding_store: &Store<K::Binding>,
    compiled: &mut HashMap<String, Arc<Policy<K::Body>>>,
    policies: &PolicySet<K>,
    params: &Params,
) {
    let mut now = HashMap::new();
    for p in policy_store.state() {
        let name = p.meta().name.clone().unwrap_or_default();
        let version = p.meta().resource_version.clone().unwrap_or_default();
        let policy = match compiled.get(&name) {
            Some(c) if c.resource_version == version => c.clone(),
            _ => Arc::new(K::compile(&p, super::Origin::Cluster)),
        };
        now.insert(name, policy);
    }
    *compiled = now;
    params.track(compiled.values().filter_map(|p| p.param_kind.clone()));
    let bindings = binding_store.state().iter().map(|b| Arc::new(K::binding(b))).collect();
    policies.set_cluster(hooks::<K>(compiled.values().cloned().collect(), bindings));
}
