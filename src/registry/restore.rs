//! Restoring objects from a backup (a list as `kubectl get <resource> -A -o json --show-managed-fields` writes it)
//! into an empty store: each object as it was, uid, creationTimestamp, generation, finalizers, owner references,
//! managedFields and status included. Only resourceVersions are new: the store assigns its own.

use serde_json::Value;

use super::decode::decode_object;
use super::error::{Error, Result};
use super::key::ObjectKey;
use super::options::FieldValidation;
use super::stored::Stored;
use super::strategy::Strategy;
use super::{strategy, Registry};
use crate::api::validation::{self, FieldError};
use crate::storage::Draft;

impl<S: Strategy> Registry<S> {
    /// True when the store holds none of the resource's objects: a restore only goes into an empty store, so
    /// nothing is merged.
    pub async fn is_empty(&self) -> Result<bool> {
        let page = self.list(super::ListRequest { limit: Some(1), ..Default::default() }).await?;
        Ok(page.items.is_empty())
    }

    /// Stores one object from a backup as it was. It must decode and validate as on a create, and name its
    /// namespace (if the resource is namespaced), name and uid (a backup has them all); `resourceVersion` is
    /// dropped.
    pub async fn restore(&self, mut value: Value) -> Result<Stored> {
        let (info, kind) = (S::INFO, S::INFO.kind);
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        // In the version the backup names: it is stored in it, as objects stored before a storage version changed.
        let (mut o, _, version) = decode_object::<S>(value.clone(), FieldValidation::Strict, None)?;
        let meta = S::meta(&o);
        let (namespace, name) = match (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref()) {
            (ns, Some(n)) if !n.is_empty() && ns.is_empty() != info.namespaced() => (ns.to_owned(), n.to_owned()),
            _ if info.namespaced() => {
                return Err(Error::bad_request(format!(
                    "a {kind} in a backup must have metadata.namespace and metadata.name"
                )))
            }
            _ => {
                return Err(Error::bad_request(format!(
                    "a {kind} in a backup must have metadata.name and no metadata.namespace"
                )))
            }
        };
        let key = ObjectKey::new(namespace, name);
        // On a create the URL names the namespace; here the backup does, and it becomes part of the storage key.
        let bad_namespace = match info.namespaced() {
            true => validation::dns1123_label_errors(&key.namespace),
            false => Vec::new(),
        };
        if !bad_namespace.is_empty() {
            let errors: Vec<_> = bad_namespace
                .into_iter()
                .map(|detail| FieldError::invalid("metadata.namespace", &key.namespace, detail))
                .collect();
            return Err(Error::invalid(info, &key.name, errors));
        }
        if meta.uid.as_deref().is_none_or(str::is_empty) {
            return Err(Error::bad_request(format!("{kind} {key} in the backup has no metadata.uid")));
        }
        // Validated as a create would be, but stored as it was: defaults a newer server adds come with its next
        // write, as for objects already stored.
        strategy::validate_create::<S>(&mut o, version)?;
        let draft = Draft::new(&value, &[]).map_err(|e| Error::storage(e, info, &key.name))?;
        self.store
            .create(&key.storage_key(info), draft)
            .await
            .map(|o| Stored::new(o, info))
            .map_err(|e| Error::storage(e, info, &key.name))
    }

    /// After a restore: history before now is gone, so a client's resourceVersion from before the backup was made
    /// gets 410 Gone (or "too large") and relists, rather than resuming into different history.
    pub async fn seal_restore(&self) -> Result<()> {
        let now = self.store.current_revision();
        self.store.compact(now).await.map_err(Error::from)
    }
}
