//! The controller's work as seen from outside: the Pods each PodSet owns, sampled during the run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use podset_apiserver::api::PodSet;
use tokio_util::sync::CancellationToken;

use super::{key_of, Recorder, CALL_TIMEOUT};
use crate::model::history::PodCount;

/// The Pods each PodSet owns (controller reference to its uid, not terminating), with the PodSets read first.
pub(crate) async fn census(podsets: &Api<PodSet>, pods: &Api<Pod>) -> Option<Vec<(PodSet, u32)>> {
    let sets = podsets.list(&ListParams::default()).await.ok()?;
    let pods = pods.list(&ListParams::default()).await.ok()?;
    let mut owned: HashMap<String, u32> = HashMap::new();
    for p in &pods.items {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if p.metadata.deletion_timestamp.is_some() || !(phase == "Pending" || phase == "Running") {
            continue;
        }
        for r in p.metadata.owner_references.iter().flatten() {
            if r.controller == Some(true) && r.kind == "PodSet" {
                *owned.entry(r.uid.clone()).or_default() += 1;
            }
        }
    }
    Some(
        sets.items
            .into_iter()
            .map(|ps| {
                let n = ps.metadata.uid.as_ref().and_then(|u| owned.get(u)).copied().unwrap_or(0);
                (ps, n)
            })
            .collect(),
    )
}

pub(crate) async fn sampler(podsets: Api<PodSet>, pods: Api<Pod>, rec: Arc<Recorder>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let call = rec.now();
        if let Ok(Some(census)) = tokio::time::timeout(CALL_TIMEOUT, census(&podsets, &pods)).await {
            let ret = rec.now();
            let mut counts = rec.pod_counts.lock().unwrap();
            counts.extend(census.iter().map(|(ps, n)| {
                let replicas = ps.spec.replicas.unwrap_or(1) as u32;
                let status = ps.status.as_ref();
                let settled = status
                    .is_some_and(|s| s.observed_generation == ps.metadata.generation && s.replicas as u32 == replicas);
                PodCount { key: key_of(ps), call, ret, active: *n, replicas, settled }
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}
