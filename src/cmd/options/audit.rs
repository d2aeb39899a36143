//! Auditing, with k8s.io/apiserver's `--audit-*` flags and defaults: the policy, the log backend and its mode,
//! batching and truncation. Without `--audit-policy-file` nothing is recorded, as in every server on
//! k8s.io/apiserver.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::apiserver::audit::backend::{self, Backend, BatchConfig, Mode, TruncateConfig};
use crate::apiserver::audit::log::{Format, LogBackend, LogConfig};
use crate::apiserver::audit::webhook::WebhookBackend;
use crate::apiserver::audit::{Auditor, Policy};

/// One backend's `--audit-<backend>-mode`, `-batch-*` and `-truncate-*` flags, with k8s.io/apiserver's defaults for
/// that backend.
macro_rules! backend_flags {
    ($name:ident, $b:literal, mode: $mode:literal, max_size: $max_size:literal, max_wait: $max_wait:literal,
     throttle: $throttle:literal, qps: $qps:literal, burst: $burst:literal) => {
        #[derive(Debug, Clone, Args)]
        #[command(next_help_heading = "Auditing")]
        pub struct $name {
            #[arg(long = concat!("audit-", $b, "-mode"), id = concat!("audit-", $b, "-mode"), value_enum, default_value = $mode,
                help = concat!("How ", $b, " events are written: blocking (the request waits for its events), \
                    blocking-strict (and fails if its RequestReceived event cannot be written) or batch (queued and \
                    written in batches by a thread of their own; a full queue drops events)."))]
            pub mode: Mode,

            #[arg(long = concat!("audit-", $b, "-batch-buffer-size"), id = concat!("audit-", $b, "-batch-buffer-size"), default_value_t = 10000,
                help = "Events queued in batch mode before new ones are dropped.")]
            pub batch_buffer_size: usize,

            #[arg(long = concat!("audit-", $b, "-batch-max-size"), id = concat!("audit-", $b, "-batch-max-size"), default_value_t = $max_size,
                help = "The most events in one batch (batch mode).")]
            pub batch_max_size: usize,

            #[arg(long = concat!("audit-", $b, "-batch-max-wait"), id = concat!("audit-", $b, "-batch-max-wait"), value_parser = crate::api::duration::parse,
                default_value = $max_wait, help = "How long a batch waits to fill before it is written (batch mode).")]
            pub batch_max_wait: Duration,

            #[arg(long = concat!("audit-", $b, "-batch-throttle-enable"), id = concat!("audit-", $b, "-batch-throttle-enable"), default_value_t = $throttle,
                action = clap::ArgAction::Set, help = "Whether batches are throttled (batch mode).")]
            pub batch_throttle_enable: bool,

            #[arg(long = concat!("audit-", $b, "-batch-throttle-qps"), id = concat!("audit-", $b, "-batch-throttle-qps"), default_value_t = $qps,
                help = "Batches written a second at most, when throttled.")]
            pub batch_throttle_qps: f64,

            #[arg(long = concat!("audit-", $b, "-batch-throttle-burst"), id = concat!("audit-", $b, "-batch-throttle-burst"), default_value_t = $burst,
                help = "Batches written at once above the rate, when throttled.")]
            pub batch_throttle_burst: u32,

            #[arg(long = concat!("audit-", $b, "-truncate-enabled"), id = concat!("audit-", $b, "-truncate-enabled"), default_value_t = false,
                action = clap::ArgAction::Set,
                help = "Whether large events lose their request and response objects (and larger ones are \
                    dropped), and large batches are split.")]
            pub truncate_enabled: bool,

            #[arg(long = concat!("audit-", $b, "-truncate-max-batch-size"), id = concat!("audit-", $b, "-truncate-max-batch-size"), default_value_t = 10485760,
                help = "Bytes a batch may hold when truncating.")]
            pub truncate_max_batch_size: usize,

            #[arg(long = concat!("audit-", $b, "-truncate-max-event-size"), id = concat!("audit-", $b, "-truncate-max-event-size"), default_value_t = 102400,
                help = "Bytes an event may hold when truncating.")]
            pub truncate_max_event_size: usize,

            #[arg(long = concat!("audit-", $b, "-version"), id = concat!("audit-", $b, "-version"), default_value = "audit.k8s.io/v1",
                value_parser = ["audit.k8s.io/v1"], help = "The API version of the events written.")]
            pub version: String,
        }

        impl $name {
            /// `backend` in this mode, truncating if asked; refuses settings kube refuses.
            fn wrap(&self, backend: Arc<dyn Backend>) -> anyhow::Result<Arc<dyn Backend>> {
                if self.mode == Mode::Batch && self.batch_buffer_size == 0 {
                    bail!("invalid audit batch {} buffer size {}, must be a positive number", $b, self.batch_buffer_size);
                }
                if self.truncate_enabled && self.truncate_max_batch_size < self.truncate_max_event_size {
                    bail!(
                        "invalid audit truncate {} max batch size {}, must be greater than max event size ({})",
                        $b,
                        self.truncate_max_batch_size,
                        self.truncate_max_event_size
                    );
                }
                let batch = BatchConfig {
                    buffer_size: self.batch_buffer_size,
                    max_batch_size: self.batch_max_size,
                    max_batch_wait: self.batch_max_wait,
                    throttle: self
                        .batch_throttle_enable
                        .then_some((self.batch_throttle_qps, self.batch_throttle_burst)),
                };
                let truncate = self.truncate_enabled.then_some(TruncateConfig {
                    max_event_size: self.truncate_max_event_size,
                    max_batch_size: self.truncate_max_batch_size,
                });
                Ok(backend::wrap(backend, self.mode, &batch, truncate))
            }
        }
    };
}

