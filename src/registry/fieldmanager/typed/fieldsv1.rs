//! A created object's field set written straight to FieldsV1 JSON, without building a set
//! (structured-merge-diff's `fieldpath/serialize.go` over `created_set`).

use super::compare::is_empty_value;
use super::*;

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
pub(super) enum Step<'v> {
    Field(&'v str),
    /// A list item, and its FieldsV1 key.
    Item(PathElement, String),
}

pub(super) struct FieldsV1Writer<'s, 'v, 'o> {
    schema: &'s Schema,
    out: &'o mut Vec<u8>,
    steps: Vec<Step<'v>>,
}

/// A value of the schema's type `t`, created over `base`.
#[derive(Clone, Copy)]
pub(super) struct Node<'v> {
    t: TypeId,
    v: &'v Value,
    base: Option<&'v Value>,
}

/// What the walk leaves out below where it is: `ignored` (with everything under its paths) and the exact paths of
/// `strip`.
#[derive(Clone, Copy)]
pub(super) struct Masks<'a> {
    ignored: Option<&'a Set>,
    strip: Option<&'a Set>,
}

/// The masks at one step: whether each has the step as a member, and the masks under it.
pub(super) struct MasksAt<'a> {
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

pub(super) fn json_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
}
