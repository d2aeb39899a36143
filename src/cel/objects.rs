//! Object construction in mutation expressions, as k8s.io/apiserver's `cel/mutation` types it: `Object{...}`,
//! `Object.<field path>{...}` (any field, of any value) and `JSONPatch{op, path, from, value}`. The interpreter
//! cannot evaluate `Type{...}`, so compilation rewrites each literal into `@object("<Type>", {<fields>})`, a map
//! built by the interpreter (optional entries kept), checked by [`object`] when it runs.
//!
//! What kube checks when a mutation runs or compiles, checked here when it compiles, on the literals as written
//! (variables cannot build objects, so every object a mutation returns is one of its literals):
//! - a literal nested in an object's field `f` (through lists, map values, `?:` and `optional.of`) is named after
//!   the path to it (`Object.spec{template: Object.spec.template{...}}`);
//! - the expression's result is an `Object` (ApplyConfiguration) or a list of `JSONPatch` (JSONPatch). A result
//!   whose type is only known when it runs (a comprehension, a function's) is checked by its shape then.

use std::sync::Arc;

use kube_cel::cel::common::ast::{
    CallExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue, MapEntryExpr, MapExpr,
};
use kube_cel::cel::common::types::CelString;
use kube_cel::cel::objects::{Key, Value};
use kube_cel::cel::{ExecutionError, FunctionContext, ResolveResult};

/// The call a literal becomes.
pub(crate) const OBJECT: &str = "@object";

const OBJECT_TYPE: &str = "Object";
const JSON_PATCH: &str = "JSONPatch";

/// What a mutation expression must evaluate to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// An `Object` (an ApplyConfiguration).
    Object,
    /// A `list(JSONPatch)`.
    JsonPatches,
}

/// Whether `name` is a type the mutation library declares.
pub(crate) fn declared(name: &str) -> bool {
    name == JSON_PATCH || name == OBJECT_TYPE || name.strip_prefix("Object.").is_some_and(|rest| !rest.is_empty())
}

/// A literal's type name as declared: the parser keeps a leading dot (`.Object{}`).
pub(crate) fn type_name(written: &str) -> &str {
    written.strip_prefix('.').unwrap_or(written)
}

/// kube's message for a literal named otherwise than the field path to it.
pub(crate) fn mismatch(got: &str, want: &str) -> String {
    format!(
        "type mismatch: unexpected type name \"{got}\", expected \"{want}\", which matches field name path from root \
         Object type"
    )
}

/// The first literal under the value of a field whose type is `want`, named otherwise, as (got, want).
pub(crate) fn misnamed(e: &IdedExpr, want: &str) -> Option<(String, String)> {
    match &e.expr {
        Expr::Struct(s) => {
            let got = type_name(&s.type_name);
            (got != want).then(|| (got.to_owned(), want.to_owned()))
        }
        Expr::List(l) => l.elements.iter().find_map(|x| misnamed(x, want)),
        Expr::Map(m) => m.entries.iter().find_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(me) => misnamed(&me.value, want),
            EntryExpr::StructField(_) => None,
        }),
        Expr::Call(c) if c.func_name == "_?_:_" && c.args.len() == 3 => {
            misnamed(&c.args[1], want).or_else(|| misnamed(&c.args[2], want))
        }
        Expr::Call(c) if optional_of(c) => misnamed(&c.args[0], want),
        _ => None,
    }
}

fn optional_of(c: &CallExpr) -> bool {
    c.func_name == "of"
        && c.args.len() == 1
        && matches!(c.target.as_deref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "optional")
}

/// The struct literal `e` rewritten into its `@object` call; each field's value stays to be visited.
pub(crate) fn rewrite(e: &mut IdedExpr) {
    let Expr::Struct(s) = &mut e.expr else { return };
    let name = type_name(&s.type_name).to_owned();
    let entries = std::mem::take(&mut s.entries)
        .into_iter()
        .map(|entry| match entry.expr {
            EntryExpr::StructField(f) => IdedEntryExpr {
                id: entry.id,
                expr: EntryExpr::MapEntry(MapEntryExpr { key: string(&f.field), value: f.value, optional: f.optional }),
            },
            other => IdedEntryExpr { id: entry.id, expr: other },
        })
        .collect();
    let fields = IdedExpr { id: 0, expr: Expr::Map(MapExpr { entries }) };
    e.expr = Expr::Call(CallExpr { func_name: OBJECT.to_owned(), target: None, args: vec![string(&name), fields] });
}

fn string(s: &str) -> IdedExpr {
    IdedExpr { id: 0, expr: Expr::Literal(LiteralValue::String(CelString::from(s))) }
}

/// Why the unrewritten expression `e` cannot evaluate to what `returns` asks, worded as kube's compiler says it;
/// None when it can, or when only its value will tell.
pub(crate) fn wrong_result(e: &IdedExpr, returns: Returns) -> Option<String> {
    let want = match returns {
        Returns::Object => OBJECT_TYPE.to_owned(),
        Returns::JsonPatches => format!("list({JSON_PATCH})"),
    };
    let got = type_of(e)?;
    let fits = match returns {
        Returns::Object => got == OBJECT_TYPE,
        Returns::JsonPatches => got == want || got == "list(dyn)",
    };
    (!fits).then(|| format!("must evaluate to {want} but got {got}"))
}

