//! The atomic values a patch sets (k8s.io/apiserver's `findAtomics` in `policy/mutating/patch/smd.go`): a mutating
//! admission policy may not set an atomic list, map or struct, as merging one replaces it whole and would drop
//! what the policy did not repeat.

use super::super::path::Display;
use super::*;

/// The paths of every atomic list, map or struct in `value` walked by the schema, as kube prints them
/// (`.spec.selector`, `.spec.template.spec.containers[0].args`: list items by index, whatever the list's kind).
/// Only declared struct fields are walked into, never map entries.
pub fn find_atomics(schema: &Schema, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, Some(schema.root()), value, &mut Vec::new(), &mut out);
    out
}

/// `t` is `None` inside a list without a schema, where every map and list is atomic (structured-merge-diff's
/// `__untyped_atomic_`).
fn walk(schema: &Schema, t: Option<TypeId>, v: &Value, path: &mut Path, out: &mut Vec<String>) {
    let here = |path: &Path, out: &mut Vec<String>| out.push(Display(path).to_string());
    match (t.map(|t| schema.get(t)), v) {
        (Some(Type::Map { fields, atomic, .. }), Value::Object(m)) => {
            if *atomic {
                here(path, out);
            }
            for (k, child) in m {
                if let Some(ct) = fields.get(k) {
                    path.push(PathElement::Field(k.clone()));
                    walk(schema, Some(*ct), child, path, out);
                    path.pop();
                }
            }
        }
        (Some(Type::List { element, kind }), Value::Array(items)) => {
            if *kind == ListKind::Atomic {
                here(path, out);
            }
            for (i, item) in items.iter().enumerate() {
                path.push(PathElement::Index(i));
                walk(schema, Some(*element), item, path, out);
                path.pop();
            }
        }
        // A list without a schema is atomic, and so is all it holds.
        (Some(Type::Untyped) | None, Value::Array(items)) => {
            here(path, out);
            for (i, item) in items.iter().enumerate() {
                path.push(PathElement::Index(i));
                walk(schema, None, item, path, out);
                path.pop();
            }
        }
        (None, Value::Object(_)) => here(path, out),
        _ => {}
    }
}
