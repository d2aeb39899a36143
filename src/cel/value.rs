//! JSON objects as CEL values and back, as k8s.io/apiserver hands unstructured objects to policies: objects are
//! maps keyed by their field names (`object.metadata.name`, `object.metadata.labels['app.kubernetes.io/name']`),
//! whole numbers `int`, others `double`, `null` as null.

use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::cel::objects::{Key, Map, Value};

/// `v` as a CEL value.
pub fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(a) => Value::List(Arc::new(a.iter().map(from_json).collect())),
        serde_json::Value::Object(o) => {
            let map: HashMap<Key, Value> =
                o.iter().map(|(k, v)| (Key::String(Arc::new(k.clone())), from_json(v))).collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// A map of string keys to values, as CEL sees a small object built here (`request`, `userInfo`).
pub fn map<'a>(entries: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    map_owned(entries.into_iter().map(|(k, v)| (k.to_owned(), v)))
}

/// [`map`] of owned keys.
pub(crate) fn map_owned(entries: impl IntoIterator<Item = (String, Value)>) -> Value {
    let map: HashMap<Key, Value> = entries.into_iter().map(|(k, v)| (Key::String(Arc::new(k)), v)).collect();
    Value::Map(Map { map: Arc::new(map) })
}

pub fn string(s: impl Into<String>) -> Value {
    Value::String(Arc::new(s.into()))
}

/// `v` as JSON, where it has a JSON form (not a function or an opaque value of a library).
pub fn to_json(v: &Value) -> Option<serde_json::Value> {
    Some(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::UInt(u) => (*u).into(),
        Value::Float(f) => serde_json::Number::from_f64(*f)?.into(),
        Value::String(s) => s.as_str().into(),
        Value::Bytes(b) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(b.as_slice()).into()
        }
        Value::List(l) => l.iter().map(to_json).collect::<Option<Vec<_>>>()?.into(),
        Value::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m.map.iter() {
                let key = match k {
                    Key::String(s) => s.to_string(),
                    Key::Int(i) => i.to_string(),
                    Key::Uint(u) => u.to_string(),
                    Key::Bool(b) => b.to_string(),
                };
                out.insert(key, to_json(v)?);
            }
            out.into()
        }
        Value::Duration(d) => format!("{}s", d.num_milliseconds() as f64 / 1000.0).into(),
        Value::Timestamp(t) => t.to_rfc3339().into(),
        Value::Function(..) | Value::Opaque(_) => return None,
    })
}

/// A value's CEL type name, as kube's messages name it (`string`, `int`, `map`, ...).
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Function(..) => "function",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Duration(_) => "google.protobuf.Duration",
        Value::Timestamp(_) => "google.protobuf.Timestamp",
        Value::Opaque(_) => "opaque",
        Value::Null => "null_type",
    }
}
