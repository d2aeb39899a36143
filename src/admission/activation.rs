//! What admission's CEL expressions (webhook matchConditions, policies) see of a request, as k8s.io/apiserver's
//! `admission/plugin/cel` builds it: `object`, `oldObject`, `request` (an AdmissionRequest without uid and
//! objects), `namespaceObject`, `authorizer`; each built once per request and version, and only when an
//! expression that reads it runs.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{Attributes, Error};
use crate::cel::{self, Activation, ResourceCheck};

/// The fields of an AdmissionRequest both a webhook's review and CEL's `request` have, as
/// `CreateAdmissionRequest` fills them: empty optional fields are absent. `a` is the request in the version it is
/// evaluated or sent in (an equivalent one under `matchPolicy: Equivalent`), `requested` as it was made.
pub(crate) fn request_fields(a: &Attributes, requested: &Attributes) -> Map<String, Value> {
    let kind_of = |a: &Attributes| json!({"group": a.kind.group, "version": a.kind.version, "kind": a.kind.kind});
    let resource_of = |a: &Attributes| json!({"group": a.resource.group, "version": a.resource.version, "resource": a.resource.resource});
    let put = |m: &mut Map<String, Value>, k: &str, v: Value, empty: bool| {
        if !empty {
            m.insert(k.to_owned(), v);
        }
    };
    let mut user = Map::new();
    let u = &a.user;
    put(&mut user, "username", json!(u.name), u.name.is_empty());
    put(&mut user, "uid", json!(u.uid), u.uid.is_empty());
    put(&mut user, "groups", json!(u.groups), u.groups.is_empty());
    put(&mut user, "extra", json!(u.extra), u.extra.is_empty());

    let mut r = Map::new();
    r.insert("kind".into(), kind_of(a));
    r.insert("resource".into(), resource_of(a));
    let sub = a.subresource.as_str();
    put(&mut r, "subResource", json!(sub), sub.is_empty());
    r.insert("requestKind".into(), kind_of(requested));
    r.insert("requestResource".into(), resource_of(requested));
    put(&mut r, "requestSubResource", json!(sub), sub.is_empty());
    put(&mut r, "name", json!(a.name), a.name.is_empty());
    put(&mut r, "namespace", json!(a.namespace), a.namespace.is_empty());
    r.insert("operation".into(), json!(a.operation.as_str()));
    r.insert("userInfo".into(), Value::Object(user));
    r.insert("dryRun".into(), json!(a.dry_run));
    r.insert("options".into(), a.options.to_value());
    r
}

/// What a set of expressions reads of the values admission gives them, so only that is built for them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reads {
    pub(crate) object: cel::Projection,
    pub(crate) old: cel::Projection,
    pub(crate) request: cel::Projection,
    pub(crate) namespace: cel::Projection,
    /// Whether one asks the authorizer, and so must be evaluated where it may block.
    pub(crate) authorizer: bool,
}

impl Reads {
    pub(crate) fn of<'p>(programs: impl IntoIterator<Item = &'p cel::Program>) -> Self {
        let mut r = Self::default();
        for p in programs {
            r.object.merge(&p.projection("object"));
            r.old.merge(&p.projection("oldObject"));
            r.request.merge(&p.projection("request"));
            r.namespace.merge(&p.projection("namespaceObject"));
            r.authorizer |= p.uses("authorizer");
        }
        r
    }
}

/// The names every admission expression may use; `params` and `variables` only where a policy declares them.
pub(crate) const DECLARED: &[&str] = &["object", "oldObject", "request", "namespaceObject", "authorizer"];

/// The authorizer expressions check with: the server's own, through the main API server's
/// SubjectAccessReviews and its cache. None (tests, no main API server): every check errors.
pub type ExpressionAuthorizer = Option<Arc<dyn cel::Authorizer>>;

/// Answers every check with an error: there is no authorizer to ask.
#[derive(Debug)]
struct NoAuthorizer;

impl cel::Authorizer for NoAuthorizer {
    fn authorize(&self, _: &crate::api::UserInfo, _: &str, _: &cel::Check) -> cel::Decision {
        cel::Decision { allowed: false, reason: String::new(), error: Some("no authorizer is configured".into()) }
    }
}

