//! What a request asks to do, as kube-apiserver's `RequestInfo` names it, and whether the caller may: always-allowed
//! paths, `system:masters`, else a SubjectAccessReview to the main API server (cached briefly).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use sha2::{Digest, Sha256};

use super::authn::ANONYMOUS;
use super::cache::{CacheLimits, Decision, DecisionCache};
use crate::api::UserInfo;
use crate::apiserver::error::{ApiError, ApiResult};
use crate::apiserver::request::Attributes;

/// The group whose members may do anything without asking, as in kube-apiserver.
pub const MASTERS: &str = "system:masters";

impl Attributes {
    /// kube-apiserver's wording for a denial.
    fn forbidden_message(&self, user: &str) -> String {
        let Some(r) = &self.resource else {
            return format!("User {user:?} cannot {} path {:?}", self.verb, self.path);
        };
        let resource =
            if r.subresource.is_empty() { r.resource.clone() } else { format!("{}/{}", r.resource, r.subresource) };
        if r.namespace.is_empty() {
            format!(
                "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                self.verb, r.group
            )
        } else {
            format!(
                "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                self.verb, r.group, r.namespace
            )
        }
    }

    /// A 403 Status shaped as kube-apiserver's `NewForbidden`.
    pub fn forbidden(&self, user: &str, reason: &str) -> ApiError {
        let mut why = self.forbidden_message(user);
        if !reason.is_empty() {
            why = format!("{why}: {reason}");
        }
        let (group, resource, name) = match &self.resource {
            Some(r) => (r.group.as_str(), r.resource.as_str(), r.name.as_str()),
            None => ("", "", ""),
        };
        let qualified = if group.is_empty() { resource.to_owned() } else { format!("{resource}.{group}") };
        let message = if qualified.is_empty() {
            format!("forbidden: {why}")
        } else if name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} {name:?} is forbidden: {why}")
        };
        ApiError::forbidden(message, group, resource, name)
    }
}

/// `--authorization-always-allow-paths`: exact paths, or prefixes ending in `*`; a leading `/` is optional.
#[derive(Debug, Clone, Default)]
pub struct AlwaysAllowPaths {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllowPaths {
    pub fn new(paths: &[String]) -> Result<Self, String> {
        let mut out = Self::default();
        for p in paths {
            let p = p.trim().trim_start_matches('/');
            if let Some(prefix) = p.strip_suffix('*') {
                if prefix.contains('*') {
                    return Err(format!("only a trailing * is allowed in {p:?}"));
                }
                out.prefixes.push(prefix.to_owned());
            } else if p.contains('*') {
                return Err(format!("only a trailing * is allowed in {p:?}"));
            } else {
                out.exact.push(p.to_owned());
            }
        }
        Ok(out)
    }

    fn allows(&self, attrs: &Attributes) -> bool {
        if attrs.resource.is_some() {
            return false;
        }
        let p = attrs.path.trim_start_matches('/');
        self.exact.iter().any(|e| e == p) || self.prefixes.iter().any(|pre| p.starts_with(pre.as_str()))
    }
}

pub struct AuthorizerConfig {
    pub always_allow_paths: AlwaysAllowPaths,
    pub cache: CacheLimits,
    /// How long one SubjectAccessReview may take.
    pub timeout: Duration,
}

/// A request not allowed: the Status to answer with, and the authorizer's reason (none when it could not decide).
#[derive(Debug)]
pub struct Refusal {
    pub error: ApiError,
    pub reason: Option<String>,
}

/// Decides with SubjectAccessReviews against the main API server.
pub struct Authorizer {
    client: Option<kube::Client>,
    always_allow_paths: AlwaysAllowPaths,
    /// Keyed by a digest of the review, so a long path cannot make an entry large.
    cache: DecisionCache<[u8; 32], String>,
    timeout: Duration,
    allow_all: bool,
}

impl Authorizer {
    /// Without a client every request that is not always allowed is denied.
    pub fn new(client: Option<kube::Client>, cfg: AuthorizerConfig) -> Self {
        Self {
            client,
            always_allow_paths: cfg.always_allow_paths,
            cache: DecisionCache::new(cfg.cache),
            timeout: cfg.timeout,
            allow_all: false,
        }
    }

