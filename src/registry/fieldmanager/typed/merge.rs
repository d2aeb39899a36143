//! An applied configuration merged into a live object (structured-merge-diff's `typed/merge.go`).

use super::*;

/// `config` merged into `live`: the configuration wins on every field it sets; lists merge by their kind. A keyed
/// list of `live` may repeat a key: the repeats stay unless `config` sets that key, which then replaces them all.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, SchemaError> {
    let merged =
        Walker { schema, keep_live_only: false }.walk(schema.root(), &mut Vec::new(), Some(live), Some(config))?;
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
    let empty = |v: &Value| empty(Some(v));
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
            let mut walker = Walker { schema, keep_live_only: true };
            match walker.walk(t, path, Some(live), Some(config))? {
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

/// Walks a live object and a configuration together as structured-merge-diff's merging walker: the configuration
/// wins on every scalar and atomic value it sets.
struct Walker<'s> {
    schema: &'s Schema,
    /// A value only the live side has is kept as it is, not walked (see [`merge_into`]).
    keep_live_only: bool,
}

/// A scalar or atomic value: the configuration's, else the live one.
fn leaf(lhs: Option<&Value>, rhs: Option<&Value>) -> Option<Value> {
    rhs.or(lhs).cloned()
}

/// Null, or a map or list with nothing in it.
fn empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

impl Walker<'_> {
    fn walk(
        &mut self,
        t: TypeId,
        path: &mut Path,
        lhs: Option<&Value>,
        rhs: Option<&Value>,
    ) -> Result<Option<Value>, SchemaError> {
        if self.keep_live_only && rhs.is_none() {
            return Ok(lhs.cloned());
        }
        let out = match shape(self.schema, t, lhs, rhs) {
            Shape::Scalar => return Ok(leaf(lhs, rhs)),
            Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => return Ok(leaf(lhs, rhs)),
            _ if empty(lhs) && empty(rhs) => return Ok(leaf(lhs, rhs)),
            Shape::Map { schema_map, .. } => {
                let (l, r) = (as_map(lhs), as_map(rhs));
                if (lhs.is_some() && l.is_none() && !empty(lhs)) || (rhs.is_some() && r.is_none() && !empty(rhs)) {
                    // One side is not a map: the values are not comparable field by field.
                    return Ok(leaf(lhs, rhs));
                }
                let mut out = Map::new();
                let keys = l.into_iter().flat_map(|m| m.keys()).chain(r.into_iter().flat_map(|m| m.keys()));
                let mut seen = std::collections::HashSet::new();
                for k in keys {
                    if !seen.insert(k.as_str()) {
                        continue;
                    }
                    let ct = child_type(t, schema_map, k);
                    path.push(PathElement::Field(k.clone()));
                    let v = self.walk(ct, path, l.and_then(|m| m.get(k)), r.and_then(|m| m.get(k)));
                    path.pop();
                    if let Some(v) = v? {
                        out.insert(k.clone(), v);
                    }
                }
                (!out.is_empty()).then_some(Value::Object(out))
            }
            Shape::List { element, kind } => {
                let (l, r) = (as_list(lhs), as_list(rhs));
                let (lpes, lby) = index_live_items(kind, l, path)?;
                let (rpes, rby) = index_items(kind, r, path)?;
                let mut out = Vec::with_capacity(l.len().max(r.len()));
                // `live`: the live item merged with the applied one of the same key, if any.
                let mut item = |w: &mut Self, pe: &PathElement, live: Option<&Value>, path: &mut Path| {
                    path.push(pe.clone());
                    let v = w.walk(element, path, live, rby.get(&pe.encode()).copied());
                    path.pop();
                    if let Some(v) = v? {
                        out.push(v);
                    }
                    Ok::<(), SchemaError>(())
                };
                // A key the live list repeats merges with no live item: the applied one replaces them all.
                let live = |pe: &PathElement| lby.get(&pe.encode()).copied().flatten();
                // The order structured-merge-diff keeps: the applied order, with live-only items where they were.
                let mut shared: std::collections::VecDeque<&PathElement> =
                    rpes.iter().filter(|pe| lby.contains_key(&pe.encode())).collect();
                let (mut li, mut ri) = (0, 0);
                while li < lpes.len() || ri < rpes.len() {
                    if li < lpes.len() && ri < rpes.len() {
                        if lpes[li] == rpes[ri] {
                            item(self, &lpes[li], live(&lpes[li]), path)?;
                            if shared.front() == Some(&&lpes[li]) {
                                shared.pop_front();
                            }
                            li += 1;
                            ri += 1;
                            continue;
                        }
                        let in_rhs = rby.contains_key(&lpes[li].encode());
                        if in_rhs && shared.front().is_some_and(|n| **n != lpes[li]) {
                            li += 1;
                            continue;
                        }
                    }
                    if li < lpes.len() && !rby.contains_key(&lpes[li].encode()) {
                        // The item itself: its key may repeat, and each repeat stays as it is.
                        item(self, &lpes[li], Some(&l[li]), path)?;
                        li += 1;
                        continue;
                    }
                    if ri < rpes.len() {
                        item(self, &rpes[ri], live(&rpes[ri]), path)?;
                        if shared.front() == Some(&&rpes[ri]) {
                            shared.pop_front();
                        }
                        ri += 1;
                    } else {
                        // Only live items already merged remain.
                        li += 1;
                    }
                }
                (!out.is_empty()).then_some(Value::Array(out))
            }
        };
        Ok(out)
    }
}