/// The activation for expressions that read `reads`, on one request in one version (`a` as evaluated,
/// `requested` as made): only what they read of each value is built.
pub(crate) fn activation(
    a: &Attributes,
    requested: &Attributes,
    (object, old): (Option<&Value>, Option<&Value>),
    authorizer: &ExpressionAuthorizer,
    reads: &Reads,
) -> Activation {
    let request = reads.request.reads().then(|| Value::Object(request_fields(a, requested)));
    let mut act = Activation::new();
    act.bind("object", reads.object.project(object));
    act.bind("oldObject", reads.old.project(old));
    act.bind("request", reads.request.project(request.as_ref()));
    act.bind("namespaceObject", cel::Value::Null);
    act.bind("authorizer", authorizer_value(authorizer, requested));
    act
}

/// The `authorizer` variable of the request `requested`: its user, and its resource as `requestResource`.
pub(crate) fn authorizer_value(authorizer: &ExpressionAuthorizer, requested: &Attributes) -> cel::Value {
    let check = ResourceCheck {
        group: requested.resource.group.clone(),
        version: requested.resource.version.clone(),
        resource: requested.resource.resource.clone(),
        subresource: requested.subresource.as_str().to_owned(),
        namespace: requested.namespace.clone(),
        name: requested.name.clone(),
        ..Default::default()
    };
    let authorizer = authorizer.clone().unwrap_or_else(|| Arc::new(NoAuthorizer));
    cel::AuthorizerValue::new(authorizer, requested.user.clone(), check).into_value()
}

/// Runs `f` where an authorizer may block: on a blocking thread when `blocking`, else in place (most expressions
/// never ask, and are not worth a thread hop). `stopped` is the answer when the runtime shuts down first.
pub(crate) async fn evaluate<T: Send + 'static>(
    blocking: bool,
    f: impl FnOnce() -> T + Send + 'static,
    stopped: impl FnOnce() -> T,
) -> T {
    if !blocking {
        return f();
    }
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| stopped())
}

/// A request in the version a webhook's or a policy's rules select it in: as it was (borrowed), or converted to
/// another served version of the resource (`matchPolicy: Equivalent`), with its objects converted to it.
pub(crate) struct Invocation<'a> {
    pub(crate) attributes: Cow<'a, Attributes>,
    object: Option<Cow<'a, Value>>,
    old: Option<Cow<'a, Value>>,
}

impl<'a> Invocation<'a> {
    pub(crate) fn new(
        a: &'a Attributes,
        version: &str,
        object: Option<&'a Value>,
        old: Option<&'a Value>,
    ) -> Result<Self, Error> {
        if version == a.resource.version {
            let (object, old) = (object.map(Cow::Borrowed), old.map(Cow::Borrowed));
            return Ok(Self { attributes: Cow::Borrowed(a), object, old });
        }
        let mut converted = a.clone();
        converted.resource.version = version.to_owned();
        // A kind of the resource's own group changes version with it; another (`/scale`'s Scale) stays.
        if converted.kind.group == converted.resource.group {
            converted.kind.version = version.to_owned();
        }
        let convert = |v: Option<&Value>| -> Result<Option<Cow<'a, Value>>, Error> {
            let Some(mut v) = v.cloned() else { return Ok(None) };
            a.interfaces
                .convert(&mut v, version)
                .map_err(|source| Error::Conversion { version: version.to_owned(), source })?;
            Ok(Some(Cow::Owned(v)))
        };
        Ok(Self { object: convert(object)?, old: convert(old)?, attributes: Cow::Owned(converted) })
    }

    pub(crate) fn object(&self) -> Option<&Value> {
        self.object.as_deref()
    }

    pub(crate) fn old(&self) -> Option<&Value> {
        self.old.as_deref()
    }

    /// The object converted to the invocation's version, owned; None when it is the request's own, borrowed.
    pub(crate) fn into_converted_object(self) -> Option<Value> {
        match self.object? {
            Cow::Owned(v) => Some(v),
            Cow::Borrowed(_) => None,
        }
    }
}
