//! PodSet's storage migration progress (`podset_storage_*`, docs/api.md), counted by `registry/migrate.rs`.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabel {
    pub version: String,
}

#[derive(Debug, Default)]
pub(crate) struct MigrationMetrics {
    /// PodSets in the whole store stored in another version than this server's storage version, or by another
    /// encryption provider than the one writing now.
    pub storage_migration_remaining: Gauge,
    /// PodSets in the whole store by the version each is stored in.
    pub storage_version_objects: Family<VersionLabel, Gauge>,
    /// PodSets the storage migration rewrote.
    pub storage_migration_migrated: Counter,
}

static METRICS: LazyLock<MigrationMetrics> = LazyLock::new(|| registered(MigrationMetrics::default()));

pub(crate) fn metrics() -> &'static MigrationMetrics {
    &METRICS
}

impl Families for MigrationMetrics {
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
