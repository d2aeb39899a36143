//! The embedded controller: whether it runs, how hard it works, and leader election among replicas.

use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::controller::leader::{self, LeaseConfig};
use crate::controller::InformerSync;
use crate::controller::{self, ControllerConfig};
use crate::resources::podset::PodSets as Registry;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Controller")]
pub struct ControllerOptions {
    /// Run the embedded controller, which makes each PodSet's Pods in the main API server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_controller: bool,

    /// PodSets the controller reconciles at once.
    #[arg(long, default_value_t = 8)]
    pub controller_workers: usize,

    /// Seconds between full resyncs of every PodSet.
    #[arg(long, default_value_t = 300)]
    pub controller_resync_seconds: u64,

    /// Sustained writes per second the controller sends the main API server (0: no client-side limit).
    #[arg(long, default_value_t = 500)]
    pub controller_qps: u32,

    /// Writes the controller may send at once above --controller-qps.
    #[arg(long, default_value_t = 1000)]
    pub controller_burst: u32,

    /// Watch only Pods matching this label selector (default: all Pods, so any matching orphan can be adopted).
    #[arg(long)]
    pub controller_pod_selector: Option<String>,

    /// With several replicas, run the controller only on the holder of a Lease in the main API server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease. Default: the server's own (see --service-namespace).
    #[arg(long)]
    pub leader_election_namespace: Option<String>,
}

impl ControllerOptions {
    pub fn config(&self) -> ControllerConfig {
        ControllerConfig {
            workers: self.controller_workers,
            resync: Duration::from_secs(self.controller_resync_seconds.max(1)),
            qps: self.controller_qps,
            burst: self.controller_burst,
            pod_selector: self.controller_pod_selector.clone(),
            ..Default::default()
        }
    }

    /// Starts the controller, behind leader election unless --leader-elect=false; it stops with `stop`. Its caches
    /// report to `informers` while it runs.
    /// `own_namespace` is where the Lease goes unless --leader-election-namespace says otherwise.
    pub fn spawn(
        &self,
        registry: Registry,
        client: kube::Client,
        informers: InformerSync,
        own_namespace: String,
        stop: CancellationToken,
    ) {
        let cfg = ControllerConfig { informers, ..self.config() };
        if !self.leader_elect {
            tokio::spawn(controller::run(registry, client, cfg, stop));
            return;
        }
        let namespace = self.leader_election_namespace.clone().unwrap_or(own_namespace);
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "podset-apiserver".into());
        let lease = LeaseConfig::new(&namespace, format!("{host}_{}", uuid::Uuid::new_v4()));
        tokio::spawn(leader::run(client.clone(), lease, stop, move |term, held| {
            let cfg = ControllerConfig { leadership: Some(held), ..cfg.clone() };
            controller::run(registry.clone(), client.clone(), cfg, term)
        }));
    }
}
