//! An applied configuration merged into a live object (structured-merge-diff's `typed/merge.go`).

use super::*;

/// `config` merged into `live`: the configuration wins on every field it sets; lists merge by their kind. A keyed
/// list of `live` may repeat a key: the repeats stay unless `config` sets that key, which then replaces them all.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, SchemaError> {
    let mut w = Walker {
        schema,
        leaf: |_: &Path, l: Option<&Value>, r: Option<&Value>| r.or(l).cloned(),
        node: |_: &Path, _: Option<&Value>, _: Option<&Value>| {},
    };
    Ok(w.walk(schema.root(), &mut Vec::new(), Some(live), Some(config))?.unwrap_or_else(|| Value::Object(Map::new())))
}
