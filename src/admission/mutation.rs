//! The two ways a mutating admission policy changes an object (k8s.io/apiserver's `policy/mutating/patch`): a JSON
//! patch ([`json_patch`], `json_patch.go`) and an apply configuration merged by the object's schema
//! ([`apply_configuration`], `smd.go`, through [`ObjectInterfaces::apply_configuration`]).
//!
//! The JSON patch is applied as kube-apiserver applies it, with evanphx/json-patch v4 and its quirks, not as RFC
//! 6902 reads: `replace` of an absent object key adds it, negative list indexes count from the end, errors are its
//! words. The `json-patch` crate applies the RFC strictly and names only an error's kind, so it is not used here.

use serde_json::{Map, Value};

use super::ObjectInterfaces;

/// Why an apply configuration was not merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyConfigurationError {
    /// No schema for the kind (`group/version, Kind=kind`): kube-apiserver answers 503 ServiceUnavailable with
    /// this, whatever the policy's failure policy, until its type converter has read the kind's OpenAPI.
    #[error(
        "Resource kind {0} not found. There can be a delay between when CustomResourceDefinitions are created and \
         when they are available."
    )]
    KindNotFound(String),
    /// Refused or not merged, in kube's words; a failure the policy's failure policy decides.
    #[error("{0}")]
    Patch(String),
}

/// An object's kind as Go prints a `GroupVersionKind`: `apps/v1, Kind=Deployment`, `/v1, Kind=Pod`.
pub fn gvk_text(object: &Value) -> String {
    let text = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or_default();
    let (group, version) = text("apiVersion").rsplit_once('/').unwrap_or(("", text("apiVersion")));
    format!("{group}/{version}, Kind={}", text("kind"))
}

/// `patch`, a policy's evaluated apply configuration, merged into `object` as kube's `applyConfigPatcher` does:
/// the configuration takes the object's apiVersion and kind, and a refusal reads `error applying patch: …`.
pub fn apply_configuration(
    interfaces: &dyn ObjectInterfaces,
    object: &Value,
    patch: &Value,
) -> Result<Value, ApplyConfigurationError> {
    let mut patch = patch.clone();
    if let Some(p) = patch.as_object_mut() {
        for k in ["apiVersion", "kind"] {
            p.insert(k.into(), object.get(k).cloned().unwrap_or_else(|| Value::String(String::new())));
        }
    }
    interfaces.apply_configuration(object, &patch).map_err(|e| match e {
        ApplyConfigurationError::Patch(m) => ApplyConfigurationError::Patch(format!("error applying patch: {m}")),
        e => e,
    })
}

/// What the `copy` operations of one patch may add in all: kube-apiserver's `JSONPatchMaxCopyBytes`, 3 MiB.
const MAX_COPY_BYTES: usize = 3 * 1024 * 1024;

/// `ops`, each `{op, path, from?, value?}`, applied to `object` in order. A `test` that fails leaves the object as it
/// was, with no error; any other failure is an error `JSON Patch: …`.
pub fn json_patch(object: &Value, ops: &[Value]) -> Result<Value, String> {
    let mut doc = object.clone();
    let mut copied = 0;
    for op in ops {
        match apply(&mut doc, op, &mut copied) {
            Ok(()) => {}
            Err(Failure::TestFailed) => return Ok(object.clone()),
            Err(Failure::Error(e)) => return Err(format!("JSON Patch: {e}")),
        }
    }
    Ok(doc)
}

enum Failure {
    TestFailed,
    Error(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Error(e)
    }
}

const MISSING: &str = "missing value";

/// A string field of an operation (`path`, `from`), as Go decodes it.
fn field<'o>(op: &'o Value, name: &str, missing: &str) -> Result<&'o str, String> {
    match op.get(name) {
        None | Some(Value::Null) => Err(format!("{missing}: {MISSING}")),
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(format!("json: cannot unmarshal {} into Go value of type string", go_kind(v))),
    }
}

fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        _ => "string",
    }
}

