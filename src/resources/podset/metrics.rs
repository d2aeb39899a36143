//! PodSet's storage migration progress (`podset_storage_*`, docs/api.md), counted by `registry/migrate.rs`.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Version;
use crate::metrics::{registered, Families};
use crate::registry::MigrationMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

#[derive(Debug, Default)]
pub(crate) struct StorageMetrics {
    /// PodSets in the whole store stored in another version than this server's storage version, or by another
    /// encryption provider than the one writing now.
    storage_migration_remaining: Gauge,
    /// PodSets in the whole store by the version each is stored in.
    storage_version_objects: Family<VersionLabel, Gauge>,
    /// PodSets the storage migration rewrote.
    storage_migration_migrated: Counter,
}

static METRICS: LazyLock<StorageMetrics> = LazyLock::new(|| registered(StorageMetrics::default()));

pub(crate) fn metrics() -> &'static StorageMetrics {
    &METRICS
}

impl Families for StorageMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "podset_storage_migration_remaining",
            "PodSets in the whole store (every replica's writes) stored in another version than this server's \
             --storage-version, or encrypted by another provider than its writing one: what migration has yet to \
             rewrite.",
            self.storage_migration_remaining.clone(),
        );
        r.register(
            "podset_storage_version_objects",
            "PodSets in the whole store (every replica's writes) by the version each is stored in.",
            self.storage_version_objects.clone(),
        );
        r.register(
            "podset_storage_migration_migrated",
            "PodSets the migration pass rewrote in the storage version.",
            self.storage_migration_migrated.clone(),
        );
    }
}

impl MigrationMetrics for StorageMetrics {
    fn migrated(&self) {
        self.storage_migration_migrated.inc();
    }

    fn counted(&self, per_version: &[usize], remaining: usize) {
        for v in Version::ALL {
            let label = VersionLabel { version: v.as_str().into() };
            self.storage_version_objects.get_or_create(&label).set(per_version[v.index()] as i64);
        }
        self.storage_migration_remaining.set(remaining as i64);
    }
}
