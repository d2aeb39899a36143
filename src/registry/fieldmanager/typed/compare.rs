//! The fields added, modified and removed between two objects (structured-merge-diff's `typed/compare.go`), and
//! the field set of a created object against its skeleton.

use super::*;

/// What changed between two objects, as field paths.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

/// The fields added, modified and removed from `lhs` to `rhs` (structured-merge-diff's `Compare`).
pub fn compare(schema: &Schema, lhs: &Value, rhs: &Value) -> Result<Comparison, SchemaError> {
    compare_with_skeleton(schema, lhs, rhs, None)
}

/// [`compare`], where fields of `skeleton` missing on either side count as present with the skeleton's (empty)
/// value, as Go's non-pointer structs always are.
pub fn compare_with_skeleton(
    schema: &Schema,
    lhs: &Value,
    rhs: &Value,
    skeleton: Option<&Value>,
) -> Result<Comparison, SchemaError> {
    let mut c = Comparison::default();
    let mut sets = Triple { added: &mut c.added, modified: &mut c.modified, removed: &mut c.removed };
    compare_children(schema, schema.root(), Some(lhs), Some(rhs), skeleton, &mut Vec::new(), &mut sets)?;
    Ok(c)
}

/// The added, modified and removed sets of one node, built bottom-up (no full paths are copied).
pub(super) struct Triple<'a> {
    added: &'a mut Set,
    modified: &'a mut Set,
    removed: &'a mut Set,
}

