//! ResourceQuota, as k8s.io/apiserver's `plugin/resourcequota` runs it for an object-count resource
//! (`count/podsets.demo.k8s.io`): a validating plugin that checks each create against the namespace's quotas and
//! charges it to their `status.used` (`resourcequotas/status`, with the quota's resourceVersion) before the object
//! is stored. kube-apiserver runs this plugin only for its own types; an aggregated server runs it itself, as
//! kube-controller-manager only recounts on deletes and on its resync.
//!
//! As upstream: creates to one namespace are checked in batches, one batch at a time, each charge counted
//! against the next; a failed status write is retried (three times) against the quotas read again (live, where
//! upstream reads its cache, so that replicas racing on one quota converge instead of losing on stale copies); a
//! dry run is checked and charges nothing; a create refused later in the chain keeps its charge for
//! kube-controller-manager to correct; a create not decided within 10 s is answered "resource quota evaluation
//! timed out".

mod access;
mod check;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::oneshot;

pub use access::Quotas;

use super::namespace::resource_name;
use super::{Attributes, Error, Handler, Outcome, PluginContext, Validating};
use crate::api::Operation;

/// How long a create waits for its verdict (the plugin's evaluation timeout).
const EVALUATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Status writes retried after the first fails, as `checkQuotas(quotas, attributes, 3)`.
const RETRIES: usize = 3;

/// `ResourceQuotaConfiguration`'s `limitedResources`: resources a create may only consume when a quota covers
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitedResource {
    #[serde(default)]
    pub api_group: String,
    pub resource: String,
    #[serde(default)]
    pub match_contains: Vec<String>,
}

/// The ResourceQuota plugin.
pub struct ResourceQuota {
    quotas: Quotas,
    limited: Vec<LimitedResource>,
    /// Per namespace: creates waiting for the next batch, and whether a batch runs.
    queues: Arc<Mutex<HashMap<String, Queue>>>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    busy: bool,
}

/// One create waiting for its verdict.
struct Waiter {
    resource: String,
    limited: bool,
    dry_run: bool,
    refused: Box<dyn Fn(check::Refusal) -> Error + Send + Sync>,
    reply: oneshot::Sender<Result<(), Error>>,
}

impl ResourceQuota {
    pub const NAME: &'static str = "ResourceQuota";

    pub fn new(quotas: Quotas, limited: Vec<LimitedResource>) -> Self {
        Self { quotas, limited, queues: Arc::default() }
    }

    pub(crate) fn factory(ctx: &PluginContext) -> anyhow::Result<Option<Arc<dyn Handler>>> {
        let Some(quotas) = ctx.quotas() else { return Ok(None) };
        Ok(Some(Arc::new(Self::new(quotas, ctx.config().limited_resources.clone()))))
    }

    fn is_limited(&self, a: &Attributes, resource: &str) -> bool {
        self.limited.iter().any(|l| {
            l.api_group == a.resource.group
                && l.resource == a.resource.resource
                && l.match_contains.iter().any(|m| resource.contains(m.as_str()))
        })
    }

    /// Queues `w` for its namespace's next batch; starts the namespace's worker if none runs.
    fn enqueue(&self, namespace: &str, w: Waiter) {
        let mut queues = self.queues.lock();
        let q = queues.entry(namespace.to_owned()).or_default();
        q.waiting.push(w);
        if !q.busy {
            q.busy = true;
            let (queues, quotas, namespace) = (self.queues.clone(), self.quotas.clone(), namespace.to_owned());
            tokio::spawn(async move { work(queues, quotas, namespace).await });
        }
    }
}

/// Clears a namespace's queue if its worker ends by a panic, so the next create starts a new one.
struct Worker {
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    namespace: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.queues.lock().remove(&self.namespace);
        }
    }
}

/// A namespace's worker: batch after batch until none waits.
async fn work(queues: Arc<Mutex<HashMap<String, Queue>>>, quotas: Quotas, namespace: String) {
    let _worker = Worker { queues: queues.clone(), namespace: namespace.clone() };
    loop {
        let batch = {
            let mut all = queues.lock();
            let q = all.get_mut(&namespace).expect("a running worker's queue");
            if q.waiting.is_empty() {
                all.remove(&namespace);
                return;
            }
            std::mem::take(&mut q.waiting)
        };
        let verdicts = decide(&quotas, &namespace, &batch).await;
        for (w, verdict) in batch.into_iter().zip(verdicts) {
            // The create may have timed out meanwhile; its charge stays, as upstream's does.
            let _ = w.reply.send(verdict);
        }
    }
}