    /// Development only (`--insecure-allow-all`): everything is allowed.
    pub fn allow_all() -> Self {
        let off = CacheLimits { allowed_ttl: Duration::ZERO, denied_ttl: Duration::ZERO, capacity: 0 };
        Self {
            client: None,
            always_allow_paths: AlwaysAllowPaths::default(),
            cache: DecisionCache::new(off),
            timeout: Duration::ZERO,
            allow_all: true,
        }
    }

    /// Ok, or the Status to answer with: 403 for a known user, 401 for an anonymous one, 500 when the main API
    /// server cannot answer (never an allow).
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> ApiResult<()> {
        self.decide(user, attrs).await.map(|_| ()).map_err(|r| r.error)
    }

    /// The decision with its reason, as audit records them: the authorizer's reason for an allow, or the refusal.
    pub async fn decide(&self, user: &UserInfo, attrs: &Attributes) -> Result<String, Refusal> {
        if self.allow_all || user.groups.iter().any(|g| g == MASTERS) {
            return Ok(String::new());
        }
        if self.always_allow_paths.allows(attrs) {
            return Ok(String::new());
        }
        let key = review_key(user, attrs);
        let cached = self.cache.get(&key).await;
        super::metrics::metrics().authz.cache_lookup(cached.is_some());
        let decision = match cached {
            Some(d) => d,
            None => {
                let d = self.ask(review_spec(user, attrs)).await.map_err(|error| Refusal { error, reason: None })?;
                self.cache.insert(key, d.clone()).await;
                d
            }
        };
        match decision {
            Decision::Allowed(reason) => Ok(reason),
            Decision::Denied(reason) if user.name == ANONYMOUS => {
                Err(Refusal { error: ApiError::unauthorized(), reason: Some(reason) })
            }
            Decision::Denied(reason) => {
                Err(Refusal { error: attrs.forbidden(&user.name, &reason), reason: Some(reason) })
            }
        }
    }

    async fn ask(&self, spec: SubjectAccessReviewSpec) -> ApiResult<Decision<String>> {
        let Some(client) = &self.client else {
            return Ok(Decision::Denied("no authorizer is configured".into()));
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        let review = SubjectAccessReview { spec, ..Default::default() };
        let metrics = &super::metrics::metrics().authz;
        let answer = super::review::review(&api, &review, self.timeout, metrics).await.map_err(|e| {
            tracing::warn!(error = %e, "SubjectAccessReview failed");
            ApiError::internal(format!("authorization check failed: {e}"))
        })?;
        let status = answer.status.unwrap_or_default();
        if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error = e, "SubjectAccessReview evaluation error");
        }
        let reason = status.reason.unwrap_or_default();
        Ok(if status.allowed && status.denied != Some(true) {
            Decision::Allowed(reason)
        } else {
            Decision::Denied(reason)
        })
    }
}

/// Feeds `Hash` into SHA-256: the derived encodings delimit every string and length, so equal digests mean equal
/// reviews, and nobody can pick a collision as with a 64-bit hash.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Unused: `Hash` impls only write; the digest is read from the inner state.
    fn finish(&self) -> u64 {
        0
    }
}

/// The cache key of a review: who asks to do what.
fn review_key(user: &UserInfo, attrs: &Attributes) -> [u8; 32] {
    let mut h = Sha256Hasher(Sha256::new());
    (user, attrs).hash(&mut h);
    h.0.finalize().into()
}

