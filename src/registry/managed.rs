//! Where field management (managedFields, server-side apply) hooks into the write path: `manage_fields` is the one
//! call every create, update, patch and apply makes.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::fieldmanager::{FieldManager, Operation, Subresource};
use super::options::WriteOptions;
use super::strategy::now_text;
use crate::api::schema::{component_schemas, PODSET};
use crate::api::status::ApiResult;
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
) -> ApiResult<Value> {
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
