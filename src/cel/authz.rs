//! The authorizer library (k8s.io/apiserver `cel/library/authz.go`): `authorizer` checks what the request's user
//! (or a service account) may do, through the server's own authorizer:
//! `authorizer.group('apps').resource('deployments').namespace('ns').name('web').check('update').allowed()`,
//! `authorizer.path('/healthz').check('get')`, `authorizer.serviceAccount('ns', 'sa').group(..)...`,
//! `authorizer.requestResource.check('delete')`; a decision has `allowed()`, `reason()`, `errored()`, `error()`.
//!
//! Checks are synchronous here, as CEL is: the [`Authorizer`] behind them may block, so an expression that reads
//! `authorizer` is evaluated off the async runtime (see [`super::Program::uses`]).

use std::sync::Arc;

use kube_cel::cel::objects::{Opaque, Value};
use kube_cel::cel::{Context, ExecutionError};

use crate::api::UserInfo;

/// `authorizer.requestResource` is rewritten into `@requestResource(authorizer)`.
pub(crate) const REQUEST_RESOURCE: &str = "@podset.requestResource";

/// What is asked: a resource, or a non-resource path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ResourceCheck {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub field_selector: String,
    pub label_selector: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Check {
    Resource(ResourceCheck),
    Path(String),
}

/// An authorizer's answer, as k8s.io/apiserver's `authorizer.Decision` with its reason and error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
    /// Why no decision could be made (the main API server could not be asked).
    pub error: Option<String>,
}

/// Decides whether `user` may `verb` what `check` names; may block the calling thread.
pub trait Authorizer: Send + Sync + std::fmt::Debug {
    fn authorize(&self, user: &UserInfo, verb: &str, check: &Check) -> Decision;
}

/// The `authorizer` variable: who asks, and the request's own resource.
#[derive(Clone)]
pub struct AuthorizerValue {
    authorizer: Arc<dyn Authorizer>,
    user: UserInfo,
    request: ResourceCheck,
}

impl AuthorizerValue {
    pub fn new(authorizer: Arc<dyn Authorizer>, user: UserInfo, request: ResourceCheck) -> Self {
        Self { authorizer, user, request }
    }

    pub fn into_value(self) -> Value {
        Value::Opaque(Arc::new(self))
    }
}

impl std::fmt::Debug for AuthorizerValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").field("user", &self.user.name).finish()
    }
}

impl PartialEq for AuthorizerValue {
    fn eq(&self, other: &Self) -> bool {
        self.user == other.user && self.request == other.request
    }
}
impl Eq for AuthorizerValue {}

impl Opaque for AuthorizerValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Authorizer"
    }
}

/// A check being built (`group(..)`, `resource(..)`, ... or `path(..)`), with the authorizer to ask.
#[derive(Clone)]
struct Pending {
    who: AuthorizerValue,
    check: Check,
    /// `group(..)` alone names no resource yet.
    kind: &'static str,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.kind).field("check", &self.check).finish()
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.who == other.who && self.check == other.check && self.kind == other.kind
    }
}
impl Eq for Pending {}

impl Opaque for Pending {
    fn runtime_type_name(&self) -> &str {
        self.kind
    }
}

const GROUP_CHECK: &str = "kubernetes.authorization.GroupCheck";
const RESOURCE_CHECK: &str = "kubernetes.authorization.ResourceCheck";
const PATH_CHECK: &str = "kubernetes.authorization.PathCheck";

#[derive(Debug, Clone, PartialEq, Eq)]
struct DecisionValue(Decision);

impl Opaque for DecisionValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Decision"
    }
}

fn this<T: 'static>(v: &Value) -> Result<&T, ExecutionError> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<T>().ok_or(ExecutionError::NoSuchOverload),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

fn pending(who: AuthorizerValue, check: Check, kind: &'static str) -> Value {
    Value::Opaque(Arc::new(Pending { who, check, kind }))
}

/// A field of a resource check being built: `resource`, `subresource`, `namespace`, `name` and the selectors.
fn with_field(target: &Value, kinds: &[&str], set: impl FnOnce(&mut ResourceCheck)) -> Result<Value, ExecutionError> {
    let p = this::<Pending>(target)?;
    if !kinds.contains(&p.kind) {
        return Err(ExecutionError::NoSuchOverload);
    }
    let Check::Resource(mut r) = p.check.clone() else { return Err(ExecutionError::NoSuchOverload) };
    set(&mut r);
    Ok(pending(p.who.clone(), Check::Resource(r), RESOURCE_CHECK))
}

