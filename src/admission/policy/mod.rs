//! Admission policies, as k8s.io/apiserver's `admission/plugin/policy/generic` runs them for its own resources:
//! one framework for every kind ([`PolicyKind`]: [`validating`] and [`mutating`]). A kind names its API types and
//! compiles what its spec adds; the framework gives it the rest: policies and bindings from `staticManifestsDir`
//! ([`manifests`]) and from the cluster ([`cluster`]), paired ([`hooks`]) and kept in force ([`PolicySet`]); each
//! policy's matching ([`matching`]), params ([`params`]), the request in the version a policy matched, and the
//! namespace object.
//!
//! Order: manifests first, then policies by name, and a policy's bindings by name (kube's order is a map's,
//! unspecified).

pub mod cluster;
mod compiled;
pub mod manifests;
mod matching;
pub mod mutating;
mod params;
pub mod validating;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

pub use compiled::{Binding, Body, Declared, Origin, Policy, Spec};
pub use mutating::{MutatingAdmissionPolicyPlugin, MutatingKind, MutatingPolicies};
pub use params::Params;
pub use validating::{
    ValidatingAdmissionPolicyPlugin, ValidatingKind, ValidatingPolicies, VALIDATION_FAILURE_ANNOTATION,
};

use super::activation::{self, Invocation, Reads};
use super::{Attributes, Error, Namespaces, READY_WAIT};

/// A kind of admission policy: its API types, and how its policies and bindings compile and are checked.
pub trait PolicyKind: std::fmt::Debug + Send + Sync + 'static {
    /// The plugin that runs it (`--enable-admission-plugins`, log lines, metrics).
    const PLUGIN: &'static str;
    /// The policy's and the binding's kind and resource, in `admissionregistration.k8s.io/v1`.
    const POLICY: (&'static str, &'static str);
    const BINDING: (&'static str, &'static str);
    /// The Kubernetes release that serves its API by default.
    const SINCE: &'static str;

    type Policy: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static;
    type Binding: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static;
    type Body: Body;

    fn compile(p: &Self::Policy, origin: Origin) -> Policy<Self::Body>;
    fn binding(b: &Self::Binding) -> Binding;

    /// kube's REST validation of a policy, for what this server checks of it (compile errors aside).
    fn check_policy(p: &Self::Policy) -> Vec<String>;
    /// kube's REST validation of a binding, and the manifest rules for one.
    fn check_binding(b: &Self::Binding) -> Vec<String>;
}

/// A policy with the bindings that name it.
#[derive(Debug)]
pub struct Hook<K: PolicyKind> {
    pub policy: Arc<Policy<K::Body>>,
    pub bindings: Vec<Arc<Binding>>,
}

impl<K: PolicyKind> Clone for Hook<K> {
    fn clone(&self) -> Self {
        Self { policy: self.policy.clone(), bindings: self.bindings.clone() }
    }
}

/// Pairs policies with their bindings: policies by name, each binding under the policy it names; a policy
/// without bindings, or a binding whose policy is missing, is left out (kube evaluates neither).
pub fn hooks<K: PolicyKind>(policies: Vec<Arc<Policy<K::Body>>>, bindings: Vec<Arc<Binding>>) -> Vec<Hook<K>> {
    let mut by_policy: BTreeMap<&str, Vec<Arc<Binding>>> = BTreeMap::new();
    for b in &bindings {
        by_policy.entry(b.policy_name.as_str()).or_default().push(b.clone());
    }
    let mut policies = policies;
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    policies
        .into_iter()
        .filter_map(|policy| {
            let mut bindings = by_policy.get(policy.name.as_str())?.clone();
            bindings.sort_by(|a, b| a.name.cmp(&b.name));
            Some(Hook { policy, bindings })
        })
        .collect()
}

/// One source's policies, shared by the requests that read them.
type Hooks<K> = Arc<[Hook<K>]>;

/// The policies of a kind in force: from manifests and from the cluster, each replaced whole when its source
/// changes.
pub struct PolicySet<K: PolicyKind> {
    manifest: Arc<RwLock<Hooks<K>>>,
    cluster: Arc<RwLock<Hooks<K>>>,
    /// Whether the cluster's first lists are in (or the cluster does not serve the API).
    synced: watch::Sender<bool>,
}

impl<K: PolicyKind> Clone for PolicySet<K> {
    fn clone(&self) -> Self {
        Self { manifest: self.manifest.clone(), cluster: self.cluster.clone(), synced: self.synced.clone() }
    }
}

impl<K: PolicyKind> std::fmt::Debug for PolicySet<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, c) = self.current();
        f.debug_struct(K::PLUGIN).field("manifest", &m.len()).field("cluster", &c.len()).finish()
    }
}

impl<K: PolicyKind> Default for PolicySet<K> {
    fn default() -> Self {
        Self {
            manifest: Arc::new(RwLock::new(Arc::from(Vec::new()))),
            cluster: Arc::new(RwLock::new(Arc::from(Vec::new()))),
            synced: watch::Sender::new(false),
        }
    }
}

impl<K: PolicyKind> PolicySet<K> {
    /// These policies and bindings as the cluster's, and no source behind them.
    pub fn fixed(policies: &[K::Policy], bindings: &[K::Binding]) -> Self {
        let this = Self::default();
        let p = policies.iter().map(|p| Arc::new(K::compile(p, Origin::Cluster))).collect();
        let b = bindings.iter().map(|b| Arc::new(K::binding(b))).collect();
        this.set_cluster(hooks::<K>(p, b));
        this
    }