pub(super) fn is_empty_value(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Compares one child `pe` of type `t`; records it in the parent's sets.
#[allow(clippy::too_many_arguments)]
pub(super) fn compare_child(
    schema: &Schema,
    t: TypeId,
    pe: PathElement,
    l: Option<&Value>,
    r: Option<&Value>,
    skel: Option<&Value>,
    path: &mut Path,
    parent: &mut Triple<'_>,
) -> Result<(), SchemaError> {
    let (l, r) = (l.or(skel), r.or(skel));
    let leaf = match shape(schema, t, l, r) {
        Shape::Scalar | Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => true,
        Shape::Map { .. } => {
            let not_map = |v: Option<&Value>| v.is_some_and(|v| !v.is_object() && !is_empty_value(Some(v)));
            (is_empty_value(l) && is_empty_value(r)) || not_map(l) || not_map(r)
        }
        Shape::List { .. } => is_empty_value(l) && is_empty_value(r),
    };
    if leaf {
        match (l, r) {
            (None, Some(_)) => parent.added.insert_member(pe),
            (Some(_), None) => parent.removed.insert_member(pe),
            (Some(a), Some(b)) if a != b => parent.modified.insert_member(pe),
            _ => {}
        }
        return Ok(());
    }
    let (mut a, mut m, mut rm) = (Set::new(), Set::new(), Set::new());
    path.push(pe);
    let result = compare_children(
        schema,
        t,
        l,
        r,
        skel,
        path,
        &mut Triple { added: &mut a, modified: &mut m, removed: &mut rm },
    );
    let pe = path.pop().expect("pushed");
    result?;
    match (l, r) {
        (None, Some(_)) => parent.added.insert_member(pe.clone()),
        (Some(_), None) => parent.removed.insert_member(pe.clone()),
        _ => {}
    }
    parent.added.set_child(pe.clone(), a);
    parent.modified.set_child(pe.clone(), m);
    parent.removed.set_child(pe, rm);
    Ok(())
}

/// Compares the children of a map or list node.
pub(super) fn compare_children(
    schema: &Schema,
    t: TypeId,
    l: Option<&Value>,
    r: Option<&Value>,
    skel: Option<&Value>,
    path: &mut Path,
    sets: &mut Triple<'_>,
) -> Result<(), SchemaError> {
    match shape(schema, t, l, r) {
        Shape::Map { schema_map, .. } => {
            let (lm, rm) = (as_map(l), as_map(r));
            let skel_map = skel.and_then(Value::as_object);
            for (k, rv) in rm.into_iter().flatten() {
                let ct = child_type(t, schema_map, k);
                let sk = skel_map.and_then(|s| s.get(k));
                let lv = lm.and_then(|m| m.get(k));
                compare_child(schema, ct, PathElement::Field(k.clone()), lv, Some(rv), sk, path, sets)?;
            }
            for (k, lv) in lm.into_iter().flatten() {
                if rm.is_some_and(|m| m.contains_key(k)) {
                    continue;
                }
                let ct = child_type(t, schema_map, k);
                let sk = skel_map.and_then(|s| s.get(k));
                compare_child(schema, ct, PathElement::Field(k.clone()), Some(lv), None, sk, path, sets)?;
            }
            // Skeleton fields missing on both sides are equal; nothing to record.
        }
        Shape::List { element, kind } => {
            let (li, ri) = (as_list(l), as_list(r));
            let (lpes, lby) = index_items(kind, li, path)?;
            let (rpes, rby) = index_items(kind, ri, path)?;
            for (pe, item) in rpes.into_iter().zip(ri) {
                let lv = lby.get(&pe.encode()).copied();
                compare_child(schema, element, pe, lv, Some(item), None, path, sets)?;
            }
            for (pe, item) in lpes.into_iter().zip(li) {
                if !rby.contains_key(&pe.encode()) {
                    compare_child(schema, element, pe, Some(item), None, None, path, sets)?;
                }
            }
        }
        Shape::Scalar => {}
    }
    Ok(())
}

/// The fields an object sets that [`compare_with_skeleton`] from `{}` would report added or modified: what a
/// create (or a first write of an untracked object) owns, in one walk over `value` and none over another object.
pub fn created_set(schema: &Schema, value: &Value, skeleton: Option<&Value>) -> Result<Set, SchemaError> {
    let mut set = Set::new();
    if let Some(m) = value.as_object() {
        let schema_map = match shape(schema, schema.root(), None, Some(value)) {
            Shape::Map { schema_map, .. } => schema_map,
            _ => None,
        };
        let skel_map = skeleton.and_then(Value::as_object);
        for (k, v) in m {
            let ct = child_type(schema.root(), schema_map, k);
            let sk = skel_map.and_then(|s| s.get(k));
            created_child(schema, ct, PathElement::Field(k.clone()), v, sk, &mut Vec::new(), &mut set)?;
        }
    }
    Ok(set)
}

/// [`compare_child`] of a created value `v` against `base`, its skeleton (or nothing): records `pe` in `parent`
/// when it is new (no base) or differs from its base.
pub(super) fn created_child(
    schema: &Schema,
    t: TypeId,
    pe: PathElement,
    v: &Value,
    base: Option<&Value>,
    path: &mut Path,
    parent: &mut Set,
) -> Result<(), SchemaError> {
    let r = Some(v);
    let leaf = match shape(schema, t, base, r) {
        Shape::Scalar | Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => true,
        Shape::Map { .. } => {
            let not_map = |v: Option<&Value>| v.is_some_and(|v| !v.is_object() && !is_empty_value(Some(v)));
            (is_empty_value(base) && is_empty_value(r)) || not_map(base) || not_map(r)
        }
        Shape::List { .. } => is_empty_value(base) && is_empty_value(r),
    };
    if leaf {
        if base.is_none_or(|b| b != v) {
            parent.insert_member(pe);
        }
        return Ok(());
    }
    let mut own = Set::new();
    path.push(pe);
    let result = created_children(schema, t, v, base, path, &mut own);
    let pe = path.pop().expect("pushed");
    result?;
    if base.is_none() {
        parent.insert_member(pe.clone());
    }
    parent.set_child(pe, own);
    Ok(())
}

/// [`compare_children`] of a created value against its base. Fields only the base has are equal on both sides
/// (the base stands in for a missing field), so they record nothing.
pub(super) fn created_children(
    schema: &Schema,
    t: TypeId,
    v: &Value,
    base: Option<&Value>,
    path: &mut Path,
    set: &mut Set,
) -> Result<(), SchemaError> {
    match shape(schema, t, base, Some(v)) {
        Shape::Map { schema_map, .. } => {
            let base_map = base.and_then(Value::as_object);
            for (k, child) in v.as_object().into_iter().flatten() {
                let ct = child_type(t, schema_map, k);
                let b = base_map.and_then(|m| m.get(k));
                created_child(schema, ct, PathElement::Field(k.clone()), child, b, path, set)?;
            }
        }
        Shape::List { element, kind } => {
            let items = as_list(Some(v));
            let (pes, _) = index_items(kind, items, path)?;
            let base_items = as_list(base);
            let base_by = if base_items.is_empty() { None } else { Some(index_items(kind, base_items, path)?.1) };
            for (pe, item) in pes.into_iter().zip(items) {
                let b = base_by.as_ref().and_then(|by| by.get(&pe.encode()).copied());
                created_child(schema, element, pe, item, b, path, set)?;
            }
        }
        Shape::Scalar => {}
    }
    Ok(())
}
