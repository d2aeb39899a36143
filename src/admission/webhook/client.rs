//! Calling a webhook: where it is (`url`, or `service` as k8s.io/apiserver's default resolver has it), whom to
//! trust (`caBundle`, else the system's roots), who we are (the `kubeConfigFile` of the plugin's
//! WebhookAdmissionConfiguration, looked up by host as `defaultAuthenticationInfoResolver` does), and the call
//! itself: HTTP/1.1 over TLS as kube-apiserver does, connections kept and reused, one deadline for the whole call.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;
use kube::config::{AuthInfo, Kubeconfig};
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::ExposeSecret;

use super::verify::{GoVerifier, X509Error};
use crate::admission::error::chain;

/// Why a webhook could not be called, or answered something unusable: under `failurePolicy: Fail` the request
/// fails with kube-apiserver's 500 "failed calling webhook", under `Ignore` the webhook is skipped.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("webhook configuration must have either service or URL")]
    NoTarget,
    #[error("Unparsable URL: {0}")]
    Url(String),
    #[error("webhook does not accept known AdmissionReview versions (v1, v1beta1)")]
    NoKnownVersion,
    #[error("Webhook SideEffects is nil")]
    SideEffectsUnset,
    #[error("unable to load root certificates: {0}")]
    CaBundle(String),
    #[error("credentials for {target}: {message}")]
    Credentials { target: String, message: String },
    /// Connecting, TLS, or the exchange itself failed; Go's client says `Post "<url>": <why>`.
    #[error("Post {url:?}: {}", transport_reason(url, source))]
    Transport {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("Post {url:?}: context deadline exceeded")]
    Timeout { url: String },
    #[error("Post {url:?}: reading the response: {message}")]
    Body { url: String, message: String },
    /// A status other than 2xx: the message of the Status it sent, else what the body begins with.
    #[error("{message}")]
    Status { code: u16, message: String },
    #[error("{0}")]
    Decode(String),
    #[error("{0}")]
    Response(String),
    #[error("unsupported patch type {0:?}")]
    UnsupportedPatchType(String),
}

/// Why a call failed, in Go's words where kube-apiserver users know them (a refused connection, an unknown
/// certificate authority), else the error and its sources.
fn transport_reason(url: &str, e: &(dyn std::error::Error + 'static)) -> String {
    let mut refused = false;
    let mut x509 = None;
    visit(e, &mut |cause| {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))) =
            cause.downcast_ref::<rustls::Error>()
        {
            x509 = x509.take().or_else(|| other.0.downcast_ref::<X509Error>().map(|x| x.0.clone()));
        }
    });
    if refused {
        let host = url.parse::<http::Uri>().ok().and_then(|u| u.authority().map(|a| a.to_string()));
        return format!("dial tcp {}: connect: connection refused", host.unwrap_or_default());
    }
    if let Some(x509) = x509 {
        return format!("tls: failed to verify certificate: {x509}");
    }
    chain(e)
}

/// Calls `f` on `e` and every error under it: its sources, and what an `io::Error` wraps (which its `source`
/// skips).
fn visit(e: &(dyn std::error::Error + 'static), f: &mut dyn FnMut(&(dyn std::error::Error + 'static))) {
    f(e);
    if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
        visit(inner, f);
    }
    if let Some(source) = e.source() {
        visit(source, f);
    }
}

/// The biggest answer read from a webhook; an AdmissionReview carries at most two objects of 3 MiB each.
const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// Clients kept, one per CA bundle and identity, as k8s.io/apiserver's `ClientManager` cache.
const MAX_CLIENTS: usize = 200;

type HttpClient = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;
/// Clients by (CA bundle, name of the kubeconfig user they present).
type ClientCache = HashMap<(Vec<u8>, String), HttpClient>;

/// Where to send one webhook's reviews, and as whom.
struct Target {
    /// The URL without the `timeout` query.
    url: String,
    /// `host:port` the kubeconfig's users are looked up by.
    host_port: String,
}

fn target(cfg: &WebhookClientConfig) -> Result<Target, CallError> {
    if let Some(svc) = &cfg.service {
        let port = svc.port.filter(|p| *p != 0).unwrap_or(443);
        let host = format!("{}.{}.svc:{port}", svc.name, svc.namespace);
        let path = clean_path(svc.path.as_deref().unwrap_or(""));
        return Ok(Target { url: format!("https://{host}{path}"), host_port: host });
    }
    let Some(url) = cfg.url.as_deref().filter(|u| !u.is_empty()) else { return Err(CallError::NoTarget) };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| CallError::Url(e.to_string()))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(CallError::Url(format!("{url:?} has no scheme or host")));
    };
    let host_port = match authority.port_u16() {
        Some(_) => authority.as_str().to_owned(),
        None => format!("{}:443", authority.host()),
    };
    // client-go keeps scheme, host and path (cleaned, as path.Join does); a URL has no query to keep.
    Ok(Target { url: format!("{scheme}://{authority}{}", clean_path(uri.path())), host_port })
}