fn apply(doc: &mut Value, op: &Value, copied: &mut usize) -> Result<(), Failure> {
    let path = || field(op, "path", "operation missing path field");
    let from = || field(op, "from", "operation, missing from field");
    // An absent value is JSON null where it is set (Go's nil node).
    let value = op.get("value");
    let set_value = || value.cloned().unwrap_or(Value::Null);
    let kind = op.get("op").and_then(Value::as_str).unwrap_or("unknown");
    match kind {
        "add" => {
            let path = path().map_err(|_| format!("add operation failed to decode path: {MISSING}"))?;
            let (con, key) = find_object(doc, path)
                .ok_or_else(|| format!("add operation does not apply: doc is missing path: \"{path}\": {MISSING}"))?;
            add(con, &key, set_value()).map_err(|e| format!("error in add for path: '{path}': {e}"))?;
        }
        "remove" => {
            let path = path().map_err(|_| format!("remove operation failed to decode path: {MISSING}"))?;
            let (con, key) = find_object(doc, path).ok_or_else(|| {
                format!("remove operation does not apply: doc is missing path: \"{path}\": {MISSING}")
            })?;
            remove(con, &key).map_err(|e| format!("error in remove for path: '{path}': {e}"))?;
        }
        "replace" => {
            let path = path().map_err(|e| format!("replace operation failed to decode path: {e}"))?;
            if path.is_empty() {
                // Go formats its nil error here as `%!w(<nil>)`.
                match set_value() {
                    v @ (Value::Object(_) | Value::Array(_)) => *doc = v,
                    _ => Err("replace operation value must be object or array: %!w(<nil>)".to_owned())?,
                }
                return Ok(());
            }
            let (con, key) = find_object(doc, path)
                .ok_or_else(|| format!("replace operation does not apply: doc is missing path: {path}: {MISSING}"))?;
            // An absent object key is no error: it is set.
            get(con, &key)
                .map_err(|_| format!("replace operation does not apply: doc is missing key: {path}: {MISSING}"))?;
            set(con, &key, set_value());
        }
        "move" => {
            let from = from().map_err(|e| format!("move operation failed to decode from: {e}"))?;
            let (con, key) = find_object(doc, from)
                .ok_or_else(|| format!("move operation does not apply: doc is missing from path: {from}: {MISSING}"))?;
            get(con, &key).map_err(|e| format!("error in move for path: '{key}': {e}"))?;
            let moved = remove(con, &key).map_err(|e| format!("error in move for path: '{key}': {e}"))?;
            let path = path().map_err(|e| format!("move operation failed to decode path: {e}"))?;
            let (con, key) = find_object(doc, path).ok_or_else(|| {
                format!("move operation does not apply: doc is missing destination path: {path}: {MISSING}")
            })?;
            add(con, &key, moved).map_err(|e| format!("error in move for path: '{path}': {e}"))?;
        }
        "test" => {
            let path = path().map_err(|e| format!("test operation failed to decode path: {e}"))?;
            let target = if path.is_empty() {
                Some(&*doc)
            } else {
                let (con, key) = find_object(doc, path)
                    .ok_or_else(|| format!("test operation does not apply: is missing path: {path}: {MISSING}"))?;
                get(con, &key).map_err(|e| format!("error in test for path: '{path}': {e}"))?.map(|v| &*v)
            };
            // A null or absent target matches only an operation without a value, as Go's nil nodes compare.
            let matches = match (target.filter(|t| !t.is_null()), value) {
                (None, None) => true,
                (Some(t), Some(v)) => same(t, v),
                _ => false,
            };
            if !matches {
                return Err(Failure::TestFailed);
            }
        }
        "copy" => {
            let from = from().map_err(|e| format!("copy operation failed to decode from: {e}"))?;
            let (con, key) = find_object(doc, from)
                .ok_or_else(|| format!("copy operation does not apply: doc is missing from path: {from}: {MISSING}"))?;
            let copy = get(con, &key).map_err(|e| format!("error in copy for from: '{from}': {e}"))?.cloned();
            let path = path().map_err(|_| format!("copy operation failed to decode path: {MISSING}"))?;
            let (con, key) = find_object(doc, path).ok_or_else(|| {
                format!("copy operation does not apply: doc is missing destination path: {path}: {MISSING}")
            })?;
            *copied += copy.as_ref().map_or(0, |c| serde_json::to_vec(c).map_or(0, |b| b.len()));
            if *copied > MAX_COPY_BYTES {
                Err(format!(
                    "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the \
                     limit {MAX_COPY_BYTES}"
                ))?;
            }
            add(con, &key, copy.unwrap_or(Value::Null))
                .map_err(|e| format!("error while adding value during copy: {e}"))?;
        }
        other => Err(format!("Unexpected kind: {other}"))?,
    }
    Ok(())
}

