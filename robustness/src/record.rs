//! etcd's own record of every change to PodSets, kept as the run goes (compaction erases etcd's history), and the
//! compaction and defragmentation kube-apiserver's etcd sees during traffic, which never erase what the record
//! has not read yet.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::model::history::{Change, Compaction, Defragmentation, StoredForm};
use crate::traffic::{Recorder, MARKER, MIN_READY_SECONDS};

/// Where PodSets live in etcd (`--etcd-prefix` /registry).
pub(crate) const ETCD_PREFIX: &str = "/registry/demo.k8s.io/podsets/";

/// Every change to PodSets, as it happens, and the revision read up to.
#[derive(Default)]
pub(crate) struct EtcdRecord {
    pub(crate) changes: Mutex<Vec<Change>>,
    pub(crate) stored: Mutex<Vec<StoredForm>>,
    pub(crate) reached: AtomicU64,
    /// Set when etcd compacted away a revision not yet read: the record has a hole and the run proves nothing.
    pub(crate) incomplete: Mutex<Option<String>>,
}

fn change(ev: &etcd_client::Event) -> Option<(Change, Option<StoredForm>)> {
    let kv = ev.kv()?;
    let key = String::from_utf8_lossy(kv.key()).trim_start_matches(ETCD_PREFIX).to_owned();
    let resource_version = kv.mod_revision() as u64;
    let (marker, stored) = match ev.event_type() {
        etcd_client::EventType::Delete => (None, None),
        etcd_client::EventType::Put => {
            let v: serde_json::Value = serde_json::from_slice(kv.value()).unwrap_or_default();
            let annotation = v["metadata"]["annotations"][MIN_READY_SECONDS].as_str().and_then(|s| s.parse().ok());
            let stored = StoredForm {
                resource_version,
                key: key.clone(),
                api_version: v["apiVersion"].as_str().unwrap_or_default().to_owned(),
                min_ready_seconds: v["spec"]["minReadySeconds"].as_i64().or(annotation),
            };
            (Some(v["metadata"]["annotations"][MARKER].as_str().unwrap_or_default().to_owned()), Some(stored))
        }
    };
    Some((Change { resource_version, key, marker }, stored))
}

impl EtcdRecord {
    /// Watches every member in turn, from the revision after the last one read, until `stop`.
    pub(crate) async fn follow(self: Arc<Self>, endpoints: Vec<String>, stop: CancellationToken) {
        let mut next = 0;
        while !stop.is_cancelled() {
            let endpoint = endpoints[next % endpoints.len()].clone();
            next += 1;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.follow_one(endpoint) => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn follow_one(&self, endpoint: String) {
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        let Ok(Ok(mut client)) =
            tokio::time::timeout(Duration::from_secs(3), etcd_client::Client::connect([endpoint], Some(opts))).await
        else {
            return;
        };
        let from = self.reached.load(Ordering::SeqCst) as i64 + 1;
        let opts = etcd_client::WatchOptions::new().with_prefix().with_start_revision(from.max(1));
        let Ok(mut stream) = client.watch(ETCD_PREFIX, Some(opts)).await else { return };
        loop {
            // A member cut off or gone stops answering; another one carries on.
            let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_secs(5), stream.message()).await else {
                return;
            };
            if resp.compact_revision() > 0 {
                let hole = format!("etcd compacted to {} before the record read past {from}", resp.compact_revision());
                *self.incomplete.lock().unwrap() = Some(hole);
                return;
            }
            if resp.canceled() {
                return;
            }
            let mut changes = self.changes.lock().unwrap();
            let mut stored = self.stored.lock().unwrap();
            for ev in resp.events() {
                if let Some((c, s)) = change(ev) {
                    self.reached.fetch_max(c.resource_version, Ordering::SeqCst);
                    changes.push(c);
                    stored.extend(s);
                }
            }
        }
    }

    /// The record once it has read up to etcd's newest revision (every revision in this etcd is a PodSet's).
    pub(crate) async fn finish(&self, endpoints: Vec<String>) -> Result<Vec<Change>, String> {
        let mut client = etcd_client::Client::connect(endpoints, None).await.map_err(|e| e.to_string())?;
        let head = client.get("/", None).await.map_err(|e| e.to_string())?.header().map_or(0, |h| h.revision()) as u64;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.reached.load(Ordering::SeqCst) < head && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Some(hole) = self.incomplete.lock().unwrap().clone() {
            return Err(hole);
        }
        let reached = self.reached.load(Ordering::SeqCst);
        if reached < head {
            return Err(format!("the record read up to revision {reached} of etcd's {head}"));
        }
        let mut changes = std::mem::take(&mut *self.changes.lock().unwrap());
        changes.sort_by_key(|c| c.resource_version);
        Ok(changes)
    }

    /// How each change was stored, once [`Self::finish`] has read them all.
    pub(crate) fn stored(&self) -> Vec<StoredForm> {
        let mut stored = std::mem::take(&mut *self.stored.lock().unwrap());
        stored.sort_by_key(|s| s.resource_version);
        stored
    }
}

/// kube-apiserver's compaction, faster: every `interval`, etcd is compacted to the revision the record had
/// reached one interval before; now and then a member is defragmented.
pub(crate) async fn compactor(
    record: Arc<EtcdRecord>,
    endpoints: Vec<String>,
    rec: Arc<Recorder>,
    interval: Duration,
    mut rng: StdRng,
    stop: CancellationToken,
) {
    let mut previous = 0;
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let target = previous.min(record.reached.load(Ordering::SeqCst));
        previous = record.reached.load(Ordering::SeqCst);
        let Ok(Ok(mut client)) =
            tokio::time::timeout(Duration::from_secs(3), etcd_client::Client::connect(endpoints.clone(), None)).await
        else {
            continue;
        };
        if target > 0 {
            let done = tokio::time::timeout(Duration::from_secs(5), client.compact(target as i64, None)).await;
            if matches!(done, Ok(Ok(_))) {
                rec.compactions.lock().unwrap().push(Compaction { at: rec.now(), revision: target });
            }
        }
        if rng.random_range(0..3) == 0 {
            // Defragmentation blocks the member it runs on for a while: one member, as etcd's docs advise.
            let m = rng.random_range(0..endpoints.len());
            let Ok(Ok(mut member)) = tokio::time::timeout(
                Duration::from_secs(3),
                etcd_client::Client::connect([endpoints[m].clone()], None),
            )
            .await
            else {
                continue;
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(10), member.defragment()).await {
                rec.defragmentations.lock().unwrap().push(Defragmentation { at: rec.now(), member: m });
            }
        }
    }
}
