//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does: with several replicas,
//! only the holder of the Lease runs the controller; it renews every few seconds and steps down if it cannot.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (pod name plus a random suffix).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// How often to renew, or to try to acquire.
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, identity: String) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: "podset-controller".into(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether this replica may still act as the leader: until `renew_deadline` after the start of its last
/// successful acquire or renew. Another candidate takes over only `lease_duration` after the renew time it reads,
/// which is later still. A process that was stopped past it (SIGSTOP, a frozen VM: the monotonic clock runs on)
/// finds it lapsed the moment it wakes, before its renew loop has run, and must not write; client-go has no such
/// check, and a paused leader's in-flight work then races its successor.
#[derive(Debug, Clone)]
pub struct Leadership {
    valid_until: Arc<Mutex<tokio::time::Instant>>,
}

impl Leadership {
    fn new(until: tokio::time::Instant) -> Self {
        Self { valid_until: Arc::new(Mutex::new(until)) }
    }

    fn extend(&self, until: tokio::time::Instant) {
        let mut v = self.valid_until.lock();
        *v = (*v).max(until);
    }

    fn revoke(&self) {
        *self.valid_until.lock() = tokio::time::Instant::now();
    }

    /// True while the Lease is surely still ours.
    pub fn is_held(&self) -> bool {
        #[cfg(feature = "planted-bugs")]
        if crate::planted::planted(crate::planted::Bug::StaleLeader) {
            return true;
        }
        tokio::time::Instant::now() < *self.valid_until.lock()
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Acquires or renews the Lease: `Ok(true)` when we hold it now.
async fn try_acquire_or_renew(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
    let duration = cfg.lease_duration.as_secs() as i32;
    let mut lease = match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(cfg.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Another candidate created it first.
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(e),
            };
        }
        Some(l) => l,
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder != cfg.identity {
        let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
        let valid_for = i64::from(spec.lease_duration_seconds.unwrap_or(duration));
        let expired = Timestamp::now().as_second() > renewed.as_second() + valid_for;
        if !holder.is_empty() && !expired {
            return Ok(false);
        }
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(duration);
    // The update carries the resourceVersion we read: a concurrent candidate makes it a 409.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs `lead(token, leadership)` whenever this replica holds the Lease; the token is cancelled when leadership
/// is lost or on shutdown, and `leadership` says, before each write, whether the Lease may have lapsed meanwhile.
/// Returns on shutdown.
pub async fn run<F, Fut>(client: Client, cfg: LeaseConfig, shutdown: CancellationToken, lead: F)
where
    F: Fn(CancellationToken, Leadership) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // `leader_election_master_status{name}`, as client-go's leaderelection reports it.
    let status =
        super::metrics::metrics().leader.get_or_create(&super::metrics::NameLabel { name: cfg.name.clone() }).clone();
    status.set(0);
    loop {
        tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "waiting to become leader");
        let mut attempt;
        loop {
            attempt = tokio::time::Instant::now();
            match try_acquire_or_renew(&api, &cfg).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: cannot read or write the Lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(cfg.retry_period) => {}
            }
        }
        tracing::info!(identity = %cfg.identity, "became leader");
        status.set(1);
        let term = shutdown.child_token();
        let held = Leadership::new(attempt + cfg.renew_deadline);
        let running = tokio::spawn(lead(term.clone(), held.clone()));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    held.revoke();
                    term.cancel();
                    let _ = running.await;
                    status.set(0);
                    return;
                }
                _ = tokio::time::sleep(cfg.retry_period) => {}
            }
            let attempt = tokio::time::Instant::now();
            match try_acquire_or_renew(&api, &cfg).await {
                Ok(true) => held.extend(attempt + cfg.renew_deadline),
                Ok(false) => {
                    #[cfg(feature = "planted-bugs")]
                    if crate::planted::planted(crate::planted::Bug::StaleLeader) {
                        continue;
                    }
                    tracing::warn!("leader election: another replica holds the Lease");
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "leader election: renewing the Lease failed"),
            }
            if !held.is_held() {
                tracing::warn!("leader election: could not renew within {:?}", cfg.renew_deadline);
                break;
            }
        }
        tracing::warn!("lost leadership: stopping the controller");
        status.set(0);
        held.revoke();
        term.cancel();
        let _ = running.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leadership_lapses_once_the_renew_deadline_passes_unrenewed() {
        let deadline = Duration::from_secs(10);
        let held = Leadership::new(tokio::time::Instant::now() + deadline);
        assert!(held.is_held());
        // Renewed after 2 s: good until 12 s.
        tokio::time::advance(Duration::from_secs(2)).await;
        held.extend(tokio::time::Instant::now() + deadline);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(held.is_held(), "11 s in, renewed at 2 s");
        // Stopped for 32 s, as a SIGSTOP does: awake, it is no longer held, renew or not.
        tokio::time::advance(Duration::from_secs(32)).await;
        assert!(!held.is_held());
        // A late answer to an earlier renew does not bring it back.
        held.extend(tokio::time::Instant::now() - Duration::from_secs(20));
        assert!(!held.is_held());
        held.extend(tokio::time::Instant::now() + deadline);
        held.revoke();
        assert!(!held.is_held(), "revoked when leadership is lost");
    }
}