    pub fn set_manifests(&self, hooks: Vec<Hook<K>>) {
        *self.manifest.write() = Arc::from(hooks);
    }

    pub fn set_cluster(&self, hooks: Vec<Hook<K>>) {
        *self.cluster.write() = Arc::from(hooks);
        self.synced.send_replace(true);
    }

    /// The cluster's policies are not read (not served, or no main API server): only manifests count.
    pub fn cluster_absent(&self) {
        self.set_cluster(Vec::new());
    }

    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn current(&self) -> (Hooks<K>, Hooks<K>) {
        (self.manifest.read().clone(), self.cluster.read().clone())
    }

    fn is_empty(&self) -> bool {
        self.manifest.read().is_empty() && self.cluster.read().is_empty()
    }

    /// Whether a policy's rules could select the request: policies for other resources cost a write nothing.
    fn may_select(&self, a: &Attributes) -> bool {
        if !self.has_synced() {
            return true;
        }
        let (manifest, cluster) = self.current();
        manifest.iter().chain(cluster.iter()).any(|h| h.policy.matcher.as_ref().is_none_or(|m| m.may_select(a)))
    }

    async fn wait_for_ready(&self) -> bool {
        let mut rx = self.synced.subscribe();
        let ready = matches!(tokio::time::timeout(READY_WAIT, rx.wait_for(|s| *s)).await, Ok(Ok(_)));
        ready
    }

    /// The policies a request of `a` is dispatched to, manifests' then the cluster's, once the sources and the
    /// namespaces have their first lists; None when there are none, without waiting.
    async fn in_force(
        &self,
        namespaces: &Namespaces,
        a: &Attributes,
        object: Option<&Value>,
    ) -> Result<Option<(Hooks<K>, Hooks<K>)>, Error> {
        if self.has_synced() && self.is_empty() {
            return Ok(None);
        }
        if !self.wait_for_ready().await || !namespaces.wait_for_ready().await {
            let name = super::namespace::resource_name(a, object);
            return Err(Error::NotReady { resource: a.group_resource(), name });
        }
        Ok(Some(self.current()))
    }
}

/// The request in one version, converted once and shared by every policy that selects it there; its `request`
/// built the first time a policy reads it. Each policy is given only what it reads of them.
pub(crate) struct Versioned<'a> {
    pub(crate) invocation: Invocation<'a>,
    pub(crate) request: Option<Value>,
}

impl<'a> Versioned<'a> {
    /// The request in `version`, from `cache` or converted now.
    pub(crate) fn of<'v>(
        cache: &'v mut Vec<Versioned<'a>>,
        a: &'a Attributes,
        (version, reads): (&str, &Reads),
        object: Option<&'a Value>,
        old: Option<&'a Value>,
    ) -> Result<&'v Versioned<'a>, Error> {
        let i = match cache.iter().position(|v| v.invocation.attributes.resource.version == version) {
            Some(i) => i,
            None => {
                cache.push(Versioned { invocation: Invocation::new(a, version, object, old)?, request: None });
                cache.len() - 1
            }
        };
        let v = &mut cache[i];
        if reads.request.reads() && v.request.is_none() {
            v.request = Some(Value::Object(activation::request_fields(&v.invocation.attributes, a)));
        }
        Ok(&cache[i])
    }
}

/// `namespaceObject`: the request's namespace as `CreateNamespaceObject` copies it; null when cluster-scoped.
pub(crate) async fn namespace_object(namespaces: &Namespaces, a: &Attributes) -> Result<Value, Error> {
    if a.namespace.is_empty() {
        return Ok(Value::Null);
    }
    let ns = namespaces.get(&a.namespace).await?;
    let mut v = serde_json::to_value(&*ns).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
            meta.remove("ownerReferences");
        }
    }
    Ok(v)
}

/// Whether `binding`'s matchResources select the request (a binding without them selects all its policy does);
/// an error is a configuration error of the binding.
pub(crate) async fn binding_selects(
    binding: &Binding,
    namespaces: &Namespaces,
    (a, object, old): (&Attributes, Option<&Value>, Option<&Value>),
) -> Result<bool, String> {
    match &binding.matcher {
        None => Ok(true),
        Some(m) => m.matches(a, object, old, namespaces).await.map(|v| v.is_some()),
    }
}

/// The params one binding evaluates its policy with, one evaluation each: none without a `paramKind`, null
/// without a `paramRef`, else those the ref selects. Empty when the binding does not apply (no param and
/// `parameterNotFoundAction: Allow`); an error is a configuration error of the binding.
pub(crate) async fn binding_params<B>(
    params: &Params,
    policy: &Policy<B>,
    binding: &Binding,
    a: &Attributes,
) -> Result<Vec<Option<crate::cel::Value>>, String> {
    Ok(match (&policy.param_kind, &binding.param_ref) {
        (None, _) => vec![None],
        (Some(_), None) => vec![Some(crate::cel::Value::Null)],
        (Some(kind), Some(r)) => params.collect(kind, r, &a.namespace).await?.into_iter().map(Some).collect(),
    })
}
