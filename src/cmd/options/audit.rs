//! Audit logging, with k8s.io/apiserver's `--audit-log-*` flags. There is no policy file: every request is logged
//! at the `Metadata` level.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::apiserver::audit::{AuditLog, LogConfig};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Auditing")]
pub struct AuditOptions {
    /// Write an audit.k8s.io/v1 Event line (Metadata level) for every request to this file; "-" means standard
    /// output. Unset: no audit log.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,

    /// Days to keep rotated audit log files (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,

    /// Rotated audit log files to keep (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,

    /// Megabytes an audit log file grows to before it is rotated (0: never rotated).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,
}

impl AuditOptions {
    /// The audit log, if asked for; its file is opened now, so a bad path stops the start.
    pub fn build(&self) -> anyhow::Result<Option<AuditLog>> {
        let Some(path) = &self.audit_log_path else { return Ok(None) };
        let cfg = LogConfig {
            path: path.clone(),
            max_size_bytes: self.audit_log_maxsize.saturating_mul(1024 * 1024),
            max_backups: self.audit_log_maxbackup,
            max_age: Duration::from_secs(self.audit_log_maxage.saturating_mul(24 * 3600)),
        };
        let log = AuditLog::start(cfg).with_context(|| format!("--audit-log-path {}", path.display()))?;
        tracing::info!(path = %path.display(), "writing the audit log (Metadata level, every request)");
        Ok(Some(log))
    }
}
