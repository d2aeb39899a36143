//! The merge schema: what structured-merge-diff needs to know of each type, read from the published OpenAPI
//! definitions as kube-apiserver reads its own (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`, and the older `x-kubernetes-patch-strategy: merge` + `x-kubernetes-patch-merge-key`).

use std::collections::HashMap;

use serde_json::{Map, Value};

pub type TypeId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced as a whole; owned as one field.
    Atomic,
    /// Scalars, each item owned on its own (`v:`).
    Set,
    /// Objects identified by these fields (`k:`).
    Map(Vec<String>),
}

#[derive(Debug, Clone)]
pub enum Type {
    Scalar,
    /// No schema (e.g. `RawExtension`): maps are granular, lists atomic, as structured-merge-diff deduces.
    Untyped,
    /// A struct (`fields`) or a map (`element`), or both.
    Map {
        fields: HashMap<String, TypeId>,
        element: Option<TypeId>,
        atomic: bool,
    },
    List {
        element: TypeId,
        kind: ListKind,
    },
}

#[derive(Debug, Clone)]
pub struct Schema {
    types: Vec<Type>,
    root: TypeId,
}

const SCALAR: TypeId = 0;
/// The type of values without a schema.
pub const UNTYPED: TypeId = 1;

impl Schema {
    /// Builds the schema of `root` from OpenAPI v3 component schemas.
    pub fn from_openapi(definitions: &Map<String, Value>, root: &str) -> Schema {
        let mut b = Builder { defs: definitions, types: vec![Type::Scalar, Type::Untyped], named: HashMap::new() };
        let root = b.named(root);
        Schema { types: b.types, root }
    }

    pub fn root(&self) -> TypeId {
        self.root
    }

    pub fn get(&self, id: TypeId) -> &Type {
        &self.types[id]
    }

    /// The type of field `name` in a map or struct type; `None` when it is not declared.
    pub fn field(&self, id: TypeId, name: &str) -> Option<TypeId> {
        match &self.types[id] {
            Type::Map { fields, element, .. } => fields.get(name).copied().or(*element),
            Type::Untyped => Some(UNTYPED),
            _ => None,
        }
    }

    /// Whether `name` is a declared struct field (not a map entry).
    pub fn is_struct_field(&self, id: TypeId, name: &str) -> bool {
        matches!(&self.types[id], Type::Map { fields, .. } if fields.contains_key(name))
    }
}

struct Builder<'a> {
    defs: &'a Map<String, Value>,
    types: Vec<Type>,
    named: HashMap<String, TypeId>,
}

impl Builder<'_> {
    fn named(&mut self, name: &str) -> TypeId {
        if let Some(id) = self.named.get(name) {
            return *id;
        }
        let Some(def) = self.defs.get(name) else { return UNTYPED };
        // Reserve the id first: definitions may refer to themselves.
        let id = self.types.len();
        self.types.push(Type::Untyped);
        self.named.insert(name.to_owned(), id);
        let t = self.build(def);
        self.types[id] = t;
        id
    }

    fn reference(&mut self, s: &Value) -> Option<TypeId> {
        let r = s.get("$ref").or_else(|| s.get("allOf")?.as_array()?.first()?.get("$ref"))?.as_str()?;
        let name = r.rsplit('/').next()?;
        Some(self.named(name))
    }

    fn of(&mut self, s: &Value) -> TypeId {
        if let Some(id) = self.reference(s) {
            return id;
        }
        let t = self.build(s);
        match t {
            Type::Scalar => SCALAR,
            Type::Untyped => UNTYPED,
            t => {
                self.types.push(t);
                self.types.len() - 1
            }
        }
    }

    fn build(&mut self, s: &Value) -> Type {
        if let Some(id) = self.reference(s) {
            return self.types[id].clone();
        }
        let ext = |k: &str| s.get(k).and_then(Value::as_str);
        if s.get("x-kubernetes-int-or-string").is_some() {
            return Type::Scalar;
        }
        if let Some(items) = s.get("items") {
            let element = self.of(items);
            let kind = match ext("x-kubernetes-list-type") {
                Some("set") => ListKind::Set,
                Some("map") => ListKind::Map(
                    s.get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
                        .unwrap_or_default(),
                ),
                Some(_) => ListKind::Atomic,
                None => match (ext("x-kubernetes-patch-strategy"), ext("x-kubernetes-patch-merge-key")) {
                    (Some(st), Some(key)) if st.split(',').any(|p| p == "merge") => ListKind::Map(vec![key.to_owned()]),
                    (Some(st), None) if st.split(',').any(|p| p == "merge") => ListKind::Set,
                    _ => ListKind::Atomic,
                },
            };
            return Type::List { element, kind };
        }
        let props = s.get("properties").and_then(Value::as_object);
        let additional = s.get("additionalProperties").filter(|a| a.is_object());
        if props.is_none() && additional.is_none() {
            return match s.get("type").and_then(Value::as_str) {
                Some("object") | None => Type::Untyped,
                Some(_) => Type::Scalar,
            };
        }
        let fields = props.map(|p| p.iter().map(|(k, v)| (k.clone(), self.of(v))).collect()).unwrap_or_default();
        let element = additional.map(|a| self.of(a));
        Type::Map { fields, element, atomic: ext("x-kubernetes-map-type") == Some("atomic") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_list_and_map_semantics_from_openapi_extensions() {
        let defs = json!({
            "T": {"type": "object", "properties": {
                "name": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": "#/components/schemas/I"},
                          "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["a", "b"]},
                "legacy": {"type": "array", "items": {"$ref": "#/components/schemas/I"},
                           "x-kubernetes-patch-strategy": "merge,retainKeys", "x-kubernetes-patch-merge-key": "a"},
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-patch-strategy": "merge"},
                "args": {"type": "array", "items": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "sel": {"allOf": [{"$ref": "#/components/schemas/S"}]},
                "self": {"$ref": "#/components/schemas/T"}
            }},
            "I": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
            "S": {"type": "object", "properties": {"x": {"type": "string"}}, "x-kubernetes-map-type": "atomic"}
        });
        let s = Schema::from_openapi(defs.as_object().unwrap(), "T");
        let t = s.root();
        let kind = |f: &str| match s.get(s.field(t, f).unwrap()) {
            Type::List { kind, .. } => kind.clone(),
            other => panic!("{f}: {other:?}"),
        };
        assert_eq!(kind("items"), ListKind::Map(vec!["a".into(), "b".into()]));
        assert_eq!(kind("legacy"), ListKind::Map(vec!["a".into()]));
        assert_eq!(kind("tags"), ListKind::Set);
        assert_eq!(kind("args"), ListKind::Atomic);
        assert!(matches!(s.get(s.field(t, "sel").unwrap()), Type::Map { atomic: true, .. }));
        assert!(matches!(s.get(s.field(t, "labels").unwrap()), Type::Map { atomic: false, element: Some(_), .. }));
        assert_eq!(s.field(t, "self"), Some(t));
        assert_eq!(s.field(t, "undeclared"), None);
        assert!(s.is_struct_field(t, "name"));
    }
}