fn service_account_user(namespace: &str, name: &str) -> UserInfo {
    UserInfo::named(
        format!("system:serviceaccount:{namespace}:{name}"),
        vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}")],
    )
}

/// Adds the library's functions to the root context.
pub(crate) fn register(ctx: &mut Context<'static>) {
    use kube_cel::cel::extractors::This;
    type S = Arc<String>;

    ctx.add_function("path", |This(t): This<Value>, path: S| -> Result<Value, ExecutionError> {
        let who = this::<AuthorizerValue>(&t)?.clone();
        Ok(pending(who, Check::Path(path.to_string()), PATH_CHECK))
    });
    ctx.add_function("group", |This(t): This<Value>, group: S| -> Result<Value, ExecutionError> {
        let who = this::<AuthorizerValue>(&t)?.clone();
        let check = Check::Resource(ResourceCheck { group: group.to_string(), ..Default::default() });
        Ok(pending(who, check, GROUP_CHECK))
    });
    ctx.add_function("serviceAccount", |This(t): This<Value>, ns: S, name: S| -> Result<Value, ExecutionError> {
        let mut who = this::<AuthorizerValue>(&t)?.clone();
        who.user = service_account_user(&ns, &name);
        Ok(who.into_value())
    });
    ctx.add_function("resource", |This(t): This<Value>, v: S| {
        with_field(&t, &[GROUP_CHECK, RESOURCE_CHECK], |r| r.resource = v.to_string())
    });
    ctx.add_function("subresource", |This(t): This<Value>, v: S| {
        with_field(&t, &[RESOURCE_CHECK], |r| r.subresource = v.to_string())
    });
    ctx.add_function("namespace", |This(t): This<Value>, v: S| {
        with_field(&t, &[RESOURCE_CHECK], |r| r.namespace = v.to_string())
    });
    ctx.add_function("name", |This(t): This<Value>, v: S| {
        with_field(&t, &[RESOURCE_CHECK], |r| r.name = v.to_string())
    });
    ctx.add_function("fieldSelector", |This(t): This<Value>, v: S| {
        with_field(&t, &[RESOURCE_CHECK], |r| r.field_selector = v.to_string())
    });
    ctx.add_function("labelSelector", |This(t): This<Value>, v: S| {
        with_field(&t, &[RESOURCE_CHECK], |r| r.label_selector = v.to_string())
    });
    ctx.add_function("check", |This(t): This<Value>, verb: S| -> Result<Value, ExecutionError> {
        let p = this::<Pending>(&t)?;
        if p.kind == GROUP_CHECK {
            return Err(ExecutionError::NoSuchOverload);
        }
        super::cost::charge(CHECK_COST)?;
        let decision = p.who.authorizer.authorize(&p.who.user, &verb, &p.check);
        Ok(Value::Opaque(Arc::new(DecisionValue(decision))))
    });
    ctx.add_function("allowed", |This(t): This<Value>| this::<DecisionValue>(&t).map(|d| Value::Bool(d.0.allowed)));
    ctx.add_function("reason", |This(t): This<Value>| {
        this::<DecisionValue>(&t).map(|d| Value::String(Arc::new(d.0.reason.clone())))
    });
    ctx.add_function("errored", |This(t): This<Value>| {
        this::<DecisionValue>(&t).map(|d| Value::Bool(d.0.error.is_some()))
    });
    ctx.add_function("error", |This(t): This<Value>| {
        this::<DecisionValue>(&t).map(|d| Value::String(Arc::new(d.0.error.clone().unwrap_or_default())))
    });
    ctx.add_function(REQUEST_RESOURCE, |t: Value| -> Result<Value, ExecutionError> {
        let who = this::<AuthorizerValue>(&t)?.clone();
        let check = Check::Resource(who.request.clone());
        Ok(pending(who, check, RESOURCE_CHECK))
    });
}

/// kube's cost of one authorization check (`library/cost.go`): fixed and large, so that an expression makes at most
/// two checks and a policy cannot ask the main API server thousands of times per request.
const CHECK_COST: u64 = 350_000;
