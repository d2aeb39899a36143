//! Storage: where PodSets are kept, and how much history watches can resume from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::storage::{Cacher, HistoryLimits, SledBackend, SledOptions, StorageError, Store};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Storage")]
pub struct StorageOptions {
    /// Directory of the embedded database (sled) and self-signed certificates.
    #[arg(long, default_value = "podset-data", env = "PODSET_DATA_DIR")]
    pub data_dir: PathBuf,

    /// sled's page cache, in bytes. Objects are served from the server's own cache; sled reads only to check
    /// writes and at start.
    #[arg(long, default_value_t = SledOptions::default().cache_capacity)]
    pub storage_sled_cache_bytes: u64,

    /// Keep at least this many of the newest changes for watches to resume from.
    #[arg(long, default_value_t = 10_000)]
    pub watch_history_events: usize,

    /// Also keep every change younger than this many seconds (up to --watch-history-max-events).
    #[arg(long, default_value_t = 300)]
    pub watch_history_seconds: u64,

    /// Hard cap on kept changes.
    #[arg(long, default_value_t = 200_000)]
    pub watch_history_max_events: usize,

    /// Hard cap on the serialized size of kept changes, in bytes (the newest change is always kept).
    #[arg(long, default_value_t = HistoryLimits::default().max_bytes)]
    pub watch_history_max_bytes: usize,

    /// Start even when the store is empty while Pods in the main API server are still owned by PodSets (which
    /// looks like a lost or unmounted data dir, and would let the garbage collector delete those Pods).
    #[arg(long)]
    pub allow_empty_store: bool,
}

impl StorageOptions {
    pub fn history_limits(&self) -> HistoryLimits {
        HistoryLimits {
            min_events: self.watch_history_events,
            min_age: Duration::from_secs(self.watch_history_seconds),
            max_events: self.watch_history_max_events.max(self.watch_history_events),
            max_bytes: self.watch_history_max_bytes,
        }
    }

    /// Opens the store under --data-dir: the cache over the embedded backend, loaded.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let db_dir = self.data_dir.join("db");
        let sled = SledOptions { cache_capacity: self.storage_sled_cache_bytes };
        let limits = self.history_limits();
        let cacher = tokio::task::spawn_blocking(move || -> Result<Cacher, StorageError> {
            Cacher::new(Arc::new(SledBackend::open(&db_dir, sled)?), limits)
        })
        .await??;
        Ok(Arc::new(cacher))
    }
}
