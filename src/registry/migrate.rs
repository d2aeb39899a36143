//! Storage migration, as kube-storage-version-migrator does it through the API: every object stored in another
//! version than the storage version, or encrypted by another provider than the one writing now (a key being
//! rotated out), is written again, unchanged, which stores it in the storage version with the current key. A pass
//! reads the list anew, so a pass cut short is resumed by the next one. Progress is the whole store's, counted from
//! the cache (which holds every replica's writes): in the resource's [`MigrationMetrics`], if it has them
//! ([`Registry::count_storage_versions`]), and the log.

use super::error::{Error, Result};
use super::key::ObjectKey;
use super::options::{ListRequest, WriteOptions};
use super::stored::Stored;
use super::strategy::Strategy;
use super::view::ObjectView;
use super::write::{Change, Write};
use super::Registry;
use crate::admission::WriteKind;
use crate::api::resource::ServedVersion;
use crate::api::{Operation, Subresource, UserInfo};

/// Who the migration's writes are made as (admission and the audit log see this user), and their field manager.
pub const MIGRATOR: &str = "system:podset-storage-migrator";

/// Where a resource publishes its migration's progress.
pub trait MigrationMetrics: Sync {
    /// One more object rewritten.
    fn migrated(&self);
    /// Objects in the whole store by the version each is stored in (by index), and those left to rewrite.
    fn counted(&self, per_version: &[usize], remaining: usize);
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Written again in the storage version by this pass.
    pub migrated: usize,
    /// Gone, or rewritten by someone else, before the pass reached them.
    pub skipped: usize,
    /// Not rewritten (refused by validation or admission, unreadable, changed meanwhile): left in their version for
    /// the next pass.
    pub refused: usize,
}

impl<S: Strategy> Registry<S> {
    /// One pass of the storage migration. An object that cannot be rewritten is left for the next pass and the pass
    /// goes on, so one object never holds back the others; it stops when the store cannot take writes at all.
    pub async fn migrate_storage(&self) -> Result<Migration> {
        let page = self.list(ListRequest::readable()).await?;
        let stale: Vec<ObjectKey> = page.items.iter().filter(|o| self.needs_migration(o)).map(|o| o.key()).collect();
        let by_another_key = page.items.iter().any(|o| self.store.is_stale(o.object()));
        let mut done = Migration::default();
        if stale.is_empty() {
            return Ok(done);
        }
        tracing::info!(objects = stale.len(), storage_version = %self.storage_version, "storage migration started");
        for key in &stale {
            match self.migrate_one(key).await {
                Ok(true) => {
                    done.migrated += 1;
                    if let Some(m) = S::migration_metrics() {
                        m.migrated();
                    }
                }
                Ok(false) | Err(Error::NotFound { .. }) => done.skipped += 1,
                Err(e @ (Error::Unavailable(_) | Error::Timeout(_) | Error::ShuttingDown)) => {
                    tracing::warn!(resource = %S::INFO, object = %key, error = %e, "storage migration stopped; the next pass resumes it");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(resource = %S::INFO, object = %key, error = %e, "storage migration cannot rewrite this object yet; the next pass tries again");
                    done.refused += 1;
                }
            }
        }
        // The history still holds earlier values as they were stored, by the provider rotated out: dropped once
        // nothing is left by it, as etcd's compaction drops kube-apiserver's, so that a removed key leaves no value
        // behind (nor one a build without encryption cannot load). A watch from before then gets 410 Gone.
        if by_another_key && done.refused == 0 {
            let revision = self.store.current_revision();
            self.store.compact(revision).await?;
            tracing::info!(%revision, "history up to here dropped: it held values by another encryption provider");
        }
        tracing::info!(
            migrated = done.migrated,
            skipped = done.skipped,
            refused = done.refused,
            "storage migration done"
        );
        Ok(done)
    }

    /// Whether a stored object is to be written again: in another version, or by another encryption provider.
    pub(super) fn needs_migration(&self, o: &Stored) -> bool {
        o.version() != self.storage_version.to_index() || self.store.is_stale(o.object())
    }

