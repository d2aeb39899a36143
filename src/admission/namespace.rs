//! Namespaces as the main API server has them (a watch, with a live GET on a miss), and the NamespaceLifecycle
//! plugin over them (k8s.io/apiserver `plugin/namespace/lifecycle`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::cache::Cache;
use super::{Attributes, Error, Handler, Mutating, Outcome, PluginContext, Reinvocation};
use crate::api::Operation;

/// How long a create into a namespace the cache does not have waits for the watch before the live GET, as the
/// plugin's `missingNamespaceWait`: a namespace made a moment ago usually arrives by then.
const MISSING_NAMESPACE_WAIT: Duration = Duration::from_millis(50);

/// The main API server's namespaces: a watched cache, and a live GET for names it does not have.
#[derive(Clone)]
pub struct Namespaces {
    cache: Cache<Namespace>,
    client: Option<kube::Client>,
}

impl Namespaces {
    /// Watches every namespace until `stop`.
    pub fn watch(client: kube::Client, stop: CancellationToken) -> Self {
        let cache = Cache::watch(kube::Api::all(client.clone()), "namespaces", stop);
        Self { cache, client: Some(client) }
    }

    /// A cache holding `namespaces` and nothing else, with no main API server behind it.
    pub fn fixed(namespaces: Vec<Namespace>) -> Self {
        Self { cache: Cache::fixed(namespaces), client: None }
    }

    /// Whether the first list is in.
    pub fn has_synced(&self) -> bool {
        self.cache.has_synced()
    }

    /// Waits up to [`READY_WAIT`](super::READY_WAIT) for the first list.
    pub(crate) async fn wait_for_ready(&self) -> bool {
        self.cache.wait_for_ready().await
    }

    /// The namespace from the cache.
    pub(crate) fn cached(&self, name: &str) -> Option<Arc<Namespace>> {
        self.cache.store.get(&ObjectRef::new(name))
    }

    /// The namespace from the main API server itself: None when it does not exist.
    pub(crate) async fn live(&self, name: &str) -> Result<Option<Namespace>, Error> {
        let Some(client) = &self.client else { return Ok(None) };
        let api: kube::Api<Namespace> = kube::Api::all(client.clone());
        api.get_opt(name).await.map_err(|e| Error::NamespaceLookup { namespace: name.to_owned(), source: Box::new(e) })
    }

    /// The namespace from the cache, else from the main API server; NotFound if neither has it.
    pub(crate) async fn get(&self, name: &str) -> Result<Arc<Namespace>, Error> {
        if let Some(ns) = self.cached(name) {
            return Ok(ns);
        }
        match self.live(name).await? {
            Some(ns) => Ok(Arc::new(ns)),
            None => Err(Error::NamespaceNotFound { namespace: name.to_owned() }),
        }
    }
}

/// NamespaceLifecycle: no write into a namespace that does not exist, no create in one being deleted. Deletes
/// always pass, and so do updates (status writes included) in a terminating namespace, so the namespace
/// controller can finish.
pub struct NamespaceLifecycle {
    namespaces: Namespaces,
}

impl NamespaceLifecycle {
    pub const NAME: &'static str = "NamespaceLifecycle";

    pub fn new(namespaces: Namespaces) -> Self {
        Self { namespaces }
    }

    pub(crate) fn factory(ctx: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
        Ok(Some(Arc::new(Self::new(ctx.namespaces().clone()))))
    }
}

/// The name errors give, as `admission.extractResourceName`: the request's, else the object's name or
/// generateName, else "Unknown".
pub(crate) fn resource_name(a: &Attributes, object: Option<&Value>) -> String {
    if !a.name.is_empty() {
        return a.name.clone();
    }
    let meta = object.map(|o| &o["metadata"]);
    let field = |f: &str| meta.and_then(|m| m[f].as_str()).filter(|s| !s.is_empty());
    field("name").or_else(|| field("generateName")).unwrap_or("Unknown").to_owned()
}

impl Handler for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// Deletes always pass; what it checks of them in kube-apiserver (a namespace's own deletion, the
    /// immortal namespaces) concerns namespaces, which this server does not serve.
    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }

    fn mutating(&self) -> Option<&dyn Mutating> {
        Some(self)
    }

    fn has_synced(&self) -> bool {
        self.namespaces.has_synced()
    }
}