/// The verdicts of one batch, in order, as `checkQuotas` reaches them: each create charged against the quotas as
/// the ones before it left them, the changed quotas written, and on a failed write the creates still waiting
/// checked again against the failed quotas read afresh. Unlike upstream, a create refused once stays refused: a
/// retry sees only the failed quotas, and re-checking a refusal against them alone could admit a create over
/// another quota. A create whose caller is gone (timed out) is not charged.
async fn decide(quotas: &Quotas, namespace: &str, batch: &[Waiter]) -> Vec<Result<(), Error>> {
    let mut verdicts: Vec<Option<Result<(), Error>>> = batch.iter().map(|_| None).collect();
    let mut current = match quotas.get(namespace).await {
        Ok(q) => q,
        Err(e) => return batch.iter().map(|_| Err(Error::QuotaAccess { source: e.clone() })).collect(),
    };
    let mut retries = RETRIES;
    loop {
        let original = current.clone();
        let mut changed = false;
        for (w, verdict) in batch.iter().zip(verdicts.iter_mut()).filter(|(_, v)| v.is_none()) {
            if w.reply.is_closed() {
                *verdict = Some(Err(Error::QuotaTimeout));
                continue;
            }
            match check::charge(&current, &w.resource, w.limited) {
                Err(refusal) => *verdict = Some(Err((w.refused)(refusal))),
                Ok(_) if w.dry_run => *verdict = Some(Ok(())),
                Ok(charged) => {
                    let charges = charged.iter().zip(&current).any(|(n, o)| check::used(n) != check::used(o));
                    if charges {
                        changed = true;
                    } else {
                        *verdict = Some(Ok(()));
                    }
                    current = charged;
                }
            }
        }
        if !changed {
            break;
        }
        let mut failed = Vec::new();
        let mut last_error = None;
        for (o, q) in original.iter().zip(&current) {
            if check::used(o) == check::used(q) {
                continue;
            }
            match quotas.update_status(q).await {
                Ok(()) => {}
                Err(e) => {
                    failed.push(q.metadata.name.clone());
                    last_error = Some(e);
                }
            }
        }
        let Some(error) = last_error else { break };
        if retries == 0 {
            fill(&mut verdicts, || Err(Error::QuotaAccess { source: error.clone() }));
            break;
        }
        retries -= 1;
        match quotas.get_live(namespace).await {
            Ok(fresh) => current = fresh.into_iter().filter(|q| failed.contains(&q.metadata.name)).collect(),
            Err(e) => {
                fill(&mut verdicts, || Err(Error::QuotaAccess { source: e.clone() }));
                break;
            }
        }
    }
    verdicts.into_iter().map(|v| v.unwrap_or(Ok(()))).collect()
}

fn fill(verdicts: &mut [Option<Result<(), Error>>], with: impl Fn() -> Result<(), Error>) {
    for v in verdicts.iter_mut().filter(|v| v.is_none()) {
        *v = Some(with());
    }
}

impl Handler for ResourceQuota {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// An object count is charged on create only (the object-count evaluator handles nothing else).
    fn handles(&self, operation: Operation) -> bool {
        operation == Operation::Create
    }

    fn validating(&self) -> Option<&dyn Validating> {
        Some(self)
    }

    /// A refusal names the object, generated names included: the object is read while a quota may apply.
    fn reads_objects(&self, _: &Attributes) -> bool {
        !self.limited.is_empty() || self.quotas.may_apply()
    }

    fn has_synced(&self) -> bool {
        self.quotas.has_synced()
    }
}

