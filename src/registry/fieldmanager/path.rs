//! Field paths, as structured-merge-diff names them: `f:name` (a field), `k:{...}` (a list item by its keys),
//! `v:...` (an item of a set), `i:N` (a list index).

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

/// One step into an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathElement {
    Field(String),
    /// The key fields of an item of a list of type `map`, sorted by name.
    Key(Vec<(String, Value)>),
    Value(Value),
    Index(usize),
}

pub type Path = Vec<PathElement>;

impl PathElement {
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }

    /// The FieldsV1 form (`f:replicas`, `k:{"name":"main"}`, `v:"a"`, `i:0`).
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                // The fields are sorted by name, so this is the JSON of the map of them.
                let mut out = b"k:{".to_vec();
                for (i, (name, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut out, name).expect("writing to a Vec cannot fail");
                    out.push(b':');
                    serde_json::to_writer(&mut out, value).expect("writing to a Vec cannot fail");
                }
                out.push(b'}');
                String::from_utf8(out).expect("JSON is UTF-8")
            }
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    pub fn decode(s: &str) -> Result<Self, String> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| format!("invalid path element {s:?}"))?;
        let parse = |r: &str| serde_json::from_str::<Value>(r).map_err(|e| format!("invalid path element {s:?}: {e}"));
        match kind {
            "f" => Ok(PathElement::Field(rest.to_owned())),
            "k" => match parse(rest)? {
                Value::Object(m) => {
                    let mut fields: Vec<(String, Value)> = m.into_iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(PathElement::Key(fields))
                }
                _ => Err(format!("invalid path element {s:?}: a key must be an object")),
            },
            "v" => Ok(PathElement::Value(parse(rest)?)),
            "i" => rest.parse().map(PathElement::Index).map_err(|_| format!("invalid path element {s:?}")),
            _ => Err(format!("invalid path element {s:?}")),
        }
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => {
                for ((an, av), (bn, bv)) in a.iter().zip(b) {
                    let c = an.cmp(bn).then_with(|| compare_values(av, bv));
                    if c != Ordering::Equal {
                        return c;
                    }
                }
                a.len().cmp(&b.len())
            }
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A total order on JSON values, by kind first (numbers, strings, booleans, lists, maps, null) as
/// structured-merge-diff orders them.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                let c = compare_values(p, q);
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            let mut xs: Vec<_> = x.iter().collect();
            let mut ys: Vec<_> = y.iter().collect();
            xs.sort_by(|p, q| p.0.cmp(q.0));
            ys.sort_by(|p, q| p.0.cmp(q.0));
            for ((xk, xv), (yk, yv)) in xs.iter().zip(&ys) {
                let c = xk.cmp(yk).then_with(|| compare_values(xv, yv));
                if c != Ordering::Equal {
                    return c;
                }
            }
            xs.len().cmp(&ys.len())
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// A path as structured-merge-diff prints it in conflicts: `.spec.template.spec.containers[name="main"].image`.
pub struct Display<'a>(pub &'a [PathElement]);

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pe in self.0 {
            match pe {
                PathElement::Field(name) => write!(f, ".{name}")?,
                PathElement::Key(fields) => {
                    let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    write!(f, "[{}]", parts.join(","))?
                }
                PathElement::Value(v) => write!(f, "[={v}]")?,
                PathElement::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elements_round_trip_through_their_fields_v1_form() {
        let keys = [r#"k:{"containerPort":80,"protocol":"TCP"}"#, r#"k:{"a\"b":[1,{"x":null}],"c":"\n"}"#];
        for s in ["f:replicas", keys[0], keys[1], r#"v:"orphan""#, "i:3"] {
            assert_eq!(PathElement::decode(s).unwrap().encode(), s);
        }
        assert!(PathElement::decode("x:1").is_err());
        assert!(PathElement::decode("k:[1]").is_err());
        assert!(PathElement::decode("nocolon").is_err());
    }

    #[test]
    fn order_is_fields_then_keys_then_values_then_indexes() {
        let mut v = [
            PathElement::Index(0),
            PathElement::Value(json!("a")),
            PathElement::Key(vec![("name".into(), json!("b"))]),
            PathElement::Field("z".into()),
            PathElement::Field("a".into()),
            PathElement::Key(vec![("name".into(), json!("a"))]),
        ];
        v.sort();
        let encoded: Vec<String> = v.iter().map(PathElement::encode).collect();
        assert_eq!(encoded, ["f:a", "f:z", r#"k:{"name":"a"}"#, r#"k:{"name":"b"}"#, r#"v:"a""#, "i:0"]);
    }

    #[test]
    fn paths_print_as_structured_merge_diff_does() {
        let p = vec![
            PathElement::Field("spec".into()),
            PathElement::Key(vec![("name".into(), json!("main"))]),
            PathElement::Field("image".into()),
            PathElement::Value(json!("x")),
        ];
        assert_eq!(Display(&p).to_string(), r#".spec[name="main"].image[="x"]"#);
    }
}
