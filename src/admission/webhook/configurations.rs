//! The webhooks in force: the cluster's configurations as a watch last listed them, after those of manifests.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hooks::{mutating_hooks_of, validating_hooks_of};
use super::Hook;
use crate::admission::READY_WAIT;

/// One kind's webhooks as last listed, and whether the first list is in.
#[derive(Clone)]
pub(super) struct HookList {
    hooks: Arc<RwLock<Arc<[Arc<Hook>]>>>,
    synced: watch::Sender<bool>,
}

impl HookList {
    fn new() -> Self {
        Self { hooks: Arc::new(RwLock::new(Arc::from(Vec::new()))), synced: watch::Sender::new(false) }
    }

    fn set(&self, hooks: Vec<Arc<Hook>>) {
        *self.hooks.write() = Arc::from(hooks);
        self.synced.send_replace(true);
    }

    fn get(&self) -> Arc<[Arc<Hook>]> {
        self.hooks.read().clone()
    }

    pub(super) async fn wait_for_ready(&self) -> bool {
        let mut rx = self.synced.subscribe();
        let ready = matches!(tokio::time::timeout(READY_WAIT, rx.wait_for(|s| *s)).await, Ok(Ok(_)));
        ready
    }
}

/// Webhooks from `staticManifestsDir`: called before the cluster's, in force from the first request.
#[derive(Clone, Default)]
pub struct StaticWebhooks {
    mutating: Arc<RwLock<Arc<[Arc<Hook>]>>>,
    validating: Arc<RwLock<Arc<[Arc<Hook>]>>>,
}

impl std::fmt::Debug for StaticWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticWebhooks")
            .field("mutating", &self.mutating.read().len())
            .field("validating", &self.validating.read().len())
            .finish()
    }
}

impl StaticWebhooks {
    pub(crate) fn set_mutating(&self, hooks: Vec<Arc<Hook>>) {
        *self.mutating.write() = Arc::from(hooks);
    }

    pub(crate) fn set_validating(&self, hooks: Vec<Arc<Hook>>) {
        *self.validating.write() = Arc::from(hooks);
    }
}

/// The cluster's Mutating- and ValidatingWebhookConfigurations, after those of manifests.
#[derive(Clone)]
pub struct WebhookConfigurations {
    pub(super) mutating: HookList,
    pub(super) validating: HookList,
    statics: StaticWebhooks,
}

impl WebhookConfigurations {
    /// Watches both kinds until `stop`.
    pub fn watch(client: kube::Client, stop: CancellationToken) -> Self {
        let this = Self { mutating: HookList::new(), validating: HookList::new(), statics: StaticWebhooks::default() };
        spawn_watch(kube::Api::all(client.clone()), this.mutating.clone(), stop.clone(), |s| {
            mutating_hooks_of(s.state().iter().map(|c| &**c))
        });
        spawn_watch(kube::Api::all(client), this.validating.clone(), stop, |s| {
            validating_hooks_of(s.state().iter().map(|c| &**c))
        });
        this
    }

    /// These configurations and no others, with no main API server behind them.
    pub fn fixed(mutating: &[MutatingWebhookConfiguration], validating: &[ValidatingWebhookConfiguration]) -> Self {
        let this = Self { mutating: HookList::new(), validating: HookList::new(), statics: StaticWebhooks::default() };
        this.mutating.set(mutating_hooks_of(mutating));
        this.validating.set(validating_hooks_of(validating));
        this
    }

    pub fn has_synced(&self) -> bool {
        *self.mutating.synced.borrow() && *self.validating.synced.borrow()
    }

    /// These configurations with the webhooks of manifests before them.
    pub fn with_statics(mut self, statics: StaticWebhooks) -> Self {
        self.statics = statics;
        self
    }

    /// Whether any webhook may be called: there is one, or the first lists are still to come.
    pub fn may_call(&self) -> bool {
        !self.has_synced()
            || !self.mutating.get().is_empty()
            || !self.validating.get().is_empty()
            || !self.statics.mutating.read().is_empty()
            || !self.statics.validating.read().is_empty()
    }

    pub(super) fn mutating_hooks(&self) -> Arc<[Arc<Hook>]> {
        with_statics(&self.statics.mutating, self.mutating.get())
    }

    pub(super) fn validating_hooks(&self) -> Arc<[Arc<Hook>]> {
        with_statics(&self.statics.validating, self.validating.get())
    }
}

/// The manifests' webhooks, then the cluster's; without manifests, the cluster's list as it is (no copy per
/// request).
fn with_statics(statics: &RwLock<Arc<[Arc<Hook>]>>, cluster: Arc<[Arc<Hook>]>) -> Arc<[Arc<Hook>]> {
    let statics = statics.read().clone();
    if statics.is_empty() {
        return cluster;
    }
    statics.iter().chain(cluster.iter()).cloned().collect()
}

/// Keeps `list` equal to what a watch of `api` sees, rebuilt on every change.
fn spawn_watch<K>(
    api: kube::Api<K>,
    list: HookList,
    stop: CancellationToken,
    build: impl Fn(&Store<K>) -> Vec<Arc<Hook>> + Send + 'static,
) where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
    let kind = K::kind(&()).into_owned();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut ready = false;
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                Ok(watcher::Event::InitDone) => ready = true,
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, kind, "admission: watching webhook configurations");
                    continue;
                }
            }
            if ready {
                list.set(build(&store));
            }
        }
    });
}