/// `path.Join`'s cleaning of a request path: no trailing slash, no empty or `.` segments.
fn clean_path(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    if segments.is_empty() {
        if path.is_empty() {
            String::new()
        } else {
            "/".into()
        }
    } else {
        format!("/{}", segments.join("/"))
    }
}

/// How we prove who we are to a webhook.
#[derive(Clone, Default)]
enum Credentials {
    #[default]
    Anonymous,
    Bearer(String),
    Basic(String),
    /// A client certificate chain and its key (PEM).
    Certificate(Vec<u8>, Vec<u8>),
}

/// The clients a webhook plugin calls webhooks with.
#[derive(Clone, Default)]
pub struct WebhookClients {
    kubeconfig: Option<Arc<Kubeconfig>>,
    clients: Arc<Mutex<ClientCache>>,
}

impl std::fmt::Debug for WebhookClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookClients").field("has_credentials", &self.has_credentials()).finish()
    }
}

impl WebhookClients {
    /// Clients that present no credentials.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Clients that present the credentials `kubeconfig` has for each webhook's host (users named `host:port`,
    /// `host`, `*.domain`, `*`, else the current context's user), as kube-apiserver reads a
    /// WebhookAdmissionConfiguration's `kubeConfigFile`.
    pub fn from_kubeconfig(path: &Path) -> Result<Self, kube::config::KubeconfigError> {
        let kubeconfig = Kubeconfig::read_from(path)?;
        Ok(Self { kubeconfig: Some(Arc::new(kubeconfig)), ..Self::default() })
    }

    /// Whether a kubeconfig gives these clients credentials.
    pub fn has_credentials(&self) -> bool {
        self.kubeconfig.is_some()
    }

    /// The user entry for `target` (`host:port`), as `defaultAuthenticationInfoResolver.clientConfig`.
    fn auth_for(&self, target: &str) -> Option<(String, AuthInfo)> {
        let kc = self.kubeconfig.as_deref()?;
        let user = |name: &str| {
            kc.auth_infos
                .iter()
                .find(|a| a.name == name)
                .map(|a| (a.name.clone(), a.auth_info.clone().unwrap_or_default()))
        };
        let by_host = |host: &str| {
            user(host).or_else(|| {
                let steps: Vec<&str> = host.split('.').collect();
                (1..steps.len()).find_map(|i| user(&format!("*.{}", steps[i..].join("."))))
            })
        };
        by_host(target).or_else(|| target.strip_suffix(":443").and_then(by_host)).or_else(|| user("*")).or_else(|| {
            let current = kc.current_context.as_deref()?;
            let context = kc.contexts.iter().find(|c| c.name == current)?.context.as_ref()?;
            user(context.user.as_deref().filter(|u| !u.is_empty())?)
        })
    }

    fn credentials(&self, target: &str) -> Result<(String, Credentials), CallError> {
        let Some((name, auth)) = self.auth_for(target) else { return Ok((String::new(), Credentials::Anonymous)) };
        let fail = |message: String| CallError::Credentials { target: target.to_owned(), message };
        if auth.auth_provider.is_some() {
            return Err(fail("auth provider not supported".into()));
        }
        if auth.exec.is_some() {
            return Err(fail(format!("user {name:?} uses an exec plugin, which podset-apiserver does not run")));
        }
        let read = |file: &str| std::fs::read(file).map_err(|e| fail(format!("reading {file}: {e}")));
        let decode =
            |data: &str| base64::engine::general_purpose::STANDARD.decode(data.trim()).map_err(|e| fail(e.to_string()));
        let creds = if let Some(token) = &auth.token {
            Credentials::Bearer(token.expose_secret().to_owned())
        } else if let Some(file) = &auth.token_file {
            Credentials::Bearer(String::from_utf8_lossy(&read(file)?).trim().to_owned())
        } else if auth.client_certificate.is_some() || auth.client_certificate_data.is_some() {
            let cert = match (&auth.client_certificate_data, &auth.client_certificate) {
                (Some(data), _) => decode(data)?,
                (None, Some(file)) => read(file)?,
                (None, None) => unreachable!(),
            };
            let key = match (&auth.client_key_data, &auth.client_key) {
                (Some(data), _) => decode(data.expose_secret())?,
                (None, Some(file)) => read(file)?,
                (None, None) => return Err(fail(format!("user {name:?} has a client certificate but no key"))),
            };
            Credentials::Certificate(cert, key)
        } else if auth.username.is_some() || auth.password.is_some() {
            let password = auth.password.as_ref().map(|p| p.expose_secret().to_owned()).unwrap_or_default();
            let pair = format!("{}:{password}", auth.username.as_deref().unwrap_or(""));
            Credentials::Basic(base64::engine::general_purpose::STANDARD.encode(pair))
        } else {
            Credentials::Anonymous
        };
        Ok((name, creds))
    }

