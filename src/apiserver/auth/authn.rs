//! Who is calling, decided as k8s.io/apiserver's delegated authenticator does, first success wins:
//! 1. the front proxy's `X-Remote-*` headers, on a connection whose client certificate chains to the request-header
//!    CA and has an allowed CN;
//! 2. a client certificate from the cluster's client CA (user = CN, groups = O);
//! 3. a bearer token, reviewed by the main API server (TokenReview, cached).
//!
//! A credential that was presented and failed is a 401, never a fall back to anonymous. With none, the caller is
//! `system:anonymous`, which authorization then treats as it says. The trust anchors can change at run time
//! (the cluster's `extension-apiserver-authentication` ConfigMap), so a connection's certificate is judged against
//! the current ones.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderMap};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use super::cache::{CacheLimits, Decision, DecisionCache};
use super::trust::{DynamicTrust, RequestHeader, Trust};
use crate::api::UserInfo;
use crate::apiserver::error::{ApiError, ApiResult};

pub use crate::api::request::{ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED};

/// What a connection presented in its TLS handshake, and a memo of what that proves under the current trust.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    chain: Option<Arc<Vec<CertificateDer<'static>>>>,
    memo: Arc<Mutex<Option<Memo>>>,
}

/// What a connection's certificate proved, under which trust generation, and until when (Unix seconds).
#[derive(Debug, Clone)]
struct Memo {
    generation: u64,
    until: i64,
    outcome: CertOutcome,
}

/// How long a verdict on a connection's certificate stands before it is checked again.
const RECHECK_SECONDS: i64 = 60;

impl ConnInfo {
    pub fn new(remote: SocketAddr, chain: Option<&[CertificateDer<'_>]>) -> Self {
        let chain =
            chain.filter(|c| !c.is_empty()).map(|c| Arc::new(c.iter().map(|d| d.clone().into_owned()).collect()));
        Self { remote, chain, memo: Arc::new(Mutex::new(None)) }
    }
}

/// What a client certificate proves.
#[derive(Debug, Clone, Default)]
struct CertOutcome {
    /// Verified against the request-header CA with an allowed CN: the headers may be believed.
    front_proxy: bool,
    /// Verified against the client CA.
    client: Option<UserInfo>,
    /// A configured verifier rejected the chain (a 401 unless something else authenticates).
    rejected: Option<String>,
}

/// Bearer tokens, reviewed by the main API server.
pub struct TokenReviewer {
    client: kube::Client,
    cache: DecisionCache<[u8; 32], UserInfo>,
    timeout: Duration,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, cache: CacheLimits, timeout: Duration) -> Self {
        Self { client, cache: DecisionCache::new(cache), timeout }
    }

