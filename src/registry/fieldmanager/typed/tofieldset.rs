//! The fields an object sets (structured-merge-diff's `typed/tofieldset.go`).

use super::*;

/// The fields an object sets (structured-merge-diff's `ToFieldSet`).
pub fn to_field_set(schema: &Schema, value: &Value) -> Result<Set, SchemaError> {
    let mut set = Set::new();
    field_set_into(schema, schema.root(), value, &mut Vec::new(), &mut set)?;
    Ok(set)
}

pub(super) fn field_set_into(
    schema: &Schema,
    t: TypeId,
    v: &Value,
    path: &mut Path,
    set: &mut Set,
) -> Result<(), SchemaError> {
    match shape(schema, t, None, Some(v)) {
        Shape::Scalar => set.insert(path),
        Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => set.insert(path),
        Shape::Map { schema_map, .. } => {
            let Some(m) = v.as_object() else { return Ok(()) };
            for (k, child) in m {
                let ct = child_type(t, schema_map, k);
                path.push(PathElement::Field(k.clone()));
                field_set_into(schema, ct, child, path, set)?;
                // Map entries are owned themselves; struct fields only through what they hold.
                if !schema_map.is_some_and(|(fields, _)| fields.contains_key(k)) {
                    set.insert(path);
                }
                path.pop();
            }
        }
        Shape::List { element, kind } => {
            let Some(items) = v.as_array() else { return Ok(()) };
            let (pes, _) = index_items(kind, items, path)?;
            for (item, pe) in items.iter().zip(pes) {
                path.push(pe);
                field_set_into(schema, element, item, path, set)?;
                set.insert(path);
                path.pop();
            }
        }
    }
    Ok(())
}
