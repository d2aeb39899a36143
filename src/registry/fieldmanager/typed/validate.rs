//! A value checked against the schema (structured-merge-diff's `typed/validate.go`, as kube's type converter runs
//! it on an object it makes typed): every field is declared, maps are maps and lists are lists, a keyed list has
//! its keys, each once.
//!
//! The schema has no scalar kinds (a string, an integer and a boolean are all [`Type::Scalar`]), so a scalar of the
//! wrong kind passes here, where structured-merge-diff says `expected string, got …`; the typed decode that
//! follows every merge refuses it.

use std::collections::HashSet;
use std::fmt;

use super::super::path::Display;
use super::*;

/// What a check found, printed as structured-merge-diff prints its `ValidationErrors`: one as `<path>: <message>`,
/// several under `errors:`, one a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<SchemaError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |e: &SchemaError| match e.path.as_str() {
            "" => e.message.clone(),
            path => format!("{path}: {}", e.message),
        };
        match self.0.as_slice() {
            [e] => f.write_str(&one(e)),
            all => {
                f.write_str("errors:")?;
                all.iter().try_for_each(|e| write!(f, "\n  {}", one(e)))
            }
        }
    }
}

impl std::error::Error for ValidationErrors {}

/// Checks `value` against the schema's root type.
pub fn validate(schema: &Schema, value: &Value) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    check(schema, schema.root(), value, &mut Vec::new(), &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

fn check(schema: &Schema, t: TypeId, v: &Value, path: &mut Path, errors: &mut Vec<SchemaError>) {
    if v.is_null() {
        return;
    }
    match schema.get(t) {
        // Anything goes where there is no schema: maps are walked as maps of anything, lists are atomic.
        Type::Untyped => {}
        Type::Scalar => {
            if v.is_object() || v.is_array() {
                errors.push(err(path, format!("expected scalar, got {v}")));
            }
        }
        Type::Map { fields, element, .. } => {
            let Some(m) = v.as_object() else {
                errors.push(err(path, format!("expected map, got {v}")));
                return;
            };
            for (k, child) in m {
                path.push(PathElement::Field(k.clone()));
                let declared = fields.get(k).copied().or(*element);
                match declared {
                    Some(ct) => check(schema, ct, child, path, errors),
                    None => errors.push(err(path, "field not declared in schema")),
                }
                path.pop();
                // structured-merge-diff stops at a map's first undeclared field.
                if declared.is_none() {
                    return;
                }
            }
        }
        Type::List { element, kind } => {
            let Some(items) = v.as_array() else {
                errors.push(err(path, format!("expected list, got {v}")));
                return;
            };
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let pe = match item_element(kind, item, i, path) {
                    Ok(pe) => pe,
                    Err(e) => {
                        errors.push(e);
                        return;
                    }
                };
                if !matches!(kind, ListKind::Atomic) && !seen.insert(pe.encode()) {
                    let key = Display(std::slice::from_ref(&pe)).to_string();
                    errors.push(err(path, format!("duplicate entries for key {key}")));
                }
                path.push(pe);
                check(schema, *element, item, path, errors);
                path.pop();
            }
        }
    }
}
