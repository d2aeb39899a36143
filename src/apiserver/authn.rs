//! Who is calling: the front proxy's `X-Remote-*` headers, believed only on a connection whose client certificate
//! chains to the request-header CA (with an allowed CN), or everyone as an admin under `--insecure-allow-all`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use http::HeaderMap;
use rustls::pki_types::CertificateDer;

use super::error::{ApiError, ApiResult};
use super::tls::ClientCa;

/// What a connection proved in its TLS handshake.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    /// The CN of a client certificate that verified against the request-header CA and is an allowed name.
    pub front_proxy: Option<String>,
}

/// The caller, as Kubernetes' `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// `--requestheader-*` settings.
#[derive(Clone)]
pub struct RequestHeader {
    pub ca: ClientCa,
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

#[derive(Clone, Default)]
pub struct Authenticator {
    pub request_header: Option<RequestHeader>,
    pub insecure_allow_all: bool,
}

impl Authenticator {
    /// Checks a connection's client chain once, at handshake time.
    pub fn front_proxy_identity(&self, chain: Option<&[CertificateDer<'_>]>) -> Option<String> {
        let rh = self.request_header.as_ref()?;
        let cn = rh.ca.verify(chain?)?;
        (rh.allowed_names.is_empty() || rh.allowed_names.contains(&cn)).then_some(cn)
    }

    pub fn authenticate(&self, conn: &ConnInfo, headers: &HeaderMap) -> ApiResult<User> {
        if let (Some(rh), Some(_)) = (&self.request_header, &conn.front_proxy) {
            if let Some(user) = from_headers(rh, headers) {
                return Ok(user);
            }
        }
        if self.insecure_allow_all {
            return Ok(User {
                name: "system:admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                extra: BTreeMap::new(),
            });
        }
        Err(ApiError::unauthorized())
    }
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

fn from_headers(rh: &RequestHeader, headers: &HeaderMap) -> Option<User> {
    let name = rh.username_headers.iter().find_map(|h| values(headers, h).next())?.to_owned();
    let groups = rh.group_headers.iter().flat_map(|h| values(headers, h)).map(str::to_owned).collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (header, value) in headers {
        let lower = header.as_str();
        for prefix in &rh.extra_headers_prefixes {
            let prefix = prefix.to_ascii_lowercase();
            if let Some(key) = lower.strip_prefix(prefix.as_str()) {
                let key = percent_decode(key);
                if let Ok(v) = value.to_str() {
                    extra.entry(key).or_default().push(v.to_owned());
                }
            }
        }
    }
    Some(User { name, groups, extra })
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

    #[test]
    fn extra_keys_are_unescaped() {
        assert_eq!(percent_decode("scopes"), "scopes");
        assert_eq!(percent_decode("example.com%2fteam"), "example.com/team");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }

    #[test]
    fn no_trusted_connection_means_unauthorized() {
        let a = Authenticator::default();
        let conn = ConnInfo { remote: "127.0.0.1:1".parse().unwrap(), front_proxy: None };
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "admin".parse().unwrap());
        assert_eq!(a.authenticate(&conn, &h).unwrap_err().code(), 401);
        let open = Authenticator { insecure_allow_all: true, ..Default::default() };
        assert_eq!(open.authenticate(&conn, &h).unwrap().name, "system:admin");
    }
}