    /// The user, `Ok(None)` for a token the main API server rejects, `Err` when it cannot be asked.
    async fn review(&self, token: &str) -> Result<Option<UserInfo>, String> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cached = self.cache.get(&key).await;
        super::metrics::metrics().authn.cache_lookup(cached.is_some());
        match cached {
            Some(Decision::Allowed(u)) => return Ok(Some(u)),
            Some(Decision::Denied(_)) => return Ok(None),
            None => {}
        }
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review =
            TokenReview { spec: TokenReviewSpec { token: token.to_owned(), audiences: None }, ..Default::default() };
        // Before the request's span (authentication comes first): a trace of its own, sampled as new traces are.
        let span = || tracing::info_span!(target: crate::trace::ROOT, "TokenReview");
        let asked = super::review::review(&api, &review, self.timeout, &super::metrics::metrics().authn);
        let answer = crate::trace::new_trace(span, asked).await.map_err(|e| format!("TokenReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        let user = status
            .user
            .filter(|u| status.authenticated == Some(true) && u.username.as_deref().is_some_and(|n| !n.is_empty()));
        let decision = match user {
            Some(u) => Decision::Allowed(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            None => Decision::Denied(status.error.unwrap_or_default()),
        };
        self.cache.insert(key, decision.clone()).await;
        Ok(match decision {
            Decision::Allowed(u) => Some(u),
            Decision::Denied(_) => None,
        })
    }
}

#[derive(Default)]
pub struct Authenticator {
    pub trust: Arc<DynamicTrust>,
    pub tokens: Option<TokenReviewer>,
    /// Development only: a caller nothing else identifies is an administrator.
    pub insecure_allow_all: bool,
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = auth.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authenticator {
    fn judge(&self, conn: &ConnInfo) -> (Arc<Trust>, CertOutcome) {
        let (generation, trust) = self.trust.get();
        let Some(chain) = &conn.chain else { return (trust, CertOutcome::default()) };
        let now = jiff::Timestamp::now().as_second();
        let mut memo = conn.memo.lock();
        if let Some(m) = memo.as_ref() {
            if m.generation == generation && now < m.until {
                return (trust, m.outcome.clone());
            }
        }
        let mut out = CertOutcome::default();
        let mut until = now + RECHECK_SECONDS;
        if let Some(rh) = &trust.request_header {
            match rh.ca.verify(chain) {
                None => out.rejected = Some("the certificate is not signed by the request-header CA".into()),
                Some(s) if !rh.allowed_names.is_empty() && !rh.allowed_names.contains(&s.common_name) => {
                    out.rejected = Some(format!("{:?} is not an allowed request-header client name", s.common_name))
                }
                Some(s) => {
                    out.front_proxy = true;
                    until = until.min(s.not_after);
                }
            }
        }
        if let Some(ca) = &trust.client_ca {
            match ca.verify(chain) {
                Some(s) => {
                    until = until.min(s.not_after);
                    out.client = Some(UserInfo::named(s.common_name, s.organizations).authenticated());
                }
                None => {
                    out.rejected.get_or_insert_with(|| "the certificate is not signed by the client CA".into());
                }
            }
        }
        *memo = Some(Memo { generation, until, outcome: out.clone() });
        (trust, out)
    }

    /// The caller of a request. Identity headers and the bearer token are removed from `headers` either way:
    /// nothing after this point may read them.
    pub async fn authenticate(&self, conn: &ConnInfo, headers: &mut HeaderMap) -> ApiResult<UserInfo> {
        let (trust, cert) = self.judge(conn);
        let from_proxy = match (&trust.request_header, cert.front_proxy) {
            (Some(rh), true) => from_headers(rh, headers),
            _ => None,
        };
        strip_identity(trust.request_header.as_ref(), headers);
        let token = bearer_token(headers).map(str::to_owned);
        headers.remove(header::AUTHORIZATION);

        if let Some(user) = from_proxy {
            return Ok(user.authenticated());
        }
        if let Some(user) = cert.client {
            return Ok(user);
        }
        if self.insecure_allow_all {
            return Ok(UserInfo::named("system:admin", vec!["system:masters".into(), AUTHENTICATED.into()]));
        }
        if let (Some(token), Some(reviewer)) = (token, &self.tokens) {
            return match reviewer.review(&token).await {
                Ok(Some(user)) => Ok(user.authenticated()),
                Ok(None) => Err(ApiError::unauthorized()),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot authenticate a bearer token");
                    Err(ApiError::service_unavailable(format!("authentication is unavailable: {e}")))
                }
            };
        }
        if let Some(why) = cert.rejected {
            tracing::debug!(remote = %conn.remote, why, "client certificate rejected");
            return Err(ApiError::unauthorized());
        }
        Ok(UserInfo::anonymous())
    }
}

const DEFAULT_IDENTITY_HEADERS: [&str; 3] = ["x-remote-user", "x-remote-uid", "x-remote-group"];
const DEFAULT_EXTRA_PREFIX: &str = "x-remote-extra-";

/// Removes every header that could claim an identity, configured or default.
fn strip_identity(rh: Option<&RequestHeader>, headers: &mut HeaderMap) {
    let claims = |k: &str| {
        DEFAULT_IDENTITY_HEADERS.contains(&k)
            || k.starts_with(DEFAULT_EXTRA_PREFIX)
            || rh.is_some_and(|rh| {
                rh.username_headers.iter().chain(&rh.uid_headers).chain(&rh.group_headers).any(|h| h == k)
                    || rh.extra_headers_prefixes.iter().any(|p| k.starts_with(p.as_str()))
            })
    };
    let doomed: Vec<_> = headers.keys().filter(|k| claims(k.as_str())).cloned().collect();
    for k in doomed {
        headers.remove(k);
    }
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

fn from_headers(rh: &RequestHeader, headers: &HeaderMap) -> Option<UserInfo> {
    let name = rh.username_headers.iter().find_map(|h| values(headers, h).next())?.to_owned();
    let uid = rh.uid_headers.iter().find_map(|h| values(headers, h).next()).unwrap_or_default().to_owned();
    let groups = rh.group_headers.iter().flat_map(|h| values(headers, h)).map(str::to_owned).collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (header, value) in headers {
        for prefix in &rh.extra_headers_prefixes {
            if let Some(key) = header.as_str().strip_prefix(prefix.as_str()) {
                let key = percent_decode(key).to_lowercase();
                if let Ok(v) = value.to_str() {
                    extra.entry(key).or_default().push(v.to_owned());
                }
            }
        }
    }
    Some(UserInfo { name, uid, groups, extra })
}

/// Extra keys are percent-encoded in header names (kube-apiserver's `headerKeyEscape`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::tls::{make_ca, ClientCa};
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};

    #[test]
    fn extra_keys_are_unescaped() {
        assert_eq!(percent_decode("scopes"), "scopes");
        assert_eq!(percent_decode("example.com%2fteam"), "example.com/team");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }

    struct Ca {
        pem: String,
        key: KeyPair,
        params: CertificateParams,
    }

    fn ca(name: &str) -> Ca {
        let (pem, key, params) = make_ca(name).unwrap();
        Ca { pem, key, params }
    }

    fn leaf(ca: &Ca, cn: &str, orgs: &[&str]) -> CertificateDer<'static> {
        leaf_with(ca, cn, orgs, |_| {})
    }