/// The type cel-go's checker would give `e`, where it is plain from the expression; None for `dyn`.
fn type_of(e: &IdedExpr) -> Option<String> {
    Some(match &e.expr {
        // An undeclared type is the checker's to report.
        Expr::Struct(s) => Some(type_name(&s.type_name)).filter(|n| declared(n))?.to_owned(),
        Expr::Literal(l) => match l {
            LiteralValue::String(_) => "string",
            LiteralValue::Int(_) => "int",
            LiteralValue::UInt(_) => "uint",
            LiteralValue::Double(_) => "double",
            LiteralValue::Boolean(_) => "bool",
            LiteralValue::Bytes(_) => "bytes",
            LiteralValue::Null => "null_type",
        }
        .to_owned(),
        Expr::Map(_) => "map(dyn, dyn)".to_owned(),
        Expr::List(l) => {
            let mut types = l.elements.iter().map(type_of);
            let first = types.next().flatten();
            let element = match first {
                Some(t) if types.all(|x| x.as_deref() == Some(&t)) => t,
                _ => "dyn".to_owned(),
            };
            format!("list({element})")
        }
        Expr::Call(c) if c.func_name == "_?_:_" && c.args.len() == 3 => {
            let (a, b) = (type_of(&c.args[1])?, type_of(&c.args[2])?);
            (a == b).then_some(a)?
        }
        _ => return None,
    })
}

/// `@object(name, fields)`: the object as its fields' map; a JSONPatch's fields checked as kube's
/// `JSONPatchType.Val` checks them.
pub(crate) fn object(ftx: &FunctionContext, name: Arc<String>, fields: Value) -> ResolveResult {
    if name.as_str() == JSON_PATCH {
        let Value::Map(m) = &fields else { return Err(ftx.error("a JSONPatch's fields are not a map")) };
        for (k, v) in m.map.iter() {
            let Key::String(k) = k else { return Err(ftx.error("a JSONPatch's field names are strings")) };
            match (k.as_str(), v) {
                ("op" | "path" | "from", Value::String(_)) | ("value", _) => {}
                ("op" | "path" | "from", other) => {
                    return Err(ExecutionError::function_error(
                        OBJECT,
                        format!("unexpected type {} for JSONPatchType '{k}' field", go_type(other)),
                    ))
                }
                (other, _) => {
                    return Err(ExecutionError::function_error(
                        OBJECT,
                        format!("unexpected JSONPatchType field: {other}"),
                    ))
                }
            }
        }
    }
    Ok(fields)
}

