//! Objects seen through the merge schema: their field sets, the difference of two, the merge of an applied
//! configuration into a live object, and removal of fields — structured-merge-diff's `typed` package.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::path::{Path, PathElement};
use super::schema::{ListKind, Schema, Type, TypeId, UNTYPED};
use super::set::Set;

/// What changed between two objects, as field paths.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

/// A shape the schema cannot take (duplicate list keys, a list item without its key fields, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

fn err(path: &Path, message: impl Into<String>) -> SchemaError {
    SchemaError { path: super::path::Display(path).to_string(), message: message.into() }
}

/// Default values of list-map key fields, as the OpenAPI `default` of a key is used for an item that omits it.
fn key_default(field: &str) -> Option<Value> {
    (field == "protocol").then(|| Value::String("TCP".into()))
}

/// How a value is walked: by its declared type, or deduced from its shape when the type is untyped.
enum Shape<'s> {
    Scalar,
    Map { schema_map: Option<(&'s HashMap<String, TypeId>, Option<TypeId>)>, atomic: bool },
    List { element: TypeId, kind: &'s ListKind },
}

/// How lists without a schema are merged.
static UNTYPED_LIST: ListKind = ListKind::Atomic;

fn shape<'s>(schema: &'s Schema, t: TypeId, lhs: Option<&Value>, rhs: Option<&Value>) -> Shape<'s> {
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

fn child_type(t: TypeId, map: Option<(&HashMap<String, TypeId>, Option<TypeId>)>, k: &str) -> TypeId {
    match map {
        Some((fields, element)) => fields.get(k).copied().or(element).unwrap_or(UNTYPED),
        None => t,
    }
}

fn as_map(v: Option<&Value>) -> Option<&Map<String, Value>> {
    v.and_then(Value::as_object)
}

fn as_list(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// The path element of a list item.
fn item_element(kind: &ListKind, item: &Value, index: usize, path: &Path) -> Result<PathElement, SchemaError> {
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

fn index_items<'v>(
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

/// Walks two objects together as structured-merge-diff's merging walker: `leaf` decides scalars and atomic
/// values; `node` sees every other value after its children.
struct Walker<'s, L, N> {
    schema: &'s Schema,
    leaf: L,
    node: N,
}

impl<L, N> Walker<'_, L, N>
where
    L: FnMut(&Path, Option<&Value>, Option<&Value>) -> Option<Value>,
    N: FnMut(&Path, Option<&Value>, Option<&Value>),
{
    fn walk(
        &mut self,
        t: TypeId,
        path: &mut Path,
        lhs: Option<&Value>,
        rhs: Option<&Value>,
    ) -> Result<Option<Value>, SchemaError> {
        let empty = |v: Option<&Value>| match v {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        let out = match shape(self.schema, t, lhs, rhs) {
            Shape::Scalar => return Ok((self.leaf)(path, lhs, rhs)),
            Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => {
                return Ok((self.leaf)(path, lhs, rhs))
            }
            _ if empty(lhs) && empty(rhs) => return Ok((self.leaf)(path, lhs, rhs)),
            Shape::Map { schema_map, .. } => {
                let (l, r) = (as_map(lhs), as_map(rhs));
                if (lhs.is_some() && l.is_none() && !empty(lhs)) || (rhs.is_some() && r.is_none() && !empty(rhs)) {
                    // One side is not a map: the values are not comparable field by field.
                    return Ok((self.leaf)(path, lhs, rhs));
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
                let (lpes, lby) = index_items(kind, l, path)?;
                let (rpes, rby) = index_items(kind, r, path)?;
                let mut out = Vec::with_capacity(l.len().max(r.len()));
                let mut item = |w: &mut Self, pe: &PathElement, path: &mut Path| -> Result<(), SchemaError> {
                    let key = pe.encode();
                    path.push(pe.clone());
                    let v = w.walk(element, path, lby.get(&key).copied(), rby.get(&key).copied());
                    path.pop();
                    if let Some(v) = v? {
                        out.push(v);
                    }
                    Ok(())
                };
                // The order structured-merge-diff keeps: the applied order, with live-only items where they were.
                let mut shared: std::collections::VecDeque<&PathElement> =
                    rpes.iter().filter(|pe| lby.contains_key(&pe.encode())).collect();
                let (mut li, mut ri) = (0, 0);
                while li < lpes.len() || ri < rpes.len() {
                    if li < lpes.len() && ri < rpes.len() {
                        if lpes[li] == rpes[ri] {
                            item(self, &lpes[li], path)?;
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
                        item(self, &lpes[li], path)?;
                        li += 1;
                        continue;
                    }
                    if ri < rpes.len() {
                        item(self, &rpes[ri], path)?;
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
        (self.node)(path, lhs, rhs);
        Ok(out)
    }
}

/// The fields an object sets (structured-merge-diff's `ToFieldSet`).
pub fn to_field_set(schema: &Schema, value: &Value) -> Result<Set, SchemaError> {
    let mut set = Set::new();
    field_set_into(schema, schema.root(), value, &mut Vec::new(), &mut set)?;
    Ok(set)
}

fn field_set_into(schema: &Schema, t: TypeId, v: &Value, path: &mut Path, set: &mut Set) -> Result<(), SchemaError> {
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
struct Triple<'a> {
    added: &'a mut Set,
    modified: &'a mut Set,
    removed: &'a mut Set,
}

fn is_empty_value(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Compares one child `pe` of type `t`; records it in the parent's sets.
#[allow(clippy::too_many_arguments)]
fn compare_child(
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
fn compare_children(
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
fn created_child(
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
fn created_children(
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

/// [`created_set`] less `ignored` (with everything under its paths) and less the exact paths of `strip`, written
/// to `out` as FieldsV1 JSON without building a set. Returns whether any field is left; when none is, nothing is
/// written.
pub fn write_created_fields_v1(
    schema: &Schema,
    value: &Value,
    skeleton: Option<&Value>,
    ignored: &Set,
    strip: &Set,
    out: &mut Vec<u8>,
) -> Result<bool, SchemaError> {
    let start = out.len();
    out.push(b'{');
    let mut w = FieldsV1Writer { schema, out, steps: Vec::new() };
    // The root is compared against `{}`: its fields against the skeleton's.
    let root = schema.root();
    let shape = shape(schema, root, Some(&Value::Object(Map::new())), Some(value));
    let masks = Masks { ignored: Some(ignored), strip: Some(strip) };
    let any = w.children(Node { t: root, v: value, base: skeleton }, shape, masks, true)?;
    if any {
        w.out.push(b'}');
    } else {
        w.out.truncate(start);
    }
    Ok(any)
}

/// One step down from the root, kept cheap: a path is built only for an error.
enum Step<'v> {
    Field(&'v str),
    /// A list item, and its FieldsV1 key.
    Item(PathElement, String),
}

struct FieldsV1Writer<'s, 'v, 'o> {
    schema: &'s Schema,
    out: &'o mut Vec<u8>,
    steps: Vec<Step<'v>>,
}

/// A value of the schema's type `t`, created over `base`.
#[derive(Clone, Copy)]
struct Node<'v> {
    t: TypeId,
    v: &'v Value,
    base: Option<&'v Value>,
}

/// What the walk leaves out below where it is: `ignored` (with everything under its paths) and the exact paths of
/// `strip`.
#[derive(Clone, Copy)]
struct Masks<'a> {
    ignored: Option<&'a Set>,
    strip: Option<&'a Set>,
}

/// The masks at one step: whether each has the step as a member, and the masks under it.
struct MasksAt<'a> {
    ignored: bool,
    strip: bool,
    under: Masks<'a>,
}

impl<'a> Masks<'a> {
    /// The masks at the step that `has` and `child` look up in a set.
    fn at(self, has: impl Fn(&Set) -> bool, child: impl Fn(&'a Set) -> Option<&'a Set>) -> MasksAt<'a> {
        MasksAt {
            ignored: self.ignored.is_some_and(&has),
            strip: self.strip.is_some_and(&has),
            under: Masks { ignored: self.ignored.and_then(&child), strip: self.strip.and_then(&child) },
        }
    }
}

impl<'s, 'v> FieldsV1Writer<'s, 'v, '_> {
    fn path(&self) -> Path {
        let step = |s: &Step<'_>| match s {
            Step::Field(f) => PathElement::Field((*f).to_owned()),
            Step::Item(pe, _) => pe.clone(),
        };
        self.steps.iter().map(step).collect()
    }

    /// Writes the entries of the fields under `node` (of `shape`) that are left after `masks`, `first` when none
    /// precedes them; returns whether it wrote any.
    fn children(
        &mut self,
        node: Node<'v>,
        shape: Shape<'s>,
        masks: Masks<'_>,
        mut first: bool,
    ) -> Result<bool, SchemaError> {
        let Node { t, v, base } = node;
        let mut any = false;
        match shape {
            Shape::Map { schema_map, .. } => {
                let base_map = base.and_then(Value::as_object);
                for (k, child) in v.as_object().into_iter().flatten() {
                    let ct = child_type(t, schema_map, k);
                    let b = base_map.and_then(|m| m.get(k));
                    let at = masks.at(|s| s.has_field(k), |s| s.field_child(k));
                    if self.entry(Node { t: ct, v: child, base: b }, Step::Field(k), at, first)? {
                        (first, any) = (false, true);
                    }
                }
            }
            Shape::List { element, kind } => {
                let mut items = self.keyed_items(kind, as_list(Some(v)))?;
                let base_items = self.keyed_items(kind, as_list(base))?;
                // FieldsV1 orders items by their key, not by their place in the list.
                items.sort_by(|a, b| a.0.cmp(&b.0));
                for (key, pe, item) in items {
                    let b = base_items.iter().find(|(k, _, _)| *k == key).map(|(_, _, b)| *b);
                    let at = masks.at(|s| s.has(std::slice::from_ref(&pe)), |s| s.child(&pe));
                    if self.entry(Node { t: element, v: item, base: b }, Step::Item(pe, key), at, first)? {
                        (first, any) = (false, true);
                    }
                }
            }
            Shape::Scalar => {}
        }
        Ok(any)
    }

    /// The items of a list with their path elements and FieldsV1 keys, failing as [`index_items`] does (the
    /// first item without its keys, or the first repeated key, in list order).
    fn keyed_items(
        &self,
        kind: &ListKind,
        items: &'v [Value],
    ) -> Result<Vec<(String, PathElement, &'v Value)>, SchemaError> {
        let mut out: Vec<(String, PathElement, &Value)> = Vec::with_capacity(items.len());
        let mut seen = std::collections::HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let pe = item_element(kind, item, i, &Vec::new()).map_err(|e| self.at_path(e))?;
            let key = pe.encode();
            // Lists are short: a scan is cheaper than hashing until they are not.
            let repeated =
                if items.len() <= 16 { out.iter().any(|(k, _, _)| *k == key) } else { !seen.insert(key.clone()) };
            if repeated {
                return Err(err(&self.path(), format!("duplicate entries for key {key}")));
            }
            out.push((key, pe, item));
        }
        Ok(out)
    }

    fn at_path(&self, e: SchemaError) -> SchemaError {
        err(&self.path(), e.message)
    }

    /// Writes the entry of one field, left out where `masks` say: `{}` when the field is owned as a whole,
    /// `".": {}` beside what is owned under it.
    fn entry(&mut self, node: Node<'v>, step: Step<'v>, masks: MasksAt<'_>, first: bool) -> Result<bool, SchemaError> {
        let Node { t, v, base } = node;
        let r = Some(v);
        let shape = shape(self.schema, t, base, r);
        let leaf = match shape {
            Shape::Scalar | Shape::Map { atomic: true, .. } | Shape::List { kind: ListKind::Atomic, .. } => true,
            Shape::Map { .. } => {
                let not_map = |v: Option<&Value>| v.is_some_and(|v| !v.is_object() && !is_empty_value(Some(v)));
                (is_empty_value(base) && is_empty_value(r)) || not_map(base) || not_map(r)
            }
            Shape::List { .. } => is_empty_value(base) && is_empty_value(r),
        };
        let member = if leaf { base.is_none_or(|b| b != v) } else { base.is_none() };
        let kept = member && !masks.ignored && !masks.strip;
        let start = self.out.len();
        if !first {
            self.out.push(b',');
        }
        self.key(&step);
        self.out.extend_from_slice(b":{");
        let mut under = false;
        if !leaf {
            let body = self.out.len();
            if kept {
                self.out.extend_from_slice(br#"".":{}"#);
            }
            self.steps.push(step);
            // Walked even when ignored: a shape the schema cannot take fails the write as the set-based walk does.
            let result = self.children(node, shape, masks.under, !kept);
            self.steps.pop();
            under = result?;
            if !under {
                self.out.truncate(body);
            }
        }
        if masks.ignored || (!kept && !under) {
            self.out.truncate(start);
            return Ok(false);
        }
        self.out.push(b'}');
        Ok(true)
    }

    /// The entry's key, as a JSON string.
    fn key(&mut self, step: &Step<'_>) {
        let plain = |s: &str| !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\');
        match step {
            Step::Field(name) if plain(name) => {
                self.out.extend_from_slice(b"\"f:");
                self.out.extend_from_slice(name.as_bytes());
                self.out.push(b'"');
            }
            Step::Field(name) => json_string(self.out, &format!("f:{name}")),
            Step::Item(_, key) => json_string(self.out, key),
        }
    }
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
}

/// `config` merged into `live`: the configuration wins on every field it sets; lists merge by their kind.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, SchemaError> {
    let mut w = Walker {
        schema,
        leaf: |_: &Path, l: Option<&Value>, r: Option<&Value>| r.or(l).cloned(),
        node: |_: &Path, _: Option<&Value>, _: Option<&Value>| {},
    };
    Ok(w.walk(schema.root(), &mut Vec::new(), Some(live), Some(config))?.unwrap_or_else(|| Value::Object(Map::new())))
}

/// `value` without the fields in `set` (a member removes its whole subtree).
pub fn remove_items(schema: &Schema, value: &Value, set: &Set) -> Value {
    remove_in(schema, schema.root(), value, set)
}

fn remove_in(schema: &Schema, t: TypeId, v: &Value, set: &Set) -> Value {
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
fn became_empty(before: &Value, after: &Value) -> bool {
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

fn ensure_in(schema: &Schema, t: TypeId, set: &Set) -> Set {
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

/// Drops fields the schema does not declare; returns their paths.
pub fn prune_unknown(schema: &Schema, value: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    prune_in(schema, schema.root(), value, &mut Vec::new(), &mut dropped);
    dropped
}

fn prune_in(schema: &Schema, t: TypeId, v: &mut Value, path: &mut Path, dropped: &mut Vec<String>) {
    match (schema.get(t), v) {
        (Type::Map { fields, element, .. }, Value::Object(m)) => {
            let unknown: Vec<String> =
                m.keys().filter(|k| element.is_none() && !fields.contains_key(*k)).cloned().collect();
            for k in unknown {
                m.remove(&k);
                path.push(PathElement::Field(k));
                dropped.push(super::path::Display(path).to_string());
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small schema in the shape of a Deployment: a struct, a keyed list, a set, an atomic list, a map, an
    /// atomic struct.
    fn schema() -> Schema {
        let defs = json!({
            "Obj": {"type": "object", "properties": {
                "metadata": {"$ref": "#/components/schemas/Meta"},
                "spec": {"$ref": "#/components/schemas/Spec"},
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}}
            }},
            "Meta": {"type": "object", "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}
            }},
            "Spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object",
                    "additionalProperties": {"type": "string"}}}, "x-kubernetes-map-type": "atomic"},
                "containers": {"type": "array", "items": {"$ref": "#/components/schemas/C"},
                    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
                "strategy": {"type": "object", "properties": {"max": {"type": "integer"}, "min": {"type": "integer"}}}
            }},
            "C": {"type": "object", "properties": {
                "name": {"type": "string"}, "image": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
                "ports": {"type": "array", "items": {"$ref": "#/components/schemas/P"},
                    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["containerPort", "protocol"]}
            }},
            "P": {"type": "object", "properties": {"containerPort": {"type": "integer"}, "protocol": {"type": "string"}}}
        });
        Schema::from_openapi(defs.as_object().unwrap(), "Obj")
    }

    fn fields(s: &Set) -> Value {
        s.to_fields_v1()
    }

    #[test]
    fn field_set_names_leaves_list_items_and_map_entries() {
        let s = schema();
        let obj = json!({
            "metadata": {"labels": {"app": "web"}, "finalizers": ["a"]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "containers": [{"name": "main", "image": "x", "args": ["a"], "ports": [{"containerPort": 80}]}],
                     "strategy": {}}
        });
        let set = to_field_set(&s, &obj).unwrap();
        assert_eq!(
            fields(&set),
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}, "f:finalizers": {"v:\"a\"": {}}},
                "f:spec": {
                    "f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:args": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}},
                    "f:replicas": {}, "f:selector": {}
                }
            })
        );
    }

    #[test]
    fn compare_reports_added_modified_removed_with_new_nodes() {
        let s = schema();
        let a = json!({"spec": {"replicas": 1, "containers": [{"name": "main", "image": "x"}]}});
        let b = json!({"metadata": {"labels": {"app": "w"}}, "spec": {"replicas": 2, "strategy": {"max": 1},
                        "containers": [{"name": "main", "image": "x"}, {"name": "side", "image": "y"}]}});
        let c = compare(&s, &a, &b).unwrap();
        assert_eq!(fields(&c.modified), json!({"f:spec": {"f:replicas": {}}}));
        assert_eq!(
            fields(&c.added),
            json!({"f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}}, "f:spec": {
                "f:containers": {"k:{\"name\":\"side\"}": {".": {}, "f:image": {}, "f:name": {}}},
                "f:strategy": {".": {}, "f:max": {}}}})
        );
        let back = compare(&s, &b, &a).unwrap();
        assert_eq!(fields(&back.removed), fields(&c.added));
    }

    #[test]
    fn created_set_is_what_compare_from_nothing_adds_or_modifies() {
        let s = schema();
        let objects = [
            json!({}),
            json!({"metadata": {"name": "a", "labels": {"app": "web", "tier": ""}, "finalizers": ["x", "y"]},
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "strategy": {"max": 1},
                            "containers": [{"name": "main", "image": "x", "args": ["a", "b"],
                                            "ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}]},
                                           {"name": "side"}]},
                   "status": {"n": 1}, "extra": {"deep": {"er": [1, {"x": null}]}}}),
            // Empty and null values, next to and instead of the skeleton's.
            json!({"metadata": {}, "spec": {"strategy": {}, "containers": [], "replicas": null, "selector": {}},
                   "status": null}),
            json!({"metadata": {"labels": {}}, "spec": {"strategy": null, "containers": [{"name": "a", "args": []}]}}),
            // Values of the wrong shape for their type.
            json!({"metadata": "x", "spec": {"containers": "nope", "strategy": 3, "replicas": {"x": 1}}}),
            json!({"spec": {"containers": [{"name": "a", "ports": 5}], "strategy": ["a"]}, "status": []}),
        ];
        let skeletons = [
            None,
            Some(json!({"metadata": {}, "spec": {"strategy": {}, "containers": null}, "status": {}})),
            Some(json!({"spec": {"strategy": {"max": 1}, "replicas": 2}})),
            Some(
                json!({"spec": {"containers": [{"name": "main", "image": "x"}]}, "metadata": {"labels": {"app": "web"}}}),
            ),
        ];
        for obj in &objects {
            for skel in &skeletons {
                let cmp = compare_with_skeleton(&s, &json!({}), obj, skel.as_ref()).unwrap();
                let created = created_set(&s, obj, skel.as_ref()).unwrap();
                assert_eq!(fields(&created), fields(&cmp.added.union(&cmp.modified)), "{obj} on {skel:?}");
                assert_eq!(created, cmp.added.union(&cmp.modified), "{obj} on {skel:?}");
            }
        }
        let dup = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
        assert!(created_set(&s, &dup, None).unwrap_err().message.contains("duplicate entries"));
        let keyless = json!({"spec": {"containers": [{"image": "a"}]}});
        assert!(created_set(&s, &keyless, None).unwrap_err().message.contains("omits key field \"name\""));
    }

    #[test]
    fn merge_applies_config_over_live_by_list_kind() {
        let s = schema();
        let live = json!({"spec": {"replicas": 1, "selector": {"matchLabels": {"a": "1", "b": "2"}},
            "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "y"}]},
            "metadata": {"labels": {"keep": "1"}, "finalizers": ["f1"]}});
        let config = json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "1"}},
            "containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]},
            "metadata": {"labels": {"new": "2"}, "finalizers": ["f2"]}});
        let merged = merge(&s, &live, &config).unwrap();
        assert_eq!(
            merged,
            json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "1"}},
                "containers": [{"name": "a", "image": "x", "args": ["1", "2"]}, {"name": "b", "image": "z"},
                               {"name": "c", "image": "w"}]},
                "metadata": {"labels": {"keep": "1", "new": "2"}, "finalizers": ["f1", "f2"]}})
        );
    }

    #[test]
    fn removal_drops_subtrees_and_emptied_maps() {
        let s = schema();
        let obj = json!({"metadata": {"labels": {"app": "w"}}, "spec": {"replicas": 2,
            "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let mut set = Set::new();
        set.insert(&[
            PathElement::Field("metadata".into()),
            PathElement::Field("labels".into()),
            PathElement::Field("app".into()),
        ]);
        set.insert(&[
            PathElement::Field("spec".into()),
            PathElement::Field("containers".into()),
            PathElement::Key(vec![("name".into(), json!("b"))]),
        ]);
        let out = remove_items(&s, &obj, &set);
        // The labels map emptied, and the metadata with it.
        assert_eq!(out, json!({"spec": {"replicas": 2, "containers": [{"name": "a", "image": "x"}]}}));
        let ensured = ensure_named_fields_are_members(&s, &set);
        assert!(ensured.has(&[PathElement::Field("metadata".into())]));
        assert!(ensured.has(&[PathElement::Field("metadata".into()), PathElement::Field("labels".into())]));
        // `containers` is a struct field above a member, so it becomes one; list items do not add their list.
        assert!(ensured.has(&[PathElement::Field("spec".into()), PathElement::Field("containers".into())]));
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let s = schema();
        let dup = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
        assert!(to_field_set(&s, &dup).unwrap_err().message.contains("duplicate entries"));
        let keyless = json!({"spec": {"containers": [{"image": "a"}]}});
        assert!(to_field_set(&s, &keyless).unwrap_err().message.contains("omits key field \"name\""));
        let wrong = json!({"spec": {"containers": "nope", "replicas": {"x": 1}}});
        assert!(to_field_set(&s, &wrong).is_ok());
        assert!(merge(&s, &dup, &json!({})).is_err());
        let mut unknown = json!({"spec": {"bogus": 1, "containers": [{"name": "a", "nope": true}]}});
        assert_eq!(prune_unknown(&s, &mut unknown), [".spec.bogus", ".spec.containers[0].nope"]);
        assert_eq!(unknown, json!({"spec": {"containers": [{"name": "a"}]}}));
    }
}