/// Deep equality with numbers compared by value: kube compares the JSON texts, and a CEL number reaches its
/// patch as a double printed without a fraction when it has none, so `1` there is `1` in the object.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

/// One reference token, unescaped (`~1` is `/`, `~0` is `~`).
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// The object or list that holds what `path` points at, and the last token; `None` when the path has no `/` or a
/// step on the way is absent, null or a scalar.
fn find_object<'d>(doc: &'d mut Value, path: &str) -> Option<(&'d mut Value, String)> {
    let tokens: Vec<&str> = path.split('/').collect();
    let (last, steps) = tokens.split_last().filter(|(_, steps)| !steps.is_empty())?;
    let mut con = doc;
    for step in &steps[1..] {
        con = get(con, &unescape(step)).ok()?.filter(|v| v.is_object() || v.is_array())?;
    }
    Some((con, unescape(last)))
}

/// A list index as Go's `strconv.Atoi` reads it (a sign is allowed, so are leading zeros).
fn atoi(key: &str) -> Result<i64, String> {
    let digits = key.strip_prefix(['+', '-']).unwrap_or(key);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("strconv.Atoi: parsing {key:?}: invalid syntax"));
    }
    key.parse().map_err(|_| format!("strconv.Atoi: parsing {key:?}: value out of range"))
}

fn invalid_index(i: i64) -> String {
    format!("Unable to access invalid index: {i}: invalid index referenced")
}

/// An index of a list of `len` items; a negative one counts from the end.
fn index(key: &str, len: usize) -> Result<usize, String> {
    position(atoi(key)?, len)
}

/// `i` as a position among `len`, a negative one counted from the end.
fn position(i: i64, len: usize) -> Result<usize, String> {
    let len = len as i64;
    let at = if i < 0 { i + len } else { i };
    if at < 0 || at >= len {
        return Err(invalid_index(i));
    }
    Ok(at as usize)
}

/// What `key` names in `con`: `None` when it is an absent object key, or null.
fn get<'c>(con: &'c mut Value, key: &str) -> Result<Option<&'c mut Value>, String> {
    Ok(match con {
        Value::Object(m) => m.get_mut(key),
        Value::Array(a) => {
            let i = index(key, a.len())?;
            a.get_mut(i)
        }
        _ => None,
    }
    .filter(|v| !v.is_null()))
}

/// Sets what [`get`] found (or an object key it did not).
fn set(con: &mut Value, key: &str, v: Value) {
    match con {
        Value::Object(m) => {
            m.insert(key.to_owned(), v);
        }
        Value::Array(a) => {
            if let Ok(i) = index(key, a.len()) {
                a[i] = v;
            }
        }
        _ => {}
    }
}

fn add(con: &mut Value, key: &str, v: Value) -> Result<(), String> {
    match con {
        Value::Object(m) => {
            m.insert(key.to_owned(), v);
        }
        Value::Array(a) if key == "-" => a.push(v),
        Value::Array(a) => {
            let i = atoi(key).map_err(|e| format!("value was not a proper array index: '{key}': {e}"))?;
            // One past the end is the end.
            let at = position(i, a.len() + 1)?;
            a.insert(at, v);
        }
        _ => return Err(format!("{MISSING}: not an object or a list")),
    }
    Ok(())
}

fn remove(con: &mut Value, key: &str) -> Result<Value, String> {
    match con {
        Value::Object(m) => m.remove(key).ok_or_else(|| format!("Unable to remove nonexistent key: {key}: {MISSING}")),
        Value::Array(a) => Ok(a.remove(index(key, a.len())?)),
        _ => Err(format!("{MISSING}: not an object or a list")),
    }
}

/// An operation as kube builds one from a policy's `JSONPatch` value: `from` only when not empty, `value` only
/// when set.
pub fn operation(op: &str, path: &str, from: Option<&str>, value: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("op".into(), op.into());
    m.insert("path".into(), path.into());
    if let Some(f) = from.filter(|f| !f.is_empty()) {
        m.insert("from".into(), f.into());
    }
    if let Some(v) = value {
        m.insert("value".into(), v);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests;