    /// Objects in the whole store by the version each is stored in (by its index), as the cache holds them now;
    /// also given, with those this server's storage version has yet to take, to the resource's metrics.
    pub async fn count_storage_versions(&self) -> Result<Vec<usize>> {
        let mut counts = vec![0; S::INFO.versions.len()];
        let mut remaining = 0;
        // From the cache as it is (`resourceVersion=0`): no round trip to the store each time.
        let listed = self.list(ListRequest { resource_version: Some(0), ..ListRequest::readable() }).await?.items;
        // Objects no provider reads cannot be migrated: they count as remaining, never as done.
        remaining += self.store.stats().objects.saturating_sub(listed.len());
        for o in listed {
            counts[o.version().get()] += 1;
            remaining += usize::from(self.needs_migration(&o));
        }
        if let Some(m) = S::migration_metrics() {
            m.counted(&counts, remaining);
        }
        Ok(counts)
    }

    /// Writes `key` again, unchanged, if it is stored in another version; `false` when it was not (any more).
    async fn migrate_one(&self, key: &ObjectKey) -> Result<bool> {
        let user = UserInfo::named(MIGRATOR, Vec::new()).authenticated();
        let opts =
            WriteOptions { version: Some(self.storage_version.to_index()), ..WriteOptions::manager(MIGRATOR, user) };
        let w = Write {
            op: Operation::Update,
            sub: Subresource::Main,
            key,
            opts: &opts,
            options: WriteKind::Update,
            view: ObjectView::<S>::NEW,
            version: self.storage_version,
        };
        let mut rewritten = false;
        self.write(&w, |current| {
            let Some((old, stored)) = current else { return Err(Error::not_found(S::INFO, &key.name)) };
            // Unchanged: the write path stores it only because it is in another version or by another key.
            rewritten = self.needs_migration(stored);
            // Its managedFields as the write path reads them (converted to the storage version), not as sent.
            let mut same = old.clone();
            S::meta_mut(&mut same).managed_fields = None;
            Ok(Change::update(same, Vec::new()))
        })
        .await?;
        Ok(rewritten)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;
    use serde_json::{json, Value};

    use super::*;

    type Registry = crate::registry::Registry<crate::resources::podset::PodSetStrategy>;
    use crate::admission::{self, Admission, Attributes, Outcome};
    use crate::api::Version;

    /// Denies the migrator's rewrite of `held` while `deny` is set.
    struct HoldOne {
        deny: AtomicBool,
    }

    #[async_trait]
    impl Admission for HoldOne {
        async fn admit(
            &self,
            _: &Attributes,
            _: Option<&mut Value>,
            _: Option<&Value>,
            _: &mut Outcome,
        ) -> std::result::Result<(), admission::Error> {
            Ok(())
        }

        async fn validate(
            &self,
            a: &Attributes,
            _: Option<&Value>,
            _: Option<&Value>,
            _: &mut Outcome,
        ) -> std::result::Result<(), admission::Error> {
            if a.name == "held" && a.user.name == MIGRATOR && self.deny.load(Ordering::SeqCst) {
                return Err(admission::Error::Denied { webhook: "hold.example.com".into(), status: None });
            }
            Ok(())
        }

        fn runs(&self) -> bool {
            true
        }

        fn reads_objects(&self, _: &admission::Attributes) -> admission::ObjectReads {
            admission::ObjectReads::default()
        }
    }

    #[tokio::test]
    async fn a_refused_object_holds_back_no_other_and_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let old: Registry = Registry::on_sled(dir.path()).await.with_storage_version(Version::V1alpha1);
        let user = UserInfo::named("alice", Vec::new());
        for name in ["a", "held", "z"] {
            let body = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": name},
                              "spec": {"replicas": 1}});
            old.create("ns", body, &WriteOptions::manager("test", user.clone())).await.unwrap();
        }
        let hold = Arc::new(HoldOne { deny: AtomicBool::new(true) });
        let new = old.clone().with_storage_version(Version::V1beta1).with_admission(hold.clone());
        let pass = new.migrate_storage().await.unwrap();
        assert_eq!(pass, Migration { migrated: 2, skipped: 0, refused: 1 }, "the objects after the refused one too");
        hold.deny.store(false, Ordering::SeqCst);
        assert_eq!(new.migrate_storage().await.unwrap(), Migration { migrated: 1, skipped: 0, refused: 0 });
        assert_eq!(new.migrate_storage().await.unwrap(), Migration::default(), "nothing left");
    }
}