#[async_trait]
impl Validating for ResourceQuota {
    async fn validate(
        &self,
        a: &Attributes,
        object: Option<&Value>,
        _old: Option<&Value>,
        _out: &mut Outcome,
    ) -> Result<(), Error> {
        if !a.subresource.as_str().is_empty() || a.namespace.is_empty() {
            return Ok(());
        }
        let name = resource_name(a, object);
        if !self.quotas.wait_for_ready().await {
            return Err(Error::NotReady { resource: a.group_resource(), name });
        }
        let resource = match a.resource.group.as_str() {
            "" => format!("count/{}", a.resource.resource),
            group => format!("count/{}.{group}", a.resource.resource),
        };
        let group_resource = a.group_resource();
        let (reply, verdict) = oneshot::channel();
        let waiter = Waiter {
            limited: self.is_limited(a, &resource),
            resource,
            dry_run: a.dry_run,
            refused: Box::new(move |refusal| match refusal {
                check::Refusal::Unreadable { .. } => Error::QuotaUnreadable { message: refusal.to_string() },
                refusal => Error::QuotaRefused {
                    resource: group_resource.clone(),
                    name: name.clone(),
                    reason: refusal.to_string(),
                },
            }),
            reply,
        };
        self.enqueue(&a.namespace, waiter);
        match tokio::time::timeout(EVALUATION_TIMEOUT, verdict).await {
            Ok(Ok(verdict)) => verdict,
            Ok(Err(_)) | Err(_) => Err(Error::QuotaTimeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ResourceQuota as Quota, ResourceQuotaStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::admission::testing::attributes;
    use crate::api::{Subresource, UserInfo};

    const R: &str = "count/podsets.demo.k8s.io";

    fn quota(hard: &str, used: &str) -> Quota {
        let map = |v: &str| Some(BTreeMap::from([(R.to_owned(), Quantity(v.into()))]));
        Quota {
            metadata: ObjectMeta { name: Some("q".into()), namespace: Some("ns".into()), ..Default::default() },
            spec: None,
            status: Some(ResourceQuotaStatus { hard: map(hard), used: map(used) }),
        }
    }

    async fn create(plugin: &ResourceQuota, dry_run: bool) -> Result<(), Error> {
        let mut a = attributes(Operation::Create, Subresource::Main, "ns", "web", UserInfo::default());
        a.dry_run = dry_run;
        plugin.validate(&a, None, None, &mut Outcome::default()).await
    }

    /// Without a main API server every status write fails: the batch's verdicts show what each create needed.
    #[tokio::test]
    async fn a_create_is_checked_charged_or_refused_as_its_quota_says() {
        let plugin = ResourceQuota::new(Quotas::fixed(vec![quota("2", "1")]), Vec::new());
        assert!(
            plugin.reads_objects(&attributes(Operation::Create, Subresource::Main, "ns", "web", UserInfo::default())),
            "a refusal names the object while a quota exists"
        );
        create(&plugin, true).await.expect("a dry run within the limit is admitted and writes nothing");
        let e = create(&plugin, false).await.unwrap_err();
        assert!(matches!(e, Error::QuotaAccess { .. }), "a charge that cannot be written refuses the create: {e}");

        let full = ResourceQuota::new(Quotas::fixed(vec![quota("1", "1")]), Vec::new());
        let e = create(&full, true).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "podsets.demo.k8s.io \"web\" is forbidden: exceeded quota: q, requested: count/podsets.demo.k8s.io=1, \
             used: count/podsets.demo.k8s.io=1, limited: count/podsets.demo.k8s.io=1"
        );
        let odd = ResourceQuota::new(Quotas::fixed(vec![quota("many", "0")]), Vec::new());
        assert!(matches!(create(&odd, false).await.unwrap_err(), Error::QuotaUnreadable { .. }));

        let limited = LimitedResource {
            api_group: "demo.k8s.io".into(),
            resource: "podsets".into(),
            match_contains: vec!["podsets".into()],
        };
        let uncovered = ResourceQuota::new(Quotas::fixed(Vec::new()), vec![limited]);
        let e = create(&uncovered, false).await.unwrap_err();
        assert!(e.to_string().ends_with("insufficient quota to consume: count/podsets.demo.k8s.io"), "{e}");
        let free = ResourceQuota::new(Quotas::fixed(Vec::new()), Vec::new());
        create(&free, false).await.expect("no quota, nothing limited: admitted");
        assert!(!free.reads_objects(&attributes(
            Operation::Create,
            Subresource::Main,
            "ns",
            "web",
            UserInfo::default()
        )));
        assert!(!free.handles(Operation::Update) && free.handles(Operation::Create));
    }

    /// A main API server where quota `q` is already gone (deleted after this server's cache read it): its status
    /// write answers 404 and a live list finds nothing, as kube-apiserver would.
    fn quota_deleted_meanwhile() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let call = format!("{} {}", req.method(), req.uri().path());
            log.lock().push(call.clone());
            async move {
                let (code, body) = if call == "PUT /api/v1/namespaces/ns/resourcequotas/q/status" {
                    (
                        404,
                        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                        "reason": "NotFound", "message": "resourcequotas \"q\" not found"}),
                    )
                } else if call == "GET /api/v1/namespaces/ns/resourcequotas" {
                    (
                        200,
                        serde_json::json!({"kind": "ResourceQuotaList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": []}),
                    )
                } else {
                    (500, serde_json::json!({}))
                };
                let resp = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.to_string().into_bytes()))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        (kube::Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn a_quota_deleted_after_it_was_read_lets_the_create_through_as_upstreams_retry_does() {
        let (client, seen) = quota_deleted_meanwhile();
        let plugin = ResourceQuota::new(Quotas::fixed_with_client(vec![quota("1", "0")], client), Vec::new());
        create(&plugin, false).await.expect("no quota left to charge: admitted");
        assert_eq!(
            *seen.lock(),
            ["PUT /api/v1/namespaces/ns/resourcequotas/q/status", "GET /api/v1/namespaces/ns/resourcequotas"],
            "the charge was tried, then the quotas read afresh"
        );
    }
}