fn review_spec(user: &UserInfo, attrs: &Attributes) -> SubjectAccessReviewSpec {
    let extra: BTreeMap<String, Vec<String>> = user.extra.clone();
    SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
        groups: Some(user.groups.clone()),
        extra: (!extra.is_empty()).then_some(extra),
        resource_attributes: attrs.resource.as_ref().map(|r| ResourceAttributes {
            group: Some(r.group.clone()),
            version: Some(r.version.clone()),
            resource: Some(r.resource.clone()),
            subresource: Some(r.subresource.clone()),
            namespace: Some(r.namespace.clone()),
            name: Some(r.name.clone()),
            verb: Some(attrs.verb.clone()),
            ..Default::default()
        }),
        non_resource_attributes: attrs
            .resource
            .is_none()
            .then(|| NonResourceAttributes { path: Some(attrs.path.clone()), verb: Some(attrs.verb.clone()) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::request::RequestInfo;
    use http::Method;

    fn attrs(method: Method, path: &str, query: Option<&str>) -> Attributes {
        RequestInfo::new(&method, path, query, &crate::apiserver::routes::testing::routes()).attributes
    }

    fn res(a: &Attributes) -> (&str, &str, &str, &str, &str) {
        let r = a.resource.as_ref().expect("a resource request");
        (a.verb.as_str(), r.namespace.as_str(), r.resource.as_str(), r.name.as_str(), r.subresource.as_str())
    }

    const NS: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";

    #[test]
    fn verbs_follow_kube_apiserver_request_info() {
        assert_eq!(res(&attrs(Method::GET, NS, None)), ("list", "default", "podsets", "", ""));
        assert_eq!(res(&attrs(Method::GET, NS, Some("watch=true"))), ("watch", "default", "podsets", "", ""));
        assert_eq!(res(&attrs(Method::GET, NS, Some("watch=1"))), ("watch", "default", "podsets", "", ""));
        assert_eq!(res(&attrs(Method::GET, NS, Some("watch=false"))), ("list", "default", "podsets", "", ""));
        assert_eq!(
            res(&attrs(Method::GET, NS, Some("watch=false&watch=true"))),
            ("list", "default", "podsets", "", "")
        );
        assert_eq!(
            res(&attrs(Method::GET, NS, Some("fieldSelector=metadata.name%3Dweb&fieldSelector="))),
            ("list", "default", "podsets", "web", ""),
            "the handler also reads the first fieldSelector"
        );
        assert_eq!(
            res(&attrs(Method::GET, NS, Some("fieldSelector=&fieldSelector=metadata.name%3Dweb"))),
            ("list", "default", "podsets", "", "")
        );
        assert_eq!(
            res(&attrs(Method::GET, &format!("{NS}/web"), Some("watch=true"))),
            ("get", "default", "podsets", "web", "")
        );
        assert_eq!(
            res(&attrs(Method::GET, NS, Some("watch=1&fieldSelector=metadata.name%3Dweb"))),
            ("watch", "default", "podsets", "web", "")
        );
        assert_eq!(res(&attrs(Method::GET, &format!("{NS}/web"), None)), ("get", "default", "podsets", "web", ""));
        assert_eq!(
            res(&attrs(Method::PUT, &format!("{NS}/web/status"), None)),
            ("update", "default", "podsets", "web", "status")
        );
        assert_eq!(
            res(&attrs(Method::PATCH, &format!("{NS}/web/scale"), None)),
            ("patch", "default", "podsets", "web", "scale")
        );
        assert_eq!(res(&attrs(Method::POST, NS, None)), ("create", "default", "podsets", "", ""));
        assert_eq!(
            res(&attrs(Method::DELETE, &format!("{NS}/web"), None)),
            ("delete", "default", "podsets", "web", "")
        );
        assert_eq!(res(&attrs(Method::DELETE, NS, None)), ("deletecollection", "default", "podsets", "", ""));
        assert_eq!(
            res(&attrs(Method::GET, "/apis/demo.k8s.io/v1alpha1/watch/namespaces/default/podsets/web", None)),
            ("watch", "default", "podsets", "web", "")
        );
        assert_eq!(
            res(&attrs(Method::GET, "/apis/demo.k8s.io/v1alpha1/podsets", None)),
            ("list", "", "podsets", "", "")
        );
        // A name that is not a path segment is not taken from the selector.
        assert_eq!(
            res(&attrs(Method::GET, NS, Some("fieldSelector=metadata.name%3D.."))),
            ("list", "default", "podsets", "", "")
        );
    }

    #[test]
    fn discovery_and_health_are_non_resource() {
        for p in ["/apis", "/apis/demo.k8s.io", "/apis/demo.k8s.io/v1alpha1", "/openapi/v2", "/healthz", "/api/v1/pods"]
        {
            let a = attrs(Method::GET, p, None);
            assert!(a.resource.is_none(), "{p}");
            assert_eq!(a.verb, "get");
            assert_eq!(a.path, p);
        }
        assert_eq!(attrs(Method::POST, "/version", None).verb, "post");
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let e = attrs(Method::GET, &format!("{NS}/x"), None).forbidden("bob", "");
        assert_eq!(e.code(), 403);
        assert_eq!(e.reason(), "Forbidden");
        assert_eq!(
            e.status.message,
            r#"podsets.demo.k8s.io "x" is forbidden: User "bob" cannot get resource "podsets" in API group "demo.k8s.io" in the namespace "default""#
        );
        let d = e.status.details.as_ref().unwrap();
        assert_eq!((d.group.as_str(), d.kind.as_str(), d.name.as_str()), ("demo.k8s.io", "podsets", "x"));
        let e = attrs(Method::GET, "/apis/demo.k8s.io/v1alpha1/podsets", None).forbidden("bob", "no RBAC");
        assert_eq!(
            e.status.message,
            r#"podsets.demo.k8s.io is forbidden: User "bob" cannot list resource "podsets" in API group "demo.k8s.io" at the cluster scope: no RBAC"#
        );
        let e = attrs(Method::PUT, &format!("{NS}/x/scale"), None).forbidden("bob", "");
        assert!(e.status.message.contains(r#"cannot update resource "podsets/scale""#), "{}", e.status.message);
        let e = attrs(Method::GET, "/openapi/v2", None).forbidden("bob", "");
        assert_eq!(e.status.message, r#"forbidden: User "bob" cannot get path "/openapi/v2""#);
    }

    #[test]
    fn always_allow_paths_match_exactly_or_by_prefix() {
        let p = AlwaysAllowPaths::new(&["/healthz".into(), "livez".into(), "/metrics/*".into()]).unwrap();
        assert!(p.allows(&attrs(Method::GET, "/healthz", None)));
        assert!(p.allows(&attrs(Method::GET, "/livez", None)));
        assert!(p.allows(&attrs(Method::GET, "/metrics/x", None)));
        assert!(!p.allows(&attrs(Method::GET, "/healthz/ping", None)));
        assert!(!p.allows(&attrs(Method::GET, "/readyz", None)));
        assert!(!p.allows(&attrs(Method::GET, NS, None)), "resource requests are never path-allowed");
        assert!(AlwaysAllowPaths::new(&["/a*b".into()]).is_err());
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }

    fn authorizer() -> Authorizer {
        Authorizer::new(
            None,
            AuthorizerConfig {
                always_allow_paths: AlwaysAllowPaths::new(&["/healthz".into()]).unwrap(),
                cache: CacheLimits {
                    allowed_ttl: Duration::from_secs(10),
                    denied_ttl: Duration::from_secs(10),
                    capacity: 100,
                },
                timeout: Duration::from_secs(1),
            },
        )
    }

    #[tokio::test]
    async fn masters_and_allowed_paths_need_no_review_and_the_rest_is_denied_without_one() {
        let a = authorizer();
        let (list, health) = (attrs(Method::GET, NS, None), attrs(Method::GET, "/healthz", None));
        assert!(a.authorize(&user("root", &[MASTERS]), &list).await.is_ok());
        assert!(a.authorize(&user(ANONYMOUS, &["system:unauthenticated"]), &health).await.is_ok());
        assert_eq!(a.authorize(&user("bob", &["system:authenticated"]), &list).await.unwrap_err().code(), 403);
        assert_eq!(
            a.authorize(&user(ANONYMOUS, &["system:unauthenticated"]), &list).await.unwrap_err().code(),
            401,
            "an anonymous caller is told to authenticate"
        );
    }

    #[test]
    fn the_review_names_the_users_uid_when_there_is_one() {
        let list = attrs(Method::GET, NS, None);
        let mut bob = user("bob", &["a"]);
        assert_eq!(review_spec(&bob, &list).uid, None);
        let without = review_key(&bob, &list);
        bob.uid = "7f3e".into();
        let spec = review_spec(&bob, &list);
        assert_eq!((spec.user.as_deref(), spec.uid.as_deref()), (Some("bob"), Some("7f3e")));
        assert_ne!(review_key(&bob, &list), without, "answers are cached per UID too");
    }

    #[test]
    fn review_keys_tell_apart_who_and_what() {
        let list = attrs(Method::GET, NS, None);
        let bob = user("bob", &["a"]);
        let key = review_key(&bob, &list);
        assert_eq!(key, review_key(&bob.clone(), &list.clone()));
        assert_ne!(key, review_key(&bob, &attrs(Method::GET, NS, Some("watch=1"))));
        assert_ne!(key, review_key(&user("bob", &["a", "b"]), &list));
        // Boundaries count: "ab" + "c" is not "a" + "bc".
        assert_ne!(review_key(&user("ab", &["c"]), &list), review_key(&user("a", &["bc"]), &list));
        let mut extra = bob.clone();
        extra.extra.insert("scopes".into(), vec!["x".into()]);
        assert_ne!(key, review_key(&extra, &list));
    }
}
