//! Restoring PodSets from a backup (a list as `kubectl get podsets -A -o json --show-managed-fields` writes it) into
//! an empty store: each object as it was, uid, creationTimestamp, generation, finalizers, owner references,
//! managedFields and status included. Only resourceVersions are new: the store assigns its own.

use serde_json::Value;

use super::decode::decode_podset;
use super::error::{Error, Result};
use super::key::ObjectKey;
use super::options::FieldValidation;
use super::stored::Stored;
use super::{strategy, Registry};
use crate::api::validation::{self, FieldError};
use crate::resources::podset::INFO;
use crate::storage::Draft;

impl Registry {
    /// True when the store holds no PodSet: a restore only goes into an empty store, so nothing is merged.
    pub async fn is_empty(&self) -> Result<bool> {
        let page = self.list(super::ListRequest { limit: Some(1), ..Default::default() }).await?;
        Ok(page.items.is_empty())
    }

    /// Stores one PodSet from a backup as it was. It must decode and validate as on a create, and name its
    /// namespace, name and uid (a backup has them all); `resourceVersion` is dropped.
    pub async fn restore(&self, mut value: Value) -> Result<Stored> {
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        // In the version the backup names: it is stored in it, as objects stored before a storage version changed.
        let (mut ps, _, version) = decode_podset(value.clone(), FieldValidation::Strict, None)?;
        let (namespace, name) = match (ps.metadata.namespace.as_deref(), ps.metadata.name.as_deref()) {
            (Some(ns), Some(n)) if !ns.is_empty() && !n.is_empty() => (ns.to_owned(), n.to_owned()),
            _ => return Err(Error::bad_request("a PodSet in a backup must have metadata.namespace and metadata.name")),
        };
        // On a create the URL names the namespace; here the backup does, and it becomes part of the storage key.
        let bad_namespace = validation::dns1123_label_errors(&namespace);
        if !bad_namespace.is_empty() {
            let errors: Vec<_> = bad_namespace
                .into_iter()
                .map(|detail| FieldError::invalid("metadata.namespace", &namespace, detail))
                .collect();
            return Err(Error::invalid(&INFO, &name, errors));
        }
        if ps.metadata.uid.as_deref().is_none_or(str::is_empty) {
            return Err(Error::bad_request(format!("PodSet {namespace}/{name} in the backup has no metadata.uid")));
        }
        // Validated as a create would be, but stored as it was: defaults a newer server adds come with its next
        // write, as for objects already stored.
        strategy::validate_create::<crate::resources::podset::PodSetStrategy>(&mut ps, version)?;
        let key = ObjectKey::new(namespace, name);
        let draft = Draft::new(&value, &[]).map_err(|e| Error::storage(e, &INFO, &key.name))?;
        self.store
            .create(&key.storage_key(&INFO), draft)
            .await
            .map(Stored::new)
            .map_err(|e| Error::storage(e, &INFO, &key.name))
    }

    /// After a restore: history before now is gone, so a client's resourceVersion from before the backup was made
    /// gets 410 Gone (or "too large") and relists, rather than resuming into different history.
    pub async fn seal_restore(&self) -> Result<()> {
        let now = self.store.current_revision();
        self.store.compact(now).await.map_err(Error::from)
    }
}