#[async_trait]
impl Mutating for NamespaceLifecycle {
    async fn admit(
        &self,
        a: &Attributes,
        object: Option<&mut Value>,
        _old: Option<&Value>,
        _out: &mut Outcome,
        _reinvocation: &mut Reinvocation,
    ) -> Result<(), Error> {
        if a.namespace.is_empty() {
            return Ok(());
        }
        let object = object.map(|o| &*o);
        if !self.namespaces.wait_for_ready().await {
            return Err(Error::NotReady { resource: a.group_resource(), name: resource_name(a, object) });
        }
        let mut namespace = self.namespaces.cached(&a.namespace);
        if namespace.is_none() && a.operation == Operation::Create {
            tokio::time::sleep(MISSING_NAMESPACE_WAIT).await;
            namespace = self.namespaces.cached(&a.namespace);
        }
        let namespace = match namespace {
            Some(ns) => ns,
            None => self.namespaces.get(&a.namespace).await?,
        };
        let terminating = namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
        if a.operation == Operation::Create && terminating {
            return Err(Error::NamespaceTerminating {
                namespace: a.namespace.clone(),
                resource: a.group_resource(),
                name: resource_name(a, object),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Subresource, UserInfo};
    use k8s_openapi::api::core::v1::NamespaceStatus;
    use kube::api::ObjectMeta;

    fn namespace(name: &str, phase: &str) -> Namespace {
        Namespace {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NamespaceStatus { phase: Some(phase.into()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn attrs(op: Operation, sub: Subresource, ns: &str, name: &str) -> Attributes {
        crate::admission::testing::attributes(op, sub, ns, name, UserInfo::named("jane", vec![]))
    }

    /// As the chain calls it: only for the operations it handles.
    async fn admit(l: &NamespaceLifecycle, a: &Attributes, object: Option<Value>) -> Result<(), Error> {
        if !l.handles(a.operation) {
            return Ok(());
        }
        let mut object = object;
        l.admit(a, object.as_mut(), None, &mut Outcome::default(), &mut Reinvocation::default()).await
    }

    /// A cache whose first list never arrives: requests wait READY_WAIT, then are refused as kube-apiserver
    /// refuses them. (Paused clock: the wait passes at once.)
    #[tokio::test(start_paused = true)]
    async fn before_the_first_list_requests_are_refused_as_not_ready() {
        let namespaces = Namespaces { cache: Cache::never_synced(), client: None };
        assert!(!namespaces.has_synced());
        let l = NamespaceLifecycle::new(namespaces);
        let e = admit(
            &l,
            &attrs(Operation::Create, Subresource::Main, "live", ""),
            Some(serde_json::json!({"metadata": {"name": "web"}})),
        )
        .await
        .unwrap_err();
        assert!(matches!(&e, Error::NotReady { name, .. } if name == "web"), "{e:?}");
        assert_eq!(e.to_string(), "podsets.demo.k8s.io \"web\" is forbidden: not yet ready to handle request");
        admit(&l, &attrs(Operation::Delete, Subresource::Main, "live", "web"), None).await.unwrap();
    }

    #[tokio::test]
    async fn writes_follow_the_namespace_lifecycle() {
        let l = NamespaceLifecycle::new(Namespaces::fixed(vec![
            namespace("live", "Active"),
            namespace("dying", "Terminating"),
        ]));
        let ps = serde_json::json!({"metadata": {"generateName": "web-"}});
        for op in [Operation::Create, Operation::Update, Operation::Delete] {
            admit(&l, &attrs(op, Subresource::Main, "live", "web"), Some(ps.clone())).await.unwrap();
        }

        let e = admit(&l, &attrs(Operation::Create, Subresource::Main, "dying", ""), Some(ps.clone())).await;
        let e = e.unwrap_err();
        assert!(matches!(&e, Error::NamespaceTerminating { name, .. } if name == "web-"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "podsets.demo.k8s.io \"web-\" is forbidden: unable to create new content in namespace dying because it is being terminated"
        );
        for (op, sub) in [
            (Operation::Update, Subresource::Main),
            (Operation::Update, Subresource::Status),
            (Operation::Update, Subresource::Scale),
            (Operation::Delete, Subresource::Main),
        ] {
            admit(&l, &attrs(op, sub, "dying", "web"), None).await.unwrap_or_else(|e| panic!("{op:?} {sub:?}: {e}"));
        }

        for op in [Operation::Create, Operation::Update] {
            let e = admit(&l, &attrs(op, Subresource::Status, "gone", "web"), Some(ps.clone())).await.unwrap_err();
            assert!(matches!(&e, Error::NamespaceNotFound { namespace } if namespace == "gone"), "{op:?}: {e:?}");
        }
        admit(&l, &attrs(Operation::Delete, Subresource::Main, "gone", "web"), None).await.unwrap();
    }
}