    fn leaf_with(
        ca: &Ca,
        cn: &str,
        orgs: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> CertificateDer<'static> {
        let issuer = Issuer::new(ca.params.clone(), &ca.key);
        let mut p = CertificateParams::default();
        edit(&mut p);
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        p.signed_by(&key, &issuer).unwrap().der().clone()
    }

    fn client_ca(ca: &Ca) -> ClientCa {
        ClientCa::from_pem(ca.pem.as_bytes(), std::path::Path::new("test")).unwrap()
    }

    fn request_header(ca: &Ca, allowed: &[&str]) -> RequestHeader {
        RequestHeader::new(
            client_ca(ca),
            allowed.iter().map(|s| s.to_string()).collect(),
            &["X-Remote-User".into()],
            &["X-Remote-Group".into()],
            &["X-Remote-Extra-".into()],
        )
    }

    fn conn(cert: Option<CertificateDer<'static>>) -> ConnInfo {
        let chain = cert.map(|c| vec![c]);
        ConnInfo::new("127.0.0.1:1".parse().unwrap(), chain.as_deref())
    }

    fn forged() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "admin".parse().unwrap());
        h.insert("x-remote-group", "system:masters".parse().unwrap());
        h.insert("x-remote-extra-scopes", "all".parse().unwrap());
        h
    }

    fn auth(trust: Trust) -> Authenticator {
        Authenticator { trust: Arc::new(DynamicTrust::new(trust)), ..Default::default() }
    }

    #[tokio::test]
    async fn headers_count_only_on_a_verified_allowed_proxy_certificate_and_are_stripped() {
        let proxy_ca = ca("front-proxy-ca");
        let cluster_ca = ca("cluster-ca");
        let a = auth(Trust {
            request_header: Some(request_header(&proxy_ca, &["front-proxy-client"])),
            client_ca: Some(client_ca(&cluster_ca)),
        });

        let mut h = forged();
        let u = a.authenticate(&conn(Some(leaf(&proxy_ca, "front-proxy-client", &[]))), &mut h).await.unwrap();
        assert_eq!(u.name, "admin");
        assert_eq!(u.groups, vec!["system:masters", AUTHENTICATED]);
        assert_eq!(u.extra.get("scopes"), Some(&vec!["all".to_owned()]));
        assert!(h.is_empty(), "identity headers left for later code: {h:?}");

        // No certificate: forged headers are ignored (and stripped); the caller is anonymous.
        let mut h = forged();
        assert_eq!(a.authenticate(&conn(None), &mut h).await.unwrap(), UserInfo::anonymous());
        assert!(h.is_empty());

        // A proxy certificate with a CN that is not allowed, or from another CA: a failed credential is a 401.
        for cert in [leaf(&proxy_ca, "someone-else", &[]), leaf(&ca("other"), "front-proxy-client", &[])] {
            let e = a.authenticate(&conn(Some(cert)), &mut forged()).await.unwrap_err();
            assert_eq!(e.code(), 401);
        }

        // The proxy's certificate without a user header proves nothing the client CA accepts: 401, not anonymous.
        let e = a
            .authenticate(&conn(Some(leaf(&proxy_ca, "front-proxy-client", &[]))), &mut HeaderMap::new())
            .await
            .unwrap_err();
        assert_eq!(e.code(), 401);

        // A client certificate from the cluster CA: CN and O, headers ignored.
        let u = a.authenticate(&conn(Some(leaf(&cluster_ca, "carol", &["dev"]))), &mut forged()).await.unwrap();
        assert_eq!((u.name.as_str(), u.groups.clone()), ("carol", vec!["dev".into(), AUTHENTICATED.into()]));
    }

    #[tokio::test]
    async fn an_open_connection_stops_counting_once_its_certificate_expires() {
        let proxy_ca = ca("front-proxy-ca");
        let a = auth(Trust { request_header: Some(request_header(&proxy_ca, &[])), client_ca: None });
        let now = time::OffsetDateTime::now_utc();
        let short = leaf_with(&proxy_ca, "front-proxy-client", &[], |p| {
            p.not_before = now - time::Duration::minutes(1);
            p.not_after = now + time::Duration::seconds(2);
        });
        let c = conn(Some(short));
        assert_eq!(a.authenticate(&c, &mut forged()).await.unwrap().name, "admin");
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        assert_eq!(a.authenticate(&c, &mut forged()).await.unwrap_err().code(), 401, "an expired certificate");
    }

    #[tokio::test]
    async fn the_front_proxys_uid_is_read_only_when_configured_and_always_stripped() {
        let proxy_ca = ca("front-proxy-ca");
        let proxy = || conn(Some(leaf(&proxy_ca, "front-proxy-client", &[])));
        let with_uid = || {
            let mut h = forged();
            h.insert("x-remote-uid", "4d3c-uid".parse().unwrap());
            h
        };
        let old = auth(Trust { request_header: Some(request_header(&proxy_ca, &[])), client_ca: None });
        let mut h = with_uid();
        assert_eq!(old.authenticate(&proxy(), &mut h).await.unwrap().uid, "", "not configured: not believed");
        assert!(h.is_empty(), "but stripped: {h:?}");

        let rh = request_header(&proxy_ca, &[]).with_uid_headers(&["X-Remote-Uid".into()]);
        let new = auth(Trust { request_header: Some(rh), client_ca: None });
        let mut h = with_uid();
        let u = new.authenticate(&proxy(), &mut h).await.unwrap();
        assert_eq!((u.name.as_str(), u.uid.as_str()), ("admin", "4d3c-uid"));
        assert!(h.is_empty(), "{h:?}");
        assert_eq!(new.authenticate(&proxy(), &mut forged()).await.unwrap().uid, "", "a proxy that sends none");
        // Without the proxy's certificate a UID proves nothing either.
        assert_eq!(new.authenticate(&conn(None), &mut with_uid()).await.unwrap(), UserInfo::anonymous());
    }

    #[tokio::test]
    async fn configured_header_names_match_whatever_their_case() {
        let proxy_ca = ca("front-proxy-ca");
        let rh = RequestHeader::new(
            client_ca(&proxy_ca),
            vec![],
            &["X-Proxy-User".into()],
            &["X-Proxy-Group".into()],
            &["X-Proxy-Extra-".into()],
        );
        let a = auth(Trust { request_header: Some(rh), client_ca: None });
        let mut h = HeaderMap::new();
        h.insert("x-proxy-user", "dora".parse().unwrap());
        h.insert("x-proxy-group", "team".parse().unwrap());
        h.insert("x-proxy-extra-Scopes", "read".parse().unwrap());
        h.insert("x-remote-user", "admin".parse().unwrap());
        let u = a.authenticate(&conn(Some(leaf(&proxy_ca, "any", &[]))), &mut h).await.unwrap();
        assert_eq!((u.name.as_str(), u.groups.clone()), ("dora", vec!["team".into(), AUTHENTICATED.into()]));
        assert_eq!(u.extra.get("scopes"), Some(&vec!["read".to_owned()]));
        assert!(h.is_empty(), "configured and default identity headers are both stripped: {h:?}");
    }

    #[tokio::test]
    async fn a_trust_change_is_seen_by_open_connections() {
        let proxy_ca = ca("front-proxy-ca");
        let a =
            auth(Trust { request_header: Some(request_header(&proxy_ca, &["front-proxy-client"])), client_ca: None });
        let c = conn(Some(leaf(&proxy_ca, "other-proxy", &[])));
        assert_eq!(a.authenticate(&c, &mut forged()).await.unwrap_err().code(), 401);
        a.trust.set(Trust {
            request_header: Some(request_header(&proxy_ca, &["front-proxy-client", "other-proxy"])),
            client_ca: None,
        });
        assert_eq!(a.authenticate(&c, &mut forged()).await.unwrap().name, "admin");
        // And a name taken away stops working on the same connection.
        a.trust
            .set(Trust { request_header: Some(request_header(&proxy_ca, &["front-proxy-client"])), client_ca: None });
        assert_eq!(a.authenticate(&c, &mut forged()).await.unwrap_err().code(), 401);
        // So does a rotated CA.
        let proxy = conn(Some(leaf(&proxy_ca, "front-proxy-client", &[])));
        assert_eq!(a.authenticate(&proxy, &mut forged()).await.unwrap().name, "admin");
        a.trust.set(Trust { request_header: Some(request_header(&ca("new-ca"), &[])), client_ca: None });
        assert_eq!(a.authenticate(&proxy, &mut forged()).await.unwrap_err().code(), 401);
    }

    #[tokio::test]
    async fn bearer_tokens_without_a_reviewer_are_stripped_and_the_caller_stays_anonymous() {
        let a = auth(Trust::default());
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(a.authenticate(&conn(None), &mut h).await.unwrap(), UserInfo::anonymous());
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert_eq!(
            bearer_token(&{
                let mut h = HeaderMap::new();
                h.insert(header::AUTHORIZATION, "bearer  x".parse().unwrap());
                h
            }),
            None,
            "an empty token after the scheme is no token"
        );
        let open = Authenticator { insecure_allow_all: true, ..Default::default() };
        assert_eq!(open.authenticate(&conn(None), &mut forged()).await.unwrap().name, "system:admin");
    }
}
