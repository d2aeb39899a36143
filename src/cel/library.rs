//! Where cel-rust's interpreter differs from cel-go as Kubernetes configures it, the calls compilation rewrites
//! into (`check.rs`):
//! - `x.?f` is `optional.none()` for a missing key or a null/non-map `x`, and an optional `x` is flattened;
//! - `==` and `!=` compare numbers across int, uint and double (`1 == 1.0`, as JSON's `1.0` must equal `1`);
//! - `size()` of a string counts code points, not bytes.
//!
//! And the names the environment declares: a function outside them is a compile error, as cel-go's checker
//! reports it, rather than an error only when the branch runs.

use std::sync::Arc;

use kube_cel::cel::extractors::This;
use kube_cel::cel::objects::{Key, OptionalValue, Value};
use kube_cel::cel::{Context, ExecutionError};

pub(crate) const OPT_SELECT: &str = "@podset.optSelect";
pub(crate) const EQUALS: &str = "@podset.equals";
pub(crate) const NOT_EQUALS: &str = "@podset.notEquals";

/// The functions of Kubernetes' base environment for admission (k8s.io/apiserver `cel/environment/base.go`)
/// that this interpreter has: the standard ones, optional types, ext.Strings v2, ext.Sets, ext.Lists v3 (but
/// `sortBy`), and the k8s libraries (lists, regex, urls, ip, cidr, quantity, semver, format, authz, jsonpatch).
/// kube-cel's extras Kubernetes does not declare (`math.*`, `base64.*`, `isIPv4`...) are left out.
pub(crate) const FUNCTIONS: &[&str] = &[
    // Standard.
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    // Optional types.
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
    "first",
    "last",
    // ext.Strings v2.
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "format",
    "strings.quote",
    // ext.Sets.
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    // ext.Lists v3 and the k8s lists library.
    "slice",
    "flatten",
    "sort",
    "lists.range",
    "reverse",
    "distinct",
    "isSorted",
    "sum",
    "min",
    "max",
    // Regex, URLs.
    "find",
    "findAll",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    // IP and CIDR.
    "ip",
    "isIP",
    "ip.isCanonical",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "prefixLength",
    "masked",
    // Quantity and semver.
    "quantity",
    "isQuantity",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "isGreaterThan",
    "isLessThan",
    "compareTo",
    "semver",
    "isSemver",
    "major",
    "minor",
    "patch",
    // Format.
    "format.dns1123Label",
    "format.dns1123Subdomain",
    "format.dns1035Label",
    "format.dns1035LabelPrefix",
    "format.dns1123LabelPrefix",
    "format.dns1123SubdomainPrefix",
    "format.qualifiedName",
    "format.labelValue",
    "format.uri",
    "format.uuid",
    "format.byte",
    "format.date",
    "format.datetime",
    "format.named",
    "validate",
    // Authz.
    "path",
    "group",
    "serviceAccount",
    "resource",
    "subresource",
    "namespace",
    "name",
    "fieldSelector",
    "labelSelector",
    "check",
    "allowed",
    "reason",
    "errored",
    "error",
    // JSON patch keys.
    "jsonpatch.escapeKey",
];

fn lookup<'a>(v: &'a Value, field: &str) -> Option<&'a Value> {
    match v {
        Value::Map(m) => m.map.get(&Key::String(Arc::new(field.to_owned()))),
        _ => None,
    }
}

/// `x.?f`.
fn opt_select(target: Value, field: Arc<String>) -> Result<Value, ExecutionError> {
    let inner = match &target {
        Value::Opaque(o) => match o.downcast_ref::<OptionalValue>() {
            Some(opt) => opt.value().cloned(),
            None => Some(target.clone()),
        },
        _ => Some(target.clone()),
    };
    let found = inner.as_ref().and_then(|v| lookup(v, &field)).cloned();
    Ok(Value::Opaque(Arc::new(found.map_or_else(OptionalValue::none, OptionalValue::of))))
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::UInt(u) => Some(*u as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// cel-go's heterogeneous equality on numbers; everything else as the interpreter compares it.
fn equals(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::UInt(y)) | (Value::UInt(y), Value::Int(x)) => u64::try_from(*x).is_ok_and(|x| x == *y),
        (Value::Int(_) | Value::UInt(_) | Value::Float(_), Value::Int(_) | Value::UInt(_) | Value::Float(_)) => {
            number(a) == number(b)
        }
        _ => a == b,
    }
}

/// `size()` in code points for strings, as cel-go's `String.Size`.
fn size(This(this): This<Value>) -> Result<i64, ExecutionError> {
    let n = match &this {
        Value::String(s) => s.chars().count(),
        Value::List(l) => l.len(),
        Value::Map(m) => m.map.len(),
        Value::Bytes(b) => b.len(),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

pub(crate) fn register(ctx: &mut Context<'static>) {
    ctx.add_function(OPT_SELECT, opt_select);
    ctx.add_function(EQUALS, |a: Value, b: Value| equals(&a, &b));
    ctx.add_function(NOT_EQUALS, |a: Value, b: Value| !equals(&a, &b));
    ctx.add_function("size", size);
}