backend_flags!(LogBackendOptions, "log", mode: "blocking", max_size: 1, max_wait: "0s",
    throttle: false, qps: 0.0, burst: 0);
backend_flags!(WebhookBackendOptions, "webhook", mode: "batch", max_size: 400, max_wait: "30s",
    throttle: true, qps: 10.0, burst: 15);

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Auditing")]
pub struct AuditOptions {
    /// An audit.k8s.io/v1 Policy: which requests are recorded and how much of each. Unset: none are.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,

    /// Write the audit events to this file; "-" means standard output. Unset: no log backend.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,

    /// The log's format: json (an audit.k8s.io/v1 Event a line) or legacy (a line of text an event).
    #[arg(long, value_enum, default_value = "json")]
    pub audit_log_format: Format,

    /// Days to keep rotated audit log files (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,

    /// Rotated audit log files to keep (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,

    /// Megabytes an audit log file grows to before it is rotated (0: never rotated).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,

    /// Gzip rotated audit log files.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_log_compress: bool,

    #[command(flatten)]
    pub log: LogBackendOptions,

    /// A kubeconfig naming where audit events are POSTed as EventLists (its current context's cluster and user).
    /// Unset: no webhook backend.
    #[arg(long)]
    pub audit_webhook_config_file: Option<PathBuf>,

    /// How long to wait before retrying a failed call to the audit webhook (then 1.5 times longer each time).
    #[arg(long, value_parser = crate::api::duration::parse, default_value = "10s")]
    pub audit_webhook_initial_backoff: Duration,

    #[command(flatten)]
    pub webhook: WebhookBackendOptions,
}

impl AuditOptions {
    /// The auditor, if a policy and a backend are given; the policy is read and the log opened now, so a bad one
    /// stops the start.
    pub fn build(&self) -> anyhow::Result<Option<Auditor>> {
        let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
        if let Some(path) = &self.audit_log_path {
            let cfg = LogConfig {
                path: path.clone(),
                format: self.audit_log_format,
                max_size_bytes: self.audit_log_maxsize.saturating_mul(1024 * 1024),
                max_backups: self.audit_log_maxbackup,
                max_age: Duration::from_secs(self.audit_log_maxage.saturating_mul(24 * 3600)),
                compress: self.audit_log_compress,
            };
            let log = LogBackend::open(cfg).with_context(|| format!("--audit-log-path {}", path.display()))?;
            backends.push(self.log.wrap(Arc::new(log))?);
        }
        if let Some(path) = &self.audit_webhook_config_file {
            let asynchronous = self.webhook.mode == Mode::Batch;
            let hook = WebhookBackend::from_kubeconfig(path, self.audit_webhook_initial_backoff, asynchronous)
                .with_context(|| format!("--audit-webhook-config-file {}", path.display()))?;
            backends.push(self.webhook.wrap(Arc::new(hook))?);
        }
        let Some(policy_path) = &self.audit_policy_file else {
            if !backends.is_empty() {
                tracing::info!("no audit policy file provided: no events will be recorded");
            }
            return Ok(None);
        };
        let policy = Policy::load(policy_path).context("loading audit policy file")?;
        if backends.is_empty() {
            tracing::info!("an audit policy but no audit backend (--audit-log-path, --audit-webhook-config-file): no events will be recorded");
            return Ok(None);
        }
        tracing::info!(policy = %policy_path.display(), "auditing requests");
        let backend: Arc<dyn Backend> =
            if backends.len() == 1 { backends.remove(0) } else { Arc::new(backend::Union(backends)) };
        Ok(Some(Auditor::new(policy, backend)))
    }
}
