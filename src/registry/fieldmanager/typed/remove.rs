//! Fields removed from an object (structured-merge-diff's `typed/remove.go`), and the struct fields a removal
//! empties.

use super::*;

/// `value` without the fields in `set` (a member removes its whole subtree).
pub fn remove_items(schema: &Schema, value: &Value, set: &Set) -> Value {
    remove_in(schema, schema.root(), value, set)
}

pub(super) fn remove_in(schema: &Schema, t: TypeId, v: &Value, set: &Set) -> Value {
    match shape(schema, t, None, Some(v)) {
        Shape::Scalar | Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => v.clone(),
        Shape::Map { schema_map, .. } => {
            let Some(m) = v.as_object() else { return v.clone() };
            let mut out = Map::new();
            for (k, child) in m {
                let pe = PathElement::Field(k.clone());
                if set.members().any(|m| *m == pe) {
                    continue;
                }
                let child = match set.child(&pe) {
                    Some(sub) => {
                        let ct = child_type(t, schema_map, k);
                        let pruned = remove_in(schema, ct, child, sub);
                        if became_empty(child, &pruned) {
                            continue;
                        }
                        pruned
                    }
                    None => child.clone(),
                };
                out.insert(k.clone(), child);
            }
            Value::Object(out)
        }
        Shape::List { element, kind } => {
            let Some(items) = v.as_array() else { return v.clone() };
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Ok(pe) = item_element(kind, item, i, &Vec::new()) else {
                    out.push(item.clone());
                    continue;
                };
                if set.members().any(|m| *m == pe) {
                    continue;
                }
                match set.child(&pe) {
                    Some(sub) => out.push(remove_in(schema, element, item, sub)),
                    None => out.push(item.clone()),
                }
            }
            Value::Array(out)
        }
    }
}

/// A map or list emptied by a removal goes too, as Go's `omitempty` would drop it.
pub(super) fn became_empty(before: &Value, after: &Value) -> bool {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => !b.is_empty() && a.is_empty(),
        (Value::Array(b), Value::Array(a)) => !b.is_empty() && a.is_empty(),
        _ => false,
    }
}

/// `set` plus every struct field that has members below it (structured-merge-diff's
/// `EnsureNamedFieldsAreMembers`), so that removing the set removes emptied structs too.
pub fn ensure_named_fields_are_members(schema: &Schema, set: &Set) -> Set {
    ensure_in(schema, schema.root(), set)
}

pub(super) fn ensure_in(schema: &Schema, t: TypeId, set: &Set) -> Set {
    let mut out = Set::new();
    for m in set.members() {
        out.insert_member(m.clone());
    }
    for (pe, child) in set.children() {
        let ct = match (pe, schema.get(t)) {
            (PathElement::Field(name), Type::Map { .. }) => {
                if schema.is_struct_field(t, name) {
                    out.insert_member(pe.clone());
                }
                schema.field(t, name).unwrap_or(UNTYPED)
            }
            (_, Type::List { element, .. }) => *element,
            _ => UNTYPED,
        };
        out.set_child(pe.clone(), ensure_in(schema, ct, child));
    }
    out
}
