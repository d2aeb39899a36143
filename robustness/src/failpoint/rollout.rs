//! A rolling upgrade from the build that serves only v1alpha1 to this build, and the rollback, as docs/install.md
//! gives them: replicas replaced one at a time, as a Deployment's rolling update does (out of the Endpoints, SIGTERM,
//! the other build started, back in once ready). v1beta1 is registered (its own Service, listing only replicas that
//! serve it) once the first replica of this build is ready; before the first replica goes back, with no object
//! stored in v1beta1, its APIService and Service are deleted.

use std::time::Duration;

use podset_envtest::{Cluster, ServerCommand};

use super::Injected;
use crate::model::history::{Build, ReplicaStart, RolloutStep};
use crate::traffic::{replica_route, Recorder, Route, Serving};

/// The gauge each replica of this build reports, for the whole store, by stored version.
const STORED_IN_V1BETA1: &str = "podset_storage_version_objects{version=\"v1beta1\"} ";

/// The run's builds and its pace.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// The build the run starts on and rolls back to.
    pub old: ServerCommand,
    /// From the start of traffic to the first replacement, and from one replica ready to the next replacement.
    pub every: Duration,
    /// How long every replica runs this build before the rollback begins.
    pub hold: Duration,
}

/// The replacements, in order: every replica to this build, then every one back.
pub fn plan(replicas: usize) -> Vec<(usize, Build)> {
    (0..replicas).map(|i| (i, Build::New)).chain((0..replicas).rev().map(|i| (i, Build::Old))).collect()
}

/// The versions a build serves.
pub(crate) fn versions(build: Build) -> Vec<String> {
    match build {
        Build::Old => vec!["v1alpha1".into()],
        Build::New => vec!["v1beta1".into(), "v1alpha1".into()],
    }
}

/// Replaces replica `replica` by `server`, a `build`; `routes` are the run's (the replicas', then the aggregator's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn replace(
    c: &mut Cluster,
    rt: &tokio::runtime::Runtime,
    rec: &Recorder,
    routes: &[Route],
    serving: &Serving,
    replica: usize,
    build: Build,
    server: &ServerCommand,
) -> Injected {
    let replicas = routes.len() - 1;
    let aggregator = replicas;
    serving.set(replica, false);
    let mut v1beta1_objects = None;
    let mut what = String::new();
    if build == Build::Old && c.registered_versions().iter().any(|v| v == "v1beta1") {
        v1beta1_objects = Some(rt.block_on(stored_in_v1beta1(&routes[..replicas])));
        serving.set(aggregator, false);
        c.unregister_version("v1beta1");
        what.push_str("v1beta1's APIService and Service deleted; ");
    }
    let others: Vec<usize> = (0..replicas).filter(|&j| j != replica).collect();
    c.set_ready_replicas(&others);
    // As a terminating Pod's: kube-apiserver's endpoint cache lets go of it before it stops.
    std::thread::sleep(Duration::from_secs(2));
    let at = rec.now();
    let stopped = c.stop_replica(replica, Duration::from_secs(30));
    rec.replica_starts.lock().unwrap().push(ReplicaStart {
        route: replica_route(replica),
        at: rec.now(),
        answers_from: None,
    });
    c.set_replica_server(replica, server.clone(), &versions(build));
    c.start_replica(replica);
    let ready = rt.block_on(ready(&routes[replica], Duration::from_secs(60))).then(|| rec.now());
    if ready.is_some() {
        c.set_ready_replicas(&(0..replicas).collect::<Vec<_>>());
        if build == Build::New {
            serving.set(replica, true);
            if !c.registered_versions().iter().any(|v| v == "v1beta1") {
                c.register_version("v1beta1");
                serving.set(aggregator, true);
                what.push_str("v1beta1 registered; ");
            }
        }
    }
    rec.rollout.lock().unwrap().push(RolloutStep { replica, build, at, ready, v1beta1_objects });
    let stopped = match stopped {
        Some(status) => format!("stopped ({status})"),
        None => "killed after 30 s of SIGTERM".into(),
    };
    let started = if ready.is_some() { "ready" } else { "NOT ready after 60 s" };
    Injected {
        kind: "replica-replaced",
        what: format!("{what}replica {replica} {stopped}, on the {build:?} build {started}"),
    }
}

/// Whether the replica answers `/readyz` within `wait`.
async fn ready(route: &Route, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        let req = http::Request::get("/readyz").body(Vec::new()).expect("request");
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), route.client.request_text(req)).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Each replica's count of objects stored in v1beta1, once all read 0 or after 10 s: the last reading of each.
async fn stored_in_v1beta1(routes: &[Route]) -> Vec<Option<u64>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut counts = Vec::new();
        for route in routes {
            let req = http::Request::get("/metrics").body(Vec::new()).expect("request");
            let text = tokio::time::timeout(Duration::from_secs(5), route.client.request_text(req)).await;
            counts.push(text.ok().and_then(Result::ok).and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix(STORED_IN_V1BETA1)?.trim().parse::<f64>().ok()).map(|n| n as u64)
            }));
        }
        if counts.iter().all(|n| *n == Some(0)) || tokio::time::Instant::now() > deadline {
            return counts;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_goes_to_this_build_then_back_one_at_a_time() {
        use Build::{New, Old};
        assert_eq!(plan(3), [(0, New), (1, New), (2, New), (2, Old), (1, Old), (0, Old)]);
        assert_eq!(versions(Old), ["v1alpha1"]);
        assert!(versions(New).contains(&"v1beta1".to_owned()));
    }
}
