//! Fields the schema does not declare, dropped.

use super::*;

/// Drops fields the schema does not declare; returns their paths.
pub fn prune_unknown(schema: &Schema, value: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    prune_in(schema, schema.root(), value, &mut Vec::new(), &mut dropped);
    dropped
}

pub(super) fn prune_in(schema: &Schema, t: TypeId, v: &mut Value, path: &mut Path, dropped: &mut Vec<String>) {
    match (schema.get(t), v) {
        (Type::Map { fields, element, .. }, Value::Object(m)) => {
            let unknown: Vec<String> =
                m.keys().filter(|k| element.is_none() && !fields.contains_key(*k)).cloned().collect();
            for k in unknown {
                m.remove(&k);
                path.push(PathElement::Field(k));
                dropped.push(crate::registry::fieldmanager::path::Display(path).to_string());
                path.pop();
            }
            for (k, child) in m.iter_mut() {
                if let Some(ct) = fields.get(k).copied().or(*element) {
                    path.push(PathElement::Field(k.clone()));
                    prune_in(schema, ct, child, path, dropped);
                    path.pop();
                }
            }
        }
        (Type::List { element, .. }, Value::Array(items)) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(PathElement::Index(i));
                prune_in(schema, *element, item, path, dropped);
                path.pop();
            }
        }
        _ => {}
    }
}
