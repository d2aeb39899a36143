//! The webhook backend (`--audit-webhook-config-file`): events POSTed as an `audit.k8s.io/v1` `EventList` to the
//! server of the kubeconfig's current context, trusting its CA and presenting its user's credentials, as
//! k8s.io/apiserver's webhook backend sends them. A failed call is retried with backoff
//! (`--audit-webhook-initial-backoff`, then 1.5 times longer each time, five calls in all, each within 30 s);
//! then its events are dropped and counted in `apiserver_audit_error_total{plugin="webhook"}`. In `batch` mode each
//! batch is sent by a task of its own, so a slow or absent receiver never holds up requests.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use base64::Engine;
use bytes::Bytes;
use rand::Rng;

use super::backend::{plugin_error, Backend};
use super::Event;
use crate::admission::webhook::{CallError, WebhookClients};

/// One call's time limit, as k8s.io/apiserver's webhook client.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls made for one batch before it is given up.
const ATTEMPTS: u32 = 5;

pub struct WebhookBackend {
    inner: Arc<Target>,
    /// Batch mode: each batch is sent by a task of its own, and `process` does not wait for it.
    asynchronous: bool,
    runtime: tokio::runtime::Handle,
}

struct Target {
    clients: WebhookClients,
    url: String,
    host_port: String,
    ca: Vec<u8>,
    initial_backoff: Duration,
}

impl WebhookBackend {
    /// The receiver the kubeconfig at `path` names (its current context's cluster and user).
    pub fn from_kubeconfig(path: &Path, initial_backoff: Duration, asynchronous: bool) -> anyhow::Result<Self> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        let current = kubeconfig.current_context.as_deref().ok_or_else(|| anyhow!("no current-context"))?;
        let context = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == current)
            .and_then(|c| c.context.as_ref())
            .ok_or_else(|| anyhow!("the current context {current:?} is not defined"))?;
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| anyhow!("the cluster {:?} is not defined", context.cluster))?;
        let url = cluster.server.clone().ok_or_else(|| anyhow!("the cluster {:?} has no server", context.cluster))?;
        let uri: http::Uri = url.parse().with_context(|| format!("server {url:?}"))?;
        let authority = uri.authority().ok_or_else(|| anyhow!("server {url:?} has no host"))?;
        let host_port = match authority.port_u16() {
            Some(_) => authority.as_str().to_owned(),
            None => format!("{}:443", authority.host()),
        };
        let ca = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(data), _) => base64::engine::general_purpose::STANDARD.decode(data.trim())?,
            (None, Some(file)) => std::fs::read(file).with_context(|| format!("reading {file}"))?,
            (None, None) => Vec::new(),
        };
        let clients = WebhookClients::from_kubeconfig(path)?;
        let runtime = tokio::runtime::Handle::try_current().context("the audit webhook needs the server's runtime")?;
        Ok(Self { inner: Arc::new(Target { clients, url, host_port, ca, initial_backoff }), asynchronous, runtime })
    }
}

impl Target {
    /// Sends one EventList, retrying any failure with backoff (k8s.io/apiserver's `WithExponentialBackoff`).
    async fn send(&self, events: &[Event]) -> Result<(), CallError> {
        let list =
            serde_json::json!({"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {}, "items": events});
        let body = Bytes::from(serde_json::to_vec(&list).unwrap_or_default());
        let mut wait = self.initial_backoff;
        let mut attempt = 1;
        loop {
            let sent = self
                .clients
                .post_to(&self.url, &self.host_port, &self.ca, body.clone(), CALL_TIMEOUT, "podset-apiserver-audit")
                .await;
            match sent {
                Ok(_) => return Ok(()),
                Err(e) if attempt >= ATTEMPTS => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, attempt, "the audit webhook failed; retrying");
                    let jitter = rand::rng().random_range(0.0..0.2);
                    tokio::time::sleep(wait.mul_f64(1.0 + jitter)).await;
                    wait = wait.mul_f64(1.5);
                    attempt += 1;
                }
            }
        }
    }
}

impl Backend for WebhookBackend {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn process(&self, events: &[Event]) -> bool {
        let target = self.inner.clone();
        if self.asynchronous {
            let events = events.to_vec();
            self.runtime.spawn(async move {
                if let Err(e) = target.send(&events).await {
                    plugin_error("webhook", &e.to_string(), &events);
                }
            });
            return true;
        }
        // Blocking modes: the request waits, on its own worker thread, for the receiver's answer.
        let sent = tokio::task::block_in_place(|| self.runtime.block_on(target.send(events)));
        match sent {
            Ok(()) => true,
            Err(e) => {
                plugin_error("webhook", &e.to_string(), events);
                false
            }
        }
    }
}
