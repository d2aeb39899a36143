//! An applied configuration merged into a live object (structured-merge-diff's `typed/merge.go`).

use super::*;

/// The merge's walker: the configuration wins on every scalar and atomic value it sets.
#[allow(clippy::type_complexity)]
fn walker(
    schema: &Schema,
    keep_live_only: bool,
) -> Walker<
    '_,
    impl FnMut(&Path, Option<&Value>, Option<&Value>) -> Option<Value>,
    impl FnMut(&Path, Option<&Value>, Option<&Value>),
> {
    Walker {
        schema,
        leaf: |_: &Path, l: Option<&Value>, r: Option<&Value>| r.or(l).cloned(),
        node: |_: &Path, _: Option<&Value>, _: Option<&Value>| {},
        keep_live_only,
    }
}

/// `config` merged into `live`: the configuration wins on every field it sets; lists merge by their kind. A keyed
/// list of `live` may repeat a key: the repeats stay unless `config` sets that key, which then replaces them all.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, SchemaError> {
    let merged = walker(schema, false).walk(schema.root(), &mut Vec::new(), Some(live), Some(config))?;
    Ok(merged.unwrap_or_else(|| Value::Object(Map::new())))
}

/// [`merge`] done in place, walking only what `config` sets: what it leaves alone stays in `live` as it is,
/// unchecked. For a `config` that passed [`super::validate`] and a `live` object that went through its type (as
/// every object admission holds), the outcome is [`merge`]'s; a mutating policy's small configuration then costs
/// little on a large object.
pub fn merge_into(schema: &Schema, live: &mut Value, config: &Value) -> Result<(), SchemaError> {
    if !merge_at(schema, schema.root(), &mut Vec::new(), live, config)? {
        *live = Value::Object(Map::new());
    }
    Ok(())
}

/// Whether the merged value stays (the walker's `Some`); `live` holds it.
fn merge_at(
    schema: &Schema,
    t: TypeId,
    path: &mut Path,
    live: &mut Value,
    config: &Value,
) -> Result<bool, SchemaError> {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match shape(schema, t, Some(live), Some(config)) {
        Shape::Map { atomic: false, schema_map } if !(empty(live) && empty(config)) => {
            let comparable = |v: &Value| v.is_object() || empty(v);
            if !comparable(live) || !comparable(config) {
                *live = config.clone();
                return Ok(true);
            }
            if !live.is_object() {
                *live = Value::Object(Map::new());
            }
            let (Value::Object(l), Some(r)) = (live, config.as_object()) else { return Ok(true) };
            for (k, c) in r {
                let ct = child_type(t, schema_map, k);
                match l.get_mut(k) {
                    Some(v) => {
                        path.push(PathElement::Field(k.clone()));
                        let keep = merge_at(schema, ct, path, v, c);
                        path.pop();
                        if !keep? {
                            l.remove(k);
                        }
                    }
                    // Set by the configuration alone: as it is (the walker copies it).
                    None => {
                        l.insert(k.clone(), c.clone());
                    }
                }
            }
            Ok(true)
        }
        // A keyed list or a set: merged item by item as the walker merges them, the live items the configuration
        // does not set kept as they are.
        Shape::List { kind, .. } if *kind != ListKind::Atomic && !(empty(live) && empty(config)) => {
            match walker(schema, true).walk(t, path, Some(live), Some(config))? {
                Some(v) => {
                    *live = v;
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        _ => {
            *live = config.clone();
            Ok(true)
        }
    }
}
