//! Where field management (managedFields, server-side apply) hooks into the write path: `manage_fields` records an
//! update or merges an apply; a plain create's entry is written out directly by `created_managed_fields`.

use serde_json::Value;

use super::error::Result;
use super::fieldmanager::{Operation, Subresource};
use super::options::WriteOptions;
use super::strategy::{now_text, version_of, Strategy};
use crate::api::resource::ServedVersion;

/// Whether a write sent managedFields of its own (which a create keeps, or which reset them).
pub(crate) fn sent_managed_fields(new: &Value) -> bool {
    new.get("metadata").and_then(|m| m.get("managedFields")).is_some_and(|m| !m.is_null())
}

/// The managedFields of a create by `opts.field_manager` of `new`, sent without managedFields, as the JSON to
/// store beside it: what `manage_fields` would record, written out directly. `None` when there is nothing to
/// record, or (logged) when the schema cannot take the object, which then loses field tracking as there.
pub(crate) fn created_managed_fields<S: Strategy>(
    new: &mut Value,
    opts: &WriteOptions,
    version: S::Version,
) -> Option<String> {
    S::field_manager(version).created_managed_fields(new, &opts.field_manager, &now_text()).unwrap_or_else(|e| {
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
pub(crate) fn manage_fields<S: Strategy>(
    live: Option<&Value>,
    new: Value,
    opts: &WriteOptions,
    op: Operation,
    sub: Subresource,
    version: S::Version,
) -> Result<Value> {
    let fm = S::field_manager(version);
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
fn rename_fields<S: Strategy>(object: &mut Value, version: S::Version, forth: bool) {
    let Some(entries) = object.pointer_mut("/metadata/managedFields").and_then(Value::as_array_mut) else { return };
    for e in entries {
        let Some(recorded) = e.get("apiVersion").and_then(Value::as_str).and_then(version_of::<S>) else {
            continue;
        };
        if recorded == version {
            continue;
        }
        let (from, to) = if forth { (recorded, version) } else { (version, recorded) };
        if let Some(fields) = e.get_mut("fieldsV1") {
            S::convert_fields(fields, from, to);
        }
    }
}

/// Field management of a write made in `version` to an object stored in `storage` (`current`, `None` on create),
/// as kube-apiserver records it: every entry stays in the version it was recorded in (an update's entry is one per
/// manager and version, an apply's one per manager, in the version it last applied with), while the write's field
/// management compares them all as `version` names fields. `new` is the object (or an apply's configuration) in
/// `version`; the result is in `storage`.
pub(crate) fn manage_fields_in<S: Strategy>(
    current: Option<&super::Stored>,
    mut new: Value,
    opts: &WriteOptions,
    op: Operation,
    sub: Subresource,
    version: S::Version,
    storage: S::Version,
) -> Result<Value> {
    let live = match current {
        Some(c) => {
            let mut live = c.to_version(version.to_index())?.to_value()?;
            rename_fields::<S>(&mut live, version, true);
            Some(live)
        }
        None => None,
    };
    // Sent managedFields are compared with the live ones, so they are read the same way.
    rename_fields::<S>(&mut new, version, true);
    let mut out = manage_fields::<S>(live.as_ref(), new, opts, op, sub, version)?;
    rename_fields::<S>(&mut out, version, false);
    S::INFO.convert_value(&mut out, version.to_index(), storage.to_index());
    Ok(out)
}

/// A create's managedFields (as [`created_managed_fields`] writes them, for `from`) as a write in `to` records them:
/// the same fields, named as `to` names them. Text, as they are stored; parsed only when a field differs.
pub(crate) fn created_in_version<S: Strategy>(entries: String, from: S::Version, to: S::Version) -> String {
    if from == to {
        return entries;
    }
    let api_version = |v: S::Version| S::INFO.version(v.to_index()).api_version;
    let (old, new) =
        (format!("\"apiVersion\":\"{}\"", api_version(from)), format!("\"apiVersion\":\"{}\"", api_version(to)));
    // Fields that read the same in every version keep their names.
    if (S::INFO.conversion.version_neutral)(entries.as_bytes()) {
        return entries.replacen(&old, &new, 1);
    }
    let Ok(mut value) = serde_json::from_str::<Value>(&entries) else { return entries };
    for e in value.as_array_mut().into_iter().flatten() {
        if let Some(fields) = e.get_mut("fieldsV1") {
            S::convert_fields(fields, from, to);
        }
        e["apiVersion"] = Value::String(api_version(to).into());
    }
    value.to_string()
}
