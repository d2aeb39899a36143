//! Where field management (managedFields, server-side apply) hooks into the write path: `manage_fields` records an
//! update or merges an apply; a plain create's entry is written out directly by `created_managed_fields`.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::error::Result;
use super::fieldmanager::{FieldManager, Operation, Subresource};
use super::options::WriteOptions;
use super::strategy::now_text;
use crate::api::schema::{component_schemas, podset_definition};
use crate::api::Version;

/// Field management for PodSets in `version`, merged by the schema the server publishes for it.
pub fn podset_field_manager(version: Version) -> &'static FieldManager {
    static FM: [OnceLock<FieldManager>; Version::ALL.len()] = [const { OnceLock::new() }; Version::ALL.len()];
    FM[version.index()].get_or_init(|| {
        // The parts of a PodSet that, like a Deployment's non-pointer structs, always exist: writes compared
        // against them never own them as nodes of their own.
        let skeleton = json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": null}}},
                              "status": {}});
        FieldManager::new(&component_schemas(version), &podset_definition(version), version.api_version(), skeleton)
    })
}

/// Whether a write sent managedFields of its own (which a create keeps, or which reset them).
pub(crate) fn sent_managed_fields(new: &Value) -> bool {
    new.get("metadata").and_then(|m| m.get("managedFields")).is_some_and(|m| !m.is_null())
}

/// The managedFields of a create by `opts.field_manager` of `new`, sent without managedFields, as the JSON to
/// store beside it: what `manage_fields` would record, written out directly. `None` when there is nothing to
/// record, or (logged) when the schema cannot take the object, which then loses field tracking as there.
pub(crate) fn created_managed_fields(new: &mut Value, opts: &WriteOptions, version: Version) -> Option<String> {
    podset_field_manager(version).created_managed_fields(new, &opts.field_manager, &now_text()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "managedFields could not be updated; dropping them");
        None
    })
}

/// The managedFields of a write by `opts.field_manager` to `sub`, going from `live` (`None` on create) to `new`,
/// both in `version` with every entry's fields named as `version` names them, whatever version it was recorded in
/// ([`manage_fields_in`] gets them so).
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
    version: Version,
) -> Result<Value> {
    let fm = podset_field_manager(version);
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

/// Renames the fields of each managedFields entry of `object` recorded in a version other than `version`: `forth`
/// from the entry's version to `version`'s names, else back. The entry keeps the version it was recorded in.
fn rename_fields(object: &mut Value, version: Version, forth: bool) {
    let Some(entries) = object.pointer_mut("/metadata/managedFields").and_then(Value::as_array_mut) else { return };
    for e in entries {
        let Some(recorded) = e.get("apiVersion").and_then(Value::as_str).and_then(Version::of_api_version) else {
            continue;
        };
        if recorded == version {
            continue;
        }
        let (from, to) = if forth { (recorded, version) } else { (version, recorded) };
        if let Some(fields) = e.get_mut("fieldsV1") {
            crate::api::conversion::convert_fields(fields, from, to);
        }
    }
}

/// Field management of a write made in `version` to an object stored in `storage` (`current`, `None` on create),
/// as kube-apiserver records it: every entry stays in the version it was recorded in (an update's entry is one per
/// manager and version, an apply's one per manager, in the version it last applied with), while the write's field
/// management compares them all as `version` names fields. `new` is the object (or an apply's configuration) in
/// `version`; the result is in `storage`.
pub(crate) fn manage_fields_in(
    current: Option<&super::Stored>,
    mut new: Value,
    opts: &WriteOptions,
    op: Operation,
    sub: Subresource,
    version: Version,
    storage: Version,
) -> Result<Value> {
    let live = match current {
        Some(c) => {
            let mut live = c.to_version(version)?.to_value()?;
            rename_fields(&mut live, version, true);
            Some(live)
        }
        None => None,
    };
    // Sent managedFields are compared with the live ones, so they are read the same way.
    rename_fields(&mut new, version, true);
    let mut out = manage_fields(live.as_ref(), new, opts, op, sub, version)?;
    rename_fields(&mut out, version, false);
    crate::api::conversion::convert_value(&mut out, version, storage);
    Ok(out)
}

/// A create's managedFields (as [`created_managed_fields`] writes them, for `from`) as a write in `to` records them:
/// the same fields, named as `to` names them. Text, as they are stored; parsed only when a field differs.
pub(crate) fn created_in_version(entries: String, from: Version, to: Version) -> String {
    if from == to {
        return entries;
    }
    let (old, new) =
        (format!("\"apiVersion\":\"{}\"", from.api_version()), format!("\"apiVersion\":\"{}\"", to.api_version()));
    if !entries.contains("minReadySeconds") && !entries.contains(crate::api::conversion::MIN_READY_SECONDS) {
        return entries.replacen(&old, &new, 1);
    }
    let Ok(mut value) = serde_json::from_str::<Value>(&entries) else { return entries };
    for e in value.as_array_mut().into_iter().flatten() {
        if let Some(fields) = e.get_mut("fieldsV1") {
            crate::api::conversion::convert_fields(fields, from, to);
        }
        e["apiVersion"] = Value::String(to.api_version().into());
    }
    value.to_string()
}
