//! Objects seen through the merge schema — structured-merge-diff's `typed` package, one job a file: their field
//! sets ([`tofieldset`]), the difference of two ([`compare`]), a created object's field set written straight as
//! FieldsV1 ([`fieldsv1`]), the merge of an applied configuration into a live object ([`merge`]), removal of fields
//! ([`remove`]) and pruning of undeclared ones ([`prune`]); and for an apply configuration a mutating admission
//! policy merges, its check against the schema ([`validate`]) and the atomic values it sets ([`atomics`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::path::{Path, PathElement};
use super::schema::{ListKind, Schema, Type, TypeId, UNTYPED};
use super::set::Set;

mod atomics;
mod compare;
mod fieldsv1;
mod merge;
mod prune;
mod remove;
#[cfg(test)]
mod tests;
mod tofieldset;
mod validate;

pub use atomics::find_atomics;
pub use compare::{compare, compare_with_skeleton, created_set, Comparison};
pub use fieldsv1::write_created_fields_v1;
pub use merge::{merge, merge_into};
pub use prune::prune_unknown;
pub use remove::{ensure_named_fields_are_members, remove_items};
pub use tofieldset::to_field_set;
pub use validate::{validate, ValidationErrors};

/// A shape the schema cannot take (duplicate list keys, a list item without its key fields, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

pub(super) fn err(path: &Path, message: impl Into<String>) -> SchemaError {
    SchemaError { path: super::path::Display(path).to_string(), message: message.into() }
}

/// Default values of list-map key fields, as the OpenAPI `default` of a key is used for an item that omits it.
pub(super) fn key_default(field: &str) -> Option<Value> {
    (field == "protocol").then(|| Value::String("TCP".into()))
}

/// How a value is walked: by its declared type, or deduced from its shape when the type is untyped.
pub(super) enum Shape<'s> {
    Scalar,
    Map { schema_map: Option<(&'s HashMap<String, TypeId>, Option<TypeId>)>, atomic: bool },
    List { element: TypeId, kind: &'s ListKind },
}

/// How lists without a schema are merged.
static UNTYPED_LIST: ListKind = ListKind::Atomic;

pub(super) fn shape<'s>(schema: &'s Schema, t: TypeId, lhs: Option<&Value>, rhs: Option<&Value>) -> Shape<'s> {
    match schema.get(t) {
        Type::Scalar => Shape::Scalar,
        Type::Map { fields, element, atomic } => Shape::Map { schema_map: Some((fields, *element)), atomic: *atomic },
        Type::List { element, kind } => Shape::List { element: *element, kind },
        Type::Untyped => {
            let v = rhs.filter(|v| !v.is_null()).or(lhs);
            match v {
                Some(Value::Object(_)) => Shape::Map { schema_map: None, atomic: false },
                Some(Value::Array(_)) => Shape::List { element: t, kind: &UNTYPED_LIST },
                _ => Shape::Scalar,
            }
        }
    }
}

pub(super) fn child_type(t: TypeId, map: Option<(&HashMap<String, TypeId>, Option<TypeId>)>, k: &str) -> TypeId {
    match map {
        Some((fields, element)) => fields.get(k).copied().or(element).unwrap_or(UNTYPED),
        None => t,
    }
}

pub(super) fn as_map(v: Option<&Value>) -> Option<&Map<String, Value>> {
    v.and_then(Value::as_object)
}

pub(super) fn as_list(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// The path element of a list item.
pub(super) fn item_element(
    kind: &ListKind,
    item: &Value,
    index: usize,
    path: &Path,
) -> Result<PathElement, SchemaError> {
    match kind {
        ListKind::Atomic => Ok(PathElement::Index(index)),
        ListKind::Set => match item {
            Value::Object(_) | Value::Array(_) => Err(err(path, "a set can only hold scalars")),
            v => Ok(PathElement::Value(v.clone())),
        },
        ListKind::Map(keys) if keys.is_empty() => Ok(PathElement::Value(item.clone())),
        ListKind::Map(keys) => {
            let m = item.as_object().ok_or_else(|| err(path, "an item of a keyed list must be an object"))?;
            let mut fields = Vec::with_capacity(keys.len());
            for k in keys {
                match m.get(k).filter(|v| !v.is_null()).cloned().or_else(|| key_default(k)) {
                    Some(v) => fields.push((k.clone(), v)),
                    None => {
                        return Err(err(
                            path,
                            format!(
                                "element {index}: associative list with keys has an element that omits key field {k:?}"
                            ),
                        ))
                    }
                }
            }
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(PathElement::Key(fields))
        }
    }
}

pub(super) fn index_items<'v>(
    kind: &ListKind,
    items: &'v [Value],
    path: &Path,
) -> Result<(Vec<PathElement>, HashMap<String, &'v Value>), SchemaError> {
    let mut pes = Vec::with_capacity(items.len());
    let mut by_pe = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pe = item_element(kind, item, i, path)?;
        if by_pe.insert(pe.encode(), item).is_some() {
            return Err(err(path, format!("duplicate entries for key {}", pe.encode())));
        }
        pes.push(pe);
    }
    Ok((pes, by_pe))
}

/// A live list's items by their encoded path element; `None` for a key the list repeats.
pub(super) type LiveItems<'v> = HashMap<String, Option<&'v Value>>;

/// The items of a live list, as structured-merge-diff's merge indexes its left side: a key may repeat (kube-apiserver
/// keeps objects with duplicate `env` names, say), and a repeated key stands for no single item (`None`).
pub(super) fn index_live_items<'v>(
    kind: &ListKind,
    items: &'v [Value],
    path: &Path,
) -> Result<(Vec<PathElement>, LiveItems<'v>), SchemaError> {
    let mut pes = Vec::with_capacity(items.len());
    let mut by_pe = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pe = item_element(kind, item, i, path)?;
        by_pe.entry(pe.encode()).and_modify(|v| *v = None).or_insert(Some(item));
        pes.push(pe);
    }
    Ok((pes, by_pe))
}