/// The Go type kube's message names for a value of the interpreter.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "int64",
        Value::UInt(_) => "uint64",
        Value::Float(_) => "float64",
        Value::Bool(_) => "bool",
        Value::Bytes(_) => "[]uint8",
        Value::Null => "structpb.NullValue",
        Value::List(_) => "[]ref.Val",
        Value::Map(_) => "map[ref.Val]ref.Val",
        _ => "ref.Val",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::cel::{compile, compile_mutation, value, Activation, Budget, Returns};

    const DECLARED: &[&str] = &["object", "oldObject", "variables"];

    fn activation() -> Activation {
        let mut a = Activation::new();
        a.bind(
            "object",
            value::from_json(&json!({"metadata": {"name": "web"}, "spec": {"replicas": 9, "template": {}}})),
        );
        a.bind("oldObject", value::from_json(&serde_json::Value::Null));
        a
    }

    fn eval(source: &str, returns: Returns) -> Result<serde_json::Value, String> {
        let p = compile_mutation(source, DECLARED, returns).map_err(|e| e.to_string())?;
        let v = p.eval(&activation(), &mut Budget::default()).map_err(|e| e.to_string())?;
        Ok(value::to_json(&v).expect("JSON"))
    }

    #[test]
    fn objects_and_patches_evaluate_to_their_fields() {
        let cases = [
            ("Object{spec: Object.spec{replicas: 3}}", Returns::Object, json!({"spec": {"replicas": 3}})),
            (
                "Object{metadata: Object.metadata{labels: {'team': 'a'}}, spec: Object.spec{template: \
                 Object.spec.template{spec: Object.spec.template.spec{containers: \
                 [Object.spec.template.spec.containers{name: 'side', image: 'x'}]}}}}",
                Returns::Object,
                json!({"metadata": {"labels": {"team": "a"}}, "spec": {"template": {"spec": {"containers": [
                    {"name": "side", "image": "x"}]}}}}),
            ),
            (
                "[JSONPatch{op: 'replace', path: '/spec/replicas', value: object.spec.replicas > 5 ? 5 : \
                 object.spec.replicas}]",
                Returns::JsonPatches,
                json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]),
            ),
            (
                ".Object{?spec: optional.none(), ?metadata: optional.of(Object.metadata{name: 'n'})}",
                Returns::Object,
                json!({"metadata": {"name": "n"}}),
            ),
            (
                "[JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('k8s.io/a~b'), value: 'x'}]",
                Returns::JsonPatches,
                json!([{"op": "add", "path": "/metadata/labels/k8s.io~1a~0b", "value": "x"}]),
            ),
            (
                "[JSONPatch{op: 'add', path: '/spec/x', value: Object.spec.x{a: [1]}}]",
                Returns::JsonPatches,
                json!([{"op": "add", "path": "/spec/x", "value": {"a": [1]}}]),
            ),
            (
                "object.spec.replicas > 5 ? Object{spec: Object.spec{replicas: 5}} : Object{}",
                Returns::Object,
                json!({"spec": {"replicas": 5}}),
            ),
            // Fields of an object literal are read as any map's.
            (
                "Object{spec: Object.spec{replicas: 2}}.spec.replicas == 2 ? Object{} : Object{}",
                Returns::Object,
                json!({}),
            ),
            (
                "[1, 2].map(i, JSONPatch{op: 'add', path: '/metadata/labels/l' + string(i), value: 'v'})",
                Returns::JsonPatches,
                json!([{"op": "add", "path": "/metadata/labels/l1", "value": "v"},
                       {"op": "add", "path": "/metadata/labels/l2", "value": "v"}]),
            ),
        ];
        for (source, returns, want) in cases {
            assert_eq!(eval(source, returns), Ok(want), "{source}");
        }
        assert_eq!(
            eval("Object{spec: 1} == Object{spec: 1} ? Object{} : Object{spec: 2}", Returns::Object),
            Ok(json!({}))
        );
    }

    #[test]
    fn what_kube_refuses_is_refused_in_its_words() {
        let cases = [
            (
                "Object{spec: Object.spec{selector: Object.spec.wrong{}}}",
                Returns::Object,
                "type mismatch: unexpected type name \"Object.spec.wrong\", expected \"Object.spec.selector\", which \
              matches field name path from root Object type",
            ),
            ("Object{spec: Object.spec{c: [Object.spec.x{}]}}", Returns::Object, "expected \"Object.spec.c\""),
            ("Object{spec: true ? Object.spec{} : Object.other{}}", Returns::Object, "\"Object.other\""),
            ("Object{spec: JSONPatch{}}", Returns::Object, "unexpected type name \"JSONPatch\""),
            ("Secret{}", Returns::Object, "undeclared reference to 'Secret'"),
            ("Object.{}", Returns::Object, "Syntax error"),
            ("'x'", Returns::Object, "must evaluate to Object but got string"),
            ("Object.spec.metadata{}", Returns::Object, "must evaluate to Object but got Object.spec.metadata"),
            ("{'spec': 1}", Returns::Object, "must evaluate to Object but got map(dyn, dyn)"),
            ("Object{}", Returns::JsonPatches, "must evaluate to list(JSONPatch) but got Object"),
            ("[Object{}]", Returns::JsonPatches, "must evaluate to list(JSONPatch) but got list(Object)"),
        ];
        for (source, returns, want) in cases {
            let got = eval(source, returns).expect_err(source);
            assert!(got.contains(want), "{source}: {got:?} does not say {want:?}");
        }
        // A JSONPatch's fields are checked when it is built.
        let got = eval("[JSONPatch{op: 1, path: '/x'}]", Returns::JsonPatches).unwrap_err();
        assert!(got.contains("unexpected type int64 for JSONPatchType 'op' field"), "{got}");
        let got = eval("[JSONPatch{op: 'add', path: '/x', bogus: 1}]", Returns::JsonPatches).unwrap_err();
        assert!(got.contains("unexpected JSONPatchType field: bogus"), "{got}");
    }

    #[test]
    fn only_mutations_build_objects() {
        // Validations, conditions and variables compile without the mutation library, as kube compiles them.
        for source in ["Object{spec: 1}", "JSONPatch{op: 'add'}", "jsonpatch.escapeKey('a/b')"] {
            assert!(compile(source, DECLARED).is_err(), "{source}");
        }
        let p =
            compile_mutation("Object{spec: Object.spec{replicas: object.spec.replicas}}", DECLARED, Returns::Object);
        let p = p.unwrap();
        assert!(p.uses("object") && !p.reads_nothing());
        let constant =
            compile_mutation("Object{metadata: Object.metadata{labels: {'a': 'b'}}}", DECLARED, Returns::Object);
        assert!(constant.unwrap().reads_nothing());
        let through_variable = compile_mutation("Object{spec: variables.spec}", DECLARED, Returns::Object);
        assert!(!through_variable.unwrap().reads_nothing());
        let in_comprehension =
            compile_mutation("[1].map(i, JSONPatch{op: 'add', path: '/x', value: i})", DECLARED, Returns::JsonPatches);
        assert!(in_comprehension.unwrap().reads_nothing());
        assert_eq!(
            value::to_json(&p.projection("object").project(Some(&json!({"spec": {"replicas": 1, "x": 2}})))).unwrap(),
            json!({"spec": {"replicas": 1}})
        );
    }
}
