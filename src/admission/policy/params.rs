//! Params of the cluster's policies (`paramKind`, a binding's `paramRef`), as k8s.io/apiserver's
//! `CollectParams` finds them: one cache of the main API server's objects per `paramKind`, started when a policy
//! first names it; a binding's `paramRef` picks by name or selector, in its namespace or the request's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{ParamKind, ParamRef};
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::api::selector::Selector;
use crate::cel::{self, value};

/// How long a request waits for a param kind's first list (`CollectParams` waits a second).
const SYNC_WAIT: Duration = Duration::from_secs(1);

/// A param kind's resource and objects, once discovered.
struct Kind {
    namespaced: bool,
    store: Store<DynamicObject>,
}

enum Slot {
    Discovering,
    Known(Arc<Kind>),
    Unknown(String),
}

/// The param caches, shared by every policy.
#[derive(Clone, Default)]
pub struct Params {
    inner: Option<Arc<Inner>>,
}

/// A paramKind as `(apiVersion, kind)`.
type KindKey = (String, String);

struct Inner {
    client: kube::Client,
    stop: CancellationToken,
    kinds: Mutex<BTreeMap<KindKey, Arc<Mutex<Slot>>>>,
}

/// kube's rendering of a ParamKind in its messages (`&ParamKind{APIVersion:v1,Kind:ConfigMap,}`).
pub(crate) fn describe(kind: &ParamKind) -> String {
    format!(
        "&ParamKind{{APIVersion:{},Kind:{},}}",
        kind.api_version.as_deref().unwrap_or_default(),
        kind.kind.as_deref().unwrap_or_default()
    )
}

fn key(kind: &ParamKind) -> KindKey {
    (kind.api_version.clone().unwrap_or_default(), kind.kind.clone().unwrap_or_default())
}

impl Params {
    /// Caches of the main API server's objects, started on demand until `stop`.
    pub fn new(client: kube::Client, stop: CancellationToken) -> Self {
        Self { inner: Some(Arc::new(Inner { client, stop, kinds: Mutex::new(BTreeMap::new()) })) }
    }

    /// Starts a cache for every kind in `kinds` not yet cached.
    pub(crate) fn track(&self, kinds: impl Iterator<Item = ParamKind>) {
        let Some(inner) = &self.inner else { return };
        for kind in kinds {
            let k = key(&kind);
            let mut all = inner.kinds.lock();
            if all.contains_key(&k) {
                continue;
            }
            let slot = Arc::new(Mutex::new(Slot::Discovering));
            all.insert(k.clone(), slot.clone());
            drop(all);
            let (client, stop) = (inner.client.clone(), inner.stop.clone());
            tokio::spawn(async move { discover_and_watch(client, k, slot, stop).await });
        }
    }

    /// The params of a binding for a request in `namespace`: the objects its `paramRef` picks (kube's
    /// `CollectParams`); an error is worded for `failed to configure binding: ...`.
    pub(crate) async fn collect(
        &self,
        kind: &ParamKind,
        r: &ParamRef,
        namespace: &str,
    ) -> Result<Vec<cel::Value>, String> {
        let not_known = || format!("paramKind kind `{}` not known", describe(kind));
        let Some(inner) = &self.inner else { return Err(not_known()) };
        let slot = inner.kinds.lock().get(&key(kind)).cloned().ok_or_else(not_known)?;
        let started = tokio::time::Instant::now();
        let k = loop {
            match &*slot.lock() {
                Slot::Known(k) => break Some(k.clone()),
                Slot::Unknown(e) => return Err(e.clone()),
                Slot::Discovering => {}
            }
            if started.elapsed() >= SYNC_WAIT {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let not_synced = || format!("paramKind kind `{}` not yet synced to use for admission", describe(kind));
        let k = k.ok_or_else(not_synced)?;
        let ns = match (k.namespaced, r.namespace.as_deref().filter(|n| !n.is_empty())) {
            (true, Some(n)) => n.to_owned(),
            (true, None) if namespace.is_empty() => {
                return Err(
                    "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".into()
                )
            }
            (true, None) => namespace.to_owned(),
            (false, Some(_)) => {
                return Err("paramRef.namespace must not be provided for a cluster-scoped `paramKind`".into())
            }
            (false, None) => String::new(),
        };
        let remaining = SYNC_WAIT.saturating_sub(started.elapsed());
        if tokio::time::timeout(remaining, k.store.wait_until_ready()).await.is_err() {
            return Err(not_synced());
        }
        let found: Vec<Arc<DynamicObject>> = match (r.name.as_deref().filter(|n| !n.is_empty()), &r.selector) {
            (Some(_), Some(_)) => return Err("paramRef.name and paramRef.selector are mutually exclusive".into()),
            (Some(name), None) => k
                .store
                .state()
                .into_iter()
                .filter(|o| {
                    o.metadata.name.as_deref() == Some(name) && o.metadata.namespace.as_deref().unwrap_or("") == ns
                })
                .collect(),
            (None, Some(selector)) => {
                let s = Selector::from_label_selector(selector)?;
                let empty = BTreeMap::new();
                let mut v: Vec<_> = k
                    .store
                    .state()
                    .into_iter()
                    .filter(|o| o.metadata.namespace.as_deref().unwrap_or("") == ns || !k.namespaced)
                    .filter(|o| s.matches(o.metadata.labels.as_ref().unwrap_or(&empty)))
                    .collect();
                v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                v
            }
            (None, None) => return Err("one of name or selector must be provided".into()),
        };
        if found.is_empty() && r.parameter_not_found_action.as_deref() == Some("Deny") {
            return Err("no params found for policy binding with `Deny` parameterNotFoundAction".into());
        }
        Ok(found
            .iter()
            .map(|o| {
                // Listed objects carry no type; CEL sees the paramKind's.
                let mut v = serde_json::to_value(&**o).unwrap_or_default();
                v["apiVersion"] = kind.api_version.clone().unwrap_or_default().into();
                v["kind"] = kind.kind.clone().unwrap_or_default().into();
                value::from_json(&v)
            })
            .collect())
    }
}

async fn discover_and_watch(
    client: kube::Client,
    (api_version, kind): KindKey,
    slot: Arc<Mutex<Slot>>,
    stop: CancellationToken,
) {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), api_version.clone()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, &kind);
    let (ar, caps): (ApiResource, _) = match kube::discovery::pinned_kind(&client, &gvk).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, api_version, kind, "ValidatingAdmissionPolicy: failed to find resource referenced by paramKind");
            *slot.lock() = Slot::Unknown(format!(
                "failed to find resource referenced by paramKind: '{group}/{version}, Kind={kind}'"
            ));
            return;
        }
    };
    let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
    let writer = reflector::store::Writer::new(ar.clone());
    let store = writer.as_reader();
    *slot.lock() = Slot::Known(Arc::new(Kind { namespaced, store }));
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client, &ar);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
    let mut stream = std::pin::pin!(stream);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            next = stream.next() => match next {
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, kind, "ValidatingAdmissionPolicy: watching params"),
                None => return,
            },
        }
    }
}