    /// The client for a CA bundle and an identity, made once.
    fn client(&self, ca_bundle: &[u8], identity: &str, creds: &Credentials) -> Result<HttpClient, CallError> {
        let key = (ca_bundle.to_vec(), identity.to_owned());
        if let Some(c) = self.clients.lock().get(&key) {
            return Ok(c.clone());
        }
        let (roots, bundle) = if ca_bundle.is_empty() {
            (system_roots().clone(), Vec::new())
        } else {
            let mut roots = rustls::RootCertStore::empty();
            let mut bundle = Vec::new();
            for cert in CertificateDer::pem_slice_iter(ca_bundle) {
                let cert = cert.map_err(|e| CallError::CaBundle(e.to_string()))?;
                roots.add(cert.clone()).map_err(|e| CallError::CaBundle(e.to_string()))?;
                bundle.push(cert);
            }
            if roots.is_empty() {
                return Err(CallError::CaBundle("unable to parse bytes as PEM block".into()));
            }
            (Arc::new(roots), bundle)
        };
        let provider = crypto_provider();
        let verifier =
            GoVerifier::new(roots, bundle, provider.clone()).map_err(|e| CallError::CaBundle(e.to_string()))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| CallError::CaBundle(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let tls = match creds {
            Credentials::Certificate(cert, key) => {
                let fail = |message: String| CallError::Credentials { target: identity.to_owned(), message };
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| fail(format!("client certificate: {e}")))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| fail(format!("client key: {e}")))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| fail(e.to_string()))?
            }
            _ => builder.with_no_client_auth(),
        };
        // HTTP/1.1 only, as kube-apiserver (kubernetes#75791: HTTP/2 kept every call on one backend).
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http1().build();
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        let mut clients = self.clients.lock();
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// POSTs `review` to the webhook and returns the body of its 2xx answer, all within `timeout`.
    pub(crate) async fn post(
        &self,
        cfg: &WebhookClientConfig,
        review: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let target = target(cfg)?;
        let ca_bundle = cfg.ca_bundle.as_ref().map(|b| b.0.as_slice()).unwrap_or_default();
        // kube-apiserver tells the webhook its deadline, in whole seconds rounded up.
        let url = format!("{}?timeout={}s", target.url, timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0));
        let body = Bytes::from(review.to_string());
        self.post_to(&url, &target.host_port, ca_bundle, body, timeout, "podset-apiserver-admission").await
    }

    /// POSTs a JSON `body` to `url` (whose `host:port` picks the kubeconfig's user), trusting `ca_bundle` (the
    /// system's roots if empty), and returns the body of its 2xx answer, all within `timeout`.
    pub async fn post_to(
        &self,
        url: &str,
        host_port: &str,
        ca_bundle: &[u8],
        body: Bytes,
        timeout: Duration,
        user_agent: &str,
    ) -> Result<Bytes, CallError> {
        let (identity, creds) = self.credentials(host_port)?;
        let client = self.client(ca_bundle, &identity, &creds)?;
        let url = url.to_owned();
        let mut req = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, */*")
            .header(http::header::USER_AGENT, user_agent);
        match &creds {
            Credentials::Bearer(t) => req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}")),
            Credentials::Basic(b) => req = req.header(http::header::AUTHORIZATION, format!("Basic {b}")),
            _ => {}
        }
        let mut req = req.body(Full::new(body)).map_err(|e| CallError::Url(e.to_string()))?;
        crate::trace::inject_current(req.headers_mut());
        let call = async {
            let resp = client.request(req).await.map_err(|source| CallError::Transport { url: url.clone(), source })?;
            let code = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| CallError::Body { url: url.clone(), message: e.to_string() })?
                .to_bytes();
            Ok((code, body))
        };
        let (code, body) =
            tokio::time::timeout(timeout, call).await.map_err(|_| CallError::Timeout { url: url.clone() })??;
        if !(200..300).contains(&code) {
            return Err(CallError::Status { code, message: status_message(code, &body) });
        }
        Ok(body)
    }
}

/// What client-go says of a non-2xx answer: the message of the Status in it, else that the server failed.
fn status_message(code: u16, body: &[u8]) -> String {
    let status: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if let Some(m) = status.as_ref().and_then(|s| s["message"].as_str()).filter(|m| !m.is_empty()) {
        return m.to_owned();
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
    if code >= 500 {
        format!("an error on the server ({text:?}) has prevented the request from succeeding")
    } else {
        format!("the server responded with the status code {code} but did not return more information: {text:?}")
    }
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The system's trusted roots, read once: for webhooks without a caBundle.
fn system_roots() -> &'static Arc<rustls::RootCertStore> {
    static ROOTS: OnceLock<Arc<rustls::RootCertStore>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "admission webhooks: reading the system's root certificates");
        }
        let mut roots = rustls::RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        tracing::debug!(added, ignored, "admission webhooks: system root certificates");
        Arc::new(roots)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::ServiceReference;

    fn url(u: &str) -> WebhookClientConfig {
        WebhookClientConfig { url: Some(u.into()), ..Default::default() }
    }

    #[test]
    fn targets_resolve_as_kube_apiservers_default_resolver() {
        let svc = |port, path: Option<&str>| WebhookClientConfig {
            service: Some(ServiceReference {
                name: "hook".into(),
                namespace: "policy".into(),
                port,
                path: path.map(Into::into),
            }),
            ..Default::default()
        };
        let t = target(&svc(None, Some("/validate"))).unwrap();
        assert_eq!(
            (t.url.as_str(), t.host_port.as_str()),
            ("https://hook.policy.svc:443/validate", "hook.policy.svc:443")
        );
        let t = target(&svc(Some(8443), None)).unwrap();
        assert_eq!((t.url.as_str(), t.host_port.as_str()), ("https://hook.policy.svc:8443", "hook.policy.svc:8443"));
        let t = target(&url("https://10.0.0.1/a/b/")).unwrap();
        assert_eq!((t.url.as_str(), t.host_port.as_str()), ("https://10.0.0.1/a/b", "10.0.0.1:443"));
        let t = target(&url("https://hooks.example.com:9443")).unwrap();
        assert_eq!(
            (t.url.as_str(), t.host_port.as_str()),
            ("https://hooks.example.com:9443/", "hooks.example.com:9443")
        );
        assert_eq!(
            target(&WebhookClientConfig::default()).err().unwrap().to_string(),
            "webhook configuration must have either service or URL"
        );
        assert!(target(&url("not a url")).err().unwrap().to_string().starts_with("Unparsable URL: "));
    }

    #[test]
    fn credentials_are_looked_up_by_host_as_kube_apiserver_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("webhooks.kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: x, user: fallback}\n\
             users:\n- name: hook.policy.svc:8443\n  user: {token: exact}\n- name: hook.policy.svc\n  user: {token: no-port}\n\
             - name: '*.example.com'\n  user: {username: u, password: p}\n- name: fallback\n  user: {token: current}\n",
        )
        .unwrap();
        let clients = WebhookClients::from_kubeconfig(&path).unwrap();
        let token = |target: &str| match clients.credentials(target).unwrap().1 {
            Credentials::Bearer(t) => t,
            Credentials::Basic(b) => format!("basic {b}"),
            _ => "none".into(),
        };
        assert_eq!(token("hook.policy.svc:8443"), "exact");
        assert_eq!(token("hook.policy.svc:443"), "no-port", "the default port may be left out");
        assert_eq!(token("hook.policy.svc:9443"), "current");
        assert_eq!(
            token("a.hooks.example.com:443"),
            format!("basic {}", base64::engine::general_purpose::STANDARD.encode("u:p"))
        );
        assert_eq!(WebhookClients::anonymous().credentials("x:443").unwrap().0, "");
    }

    #[test]
    fn a_non_2xx_answer_says_what_the_server_said() {
        assert_eq!(status_message(403, br#"{"kind":"Status","message":"go away"}"#), "go away");
        assert_eq!(
            status_message(500, b"oops"),
            "an error on the server (\"oops\") has prevented the request from succeeding"
        );
        assert!(status_message(404, b"").starts_with("the server responded with the status code 404"));
    }
}
