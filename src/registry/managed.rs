//! Where field management (managedFields, server-side apply) hooks into the write path: `manage_fields` records an
//! update or merges an apply; a plain create's entry is written out directly by `created_managed_fields`.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::error::Result;
use super::fieldmanager::{FieldManager, Operation, Subresource};
use super::options::WriteOptions;
use super::strategy::now_text;
use crate::api::schema::{component_schemas, PODSET};
use crate::api::API_VERSION;

/// Field management for PodSets, merged by the schema the server publishes.
pub fn podset_field_manager() -> &'static FieldManager {
    static FM: OnceLock<FieldManager> = OnceLock::new();
    FM.get_or_init(|| {
        // The parts of a PodSet that, like a Deployment's non-pointer structs, always exist: writes compared
        // against them never own them as nodes of their own.
        let skeleton = json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": null}}},
                              "status": {}});
        FieldManager::new(&component_schemas(), PODSET, API_VERSION, skeleton)
    })
}

/// Whether a write sent managedFields of its own (which a create keeps, or which reset them).
pub(crate) fn sent_managed_fields(new: &Value) -> bool {
    new.get("metadata").and_then(|m| m.get("managedFields")).is_some_and(|m| !m.is_null())
}

/// The managedFields of a create by `opts.field_manager` of `new`, sent without managedFields, as the JSON to
/// store beside it: what `manage_fields` would record, written out directly. `None` when there is nothing to
/// record, or (logged) when the schema cannot take the object, which then loses field tracking as there.
pub(crate) fn created_managed_fields(new: &mut Value, opts: &WriteOptions) -> Option<String> {
    podset_field_manager().created_managed_fields(new, &opts.field_manager, &now_text()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "managedFields could not be updated; dropping them");
        None
    })
}

/// The managedFields of a write by `opts.field_manager` to `sub`, going from `live` (`None` on create) to `new`.
///
/// - `Update` (create, update, merge or JSON patch): `new` is the object about to be stored; returns it with the
///   write recorded. An object the schema cannot take loses its field tracking rather than the write, as
///   kube-apiserver does.
/// - `Apply`: `new` is the applied configuration; returns the object to store, merged and tracked, or the
///   conflicts with other managers (409) unless `opts.force`.
pub(crate) fn manage_fields(
    live: Option<&Value>,
    new: Value,
    opts: &WriteOptions,
    op: Operation,
    sub: Subresource,
) -> Result<Value> {
    let fm = podset_field_manager();
    match op {
        Operation::Apply => Ok(fm.apply(live, &new, &opts.field_manager, sub, opts.force, &now_text())?),
        Operation::Update => {
            let mut new = new;
            if let Err(e) = fm.update(live, &mut new, &opts.field_manager, sub, &now_text()) {
                tracing::warn!(error = %e, "managedFields could not be updated; dropping them");
                if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("managedFields");
                }
            }
            Ok(new)
        }
    }
}
