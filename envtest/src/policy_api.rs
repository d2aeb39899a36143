//! A front for kube-apiserver that serves the `admissionregistration.k8s.io/v1` admission policy resources itself:
//! ValidatingAdmissionPolicies and their bindings (GA in 1.30), and MutatingAdmissionPolicies and their bindings (GA
//! in 1.36). The test control plane runs kube-apiserver 1.20, which has none of them, and tests of
//! podset-apiserver's policy admission need a cluster that serves them by their wire contract. Everything else is
//! forwarded to kube-apiserver unchanged, streaming both ways.
//!
//! The four resources live in memory (lost when the cluster stops) under one resourceVersion counter, as etcd's
//! revision: create, get, list, watch (from a resourceVersion, bookmarks, streaming lists, and once the change is
//! forgotten an ERROR event carrying a `410 Gone` Status, reason Expired, as kube-apiserver's watch cache sends
//! it), update with optimistic concurrency, the ValidatingAdmissionPolicies' `status` (MutatingAdmissionPolicy has
//! no status subresource in v1), merge / strategic-merge / JSON / apply patches, delete and deletecollection,
//! kube-apiserver's defaults for matching, Table output for kubectl, errors as `metav1.Status`. Discovery of
//! `/apis/admissionregistration.k8s.io/v1` is kube-apiserver's with the four resources added (kubectl 1.37 asks
//! `/apis` for aggregated discovery, gets 1.20's legacy list and reads each group version).
//! What it leaves out: managedFields (an apply patch creates, or merges onto the object: fields it no longer names
//! stay), OpenAPI (`kubectl explain`), CEL checks and most field validation (unknown fields are dropped even with
//! `fieldValidation=Strict`), paging and resourceVersion on lists (a list is whole and current), impersonation on
//! the served resources (refused with 400; forwarded requests may impersonate).
//!
//! Identity: kube-apiserver must see each caller as itself, for RBAC and its own answers. A bearer token (or none)
//! passes through as it came. A client certificate cannot be passed on, so the front, which holds the cluster CA's
//! key, verifies the caller's certificate against that CA and forwards over a connection with a certificate of its
//! own for the same subject (CN the user, O the groups) signed by the same CA: kube-apiserver authenticates the
//! same user and groups as if the caller had come straight, with no impersonation rights involved, and
//! `Impersonate-*` headers a caller sends are judged by kube-apiserver against the caller, as they would be.
//! For the served resources the front decides with a SubjectAccessReview to kube-apiserver for that identity (a
//! token's is found with a TokenReview), so RBAC grants decide as they would on a 1.36 kube-apiserver.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use podset_apiserver::api::selector::{FieldSelector, Selector};
use podset_apiserver::api::table::human_duration;
use podset_apiserver::api::validation::dns1123_subdomain_errors;
use podset_apiserver::apiserver::tls::{provider, read_certs, subject};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{Cluster, Credential, NODE_IP};

const GROUP: &str = "admissionregistration.k8s.io";
const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";
const PREFIX: &str = "/apis/admissionregistration.k8s.io/v1";
/// Changes kept for watches to resume from; older resourceVersions get `410 Gone`, as after etcd's compaction.
const HISTORY: usize = 1000;
/// How often an idle watch that asked for bookmarks gets one: kube-apiserver sends one about every minute, this
/// sends them often enough for a test to see.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// A watch without `timeoutSeconds` ends after this, as kube-apiserver's `--min-request-timeout` default.
const WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The annotation on the bookmark that ends a watch's initial events (`sendInitialEvents=true`).
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;
type Upstream = hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One request the front answered, for tests to see who asked what of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontRequest {
    /// The client certificate's CN; `Bearer` for a token, `anonymous` for neither.
    pub user: String,
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// Its status code (a watch's or other stream's, at its start).
    pub code: u16,
}

/// How many requests the front remembers.
const REQUESTS_KEPT: usize = 10_000;

/// The front, serving on a loopback port from a thread and runtime of its own (so synchronous and async tests can
/// both use it) until dropped.
pub struct PolicyApi {
    addr: SocketAddr,
    front: Arc<Front>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PolicyApi {
    /// Serves in front of kube-apiserver at `upstream` (`https://127.0.0.1:<port>`), with a serving certificate from
    /// the cluster CA (`ca_cert`, `ca_key`), which also signs the certificates it forwards with.
    pub(crate) fn start(upstream: &str, ca_cert: &Path, ca_key: &Path) -> Self {
        let provider = provider();
        let ca_pem = std::fs::read_to_string(ca_cert).expect("the cluster CA");
        let ca_key_pem = std::fs::read_to_string(ca_key).expect("the cluster CA's key");
        let mut roots = RootCertStore::empty();
        for c in read_certs(ca_cert).expect("the cluster CA") {
            roots.add(c).expect("a CA certificate");
        }
        let roots = Arc::new(roots);
        let front = Arc::new(Front {
            upstream: upstream.trim_end_matches('/').to_owned(),
            ca_pem,
            ca_key_pem,
            roots: roots.clone(),
            clients: Mutex::new(HashMap::new()),
            store: Mutex::new(Store::default()),
            changed: watch::channel(0).0,
            requests: Mutex::new(VecDeque::new()),
        });

        let (cert, key) = front.leaf(
            "policy-api-front",
            &[],
            &["127.0.0.1", "localhost", NODE_IP],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        // Callers may come with a client certificate of the cluster CA, a token, or neither, as to kube-apiserver.
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .allow_unauthenticated()
            .build()
            .expect("a client verifier");
        let mut tls = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert], key)
            .expect("the front's serving certificate");
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port for the policy API front");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("its address");
        let (stop, mut stopped) = oneshot::channel();
        let serving = front.clone();
        let thread = std::thread::Builder::new()
            .name("policy-api-front".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
                runtime.expect("a runtime for the policy API front").block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    loop {
                        let (tcp, _) = tokio::select! {
                            accepted = listener.accept() => match accepted {
                                Ok(a) => a,
                                Err(_) => continue,
                            },
                            _ = &mut stopped => break,
                        };
                        tokio::spawn(serving.clone().connection(acceptor.clone(), tcp));
                    }
                    // Leaving drops the runtime, and with it every connection and watch.
                });
            })
            .expect("a thread for the policy API front");
        Self { addr, front, stop: Some(stop), thread: Some(thread) }
    }

    /// `https://127.0.0.1:<port>`: its certificate is the cluster CA's, for `127.0.0.1`, `localhost` and
    /// [`NODE_IP`].
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The resourceVersion of the last change to any of the resources.
    pub fn resource_version(&self) -> u64 {
        lock(&self.front.store).rv
    }

    /// The last requests answered (at most 10 000), oldest first.
    pub fn requests(&self) -> Vec<FrontRequest> {
        lock(&self.front.requests).iter().cloned().collect()
    }

    /// Forgets the change history, as etcd's compaction does: a watch from any resourceVersion before the current
    /// one then gets `410 Gone` (reason Expired), and clients must list again.
    pub fn compact(&self) {
        let mut store = lock(&self.front.store);
        store.compacted = store.rv;
        store.history.clear();
    }
}

impl Drop for PolicyApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Cluster {
    /// The policy API front ([`Cluster::start_with_policy_api`]).
    pub fn policy_api(&self) -> &PolicyApi {
        self.policy_api.as_ref().expect("the cluster has no policy API front (Cluster::start_with_policy_api)")
    }

    /// Starts the front before podset-apiserver, and writes the kubeconfigs for it: the admin's
    /// ([`Self::policy_api_kubeconfig`]) and podset-apiserver's ([`Self::policy_api_controller_kubeconfig`]).
    pub(crate) fn start_policy_api(&mut self) {
        let front = PolicyApi::start(&self.apiserver_url, &self.pki.dir.join("ca.crt"), &self.pki.dir.join("ca.key"));
        let url = front.url();
        std::fs::write(self.policy_api_kubeconfig(), self.kubeconfig_at("admin", &url)).unwrap();
        std::fs::write(self.policy_api_controller_kubeconfig(), self.kubeconfig_at("controller", &url)).unwrap();
        self.policy_api = Some(front);
    }

    /// The admin's kubeconfig for the front (client certificate, the cluster CA).
    pub fn policy_api_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("policy-api-admin.kubeconfig")
    }

    /// podset-apiserver's kubeconfig for the front: its `--kubeconfig` with [`Cluster::start_with_policy_api`].
    pub fn policy_api_controller_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("policy-api-controller.kubeconfig")
    }

    /// kubectl through the front as the admin, to run as a test likes.
    pub fn policy_api_kubectl_command(&self, args: &[&str]) -> std::process::Command {
        self.kubectl_command_with(&self.policy_api_kubeconfig(), args)
    }

    /// kubectl through the front as the admin: its output, or its output and errors.
    pub fn policy_api_kubectl_try(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_output(self.policy_api_kubectl_command(args))
    }

    /// kubectl through the front as the admin; panics with its output on failure.
    pub fn policy_api_kubectl(&self, args: &[&str]) -> String {
        self.policy_api_kubectl_try(args).unwrap_or_else(|e| panic!("kubectl (policy API front) {args:?}:\n{e}"))
    }

    /// A kube-rs client at the front with `credential` (a certificate of the cluster CA, say
    /// [`Cluster::client_cert`]`("ca", ...)`, or a token). Needs a Tokio runtime context.
    pub fn policy_api_client(&self, credential: Credential<'_>) -> kube::Client {
        crate::replicas::client_to(&self.policy_api().url(), &self.pki.dir.join("ca.crt"), credential)
    }

    /// A kube-rs client at the front as the admin (`system:masters`).
    pub fn policy_api_admin_client(&self) -> kube::Client {
        let read = |name: &str| std::fs::read_to_string(self.pki.dir.join(name)).expect("the admin's PEM");
        self.policy_api_client(Credential::Cert(&(read("admin.crt"), read("admin.key"))))
    }
}

/// Who a client certificate names, as kube-apiserver reads it: CN the user, O the groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CertUser {
    user: String,
    groups: Vec<String>,
}

/// What the front calls kube-apiserver as for TokenReviews and SubjectAccessReviews.
fn admin() -> CertUser {
    CertUser { user: "admin".into(), groups: vec!["system:masters".into()] }
}

/// A caller as kube-apiserver's authorizer sees it.
#[derive(Debug, Clone)]
struct UserInfo {
    name: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: Value,
}

struct Front {
    /// kube-apiserver's URL.
    upstream: String,
    ca_pem: String,
    ca_key_pem: String,
    roots: Arc<RootCertStore>,
    /// A client per identity forwarded with a certificate (None: without one), made on first use.
    clients: Mutex<HashMap<Option<CertUser>, Upstream>>,
    store: Mutex<Store>,
    /// The resourceVersion of the last change, for watches to wake up on.
    changed: watch::Sender<u64>,
    requests: Mutex<VecDeque<FrontRequest>>,
}

impl Front {
    /// A certificate for `cn` and `orgs` signed by the cluster CA, as DER for rustls.
    fn leaf(
        &self,
        cn: &str,
        orgs: &[String],
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let issuer = Issuer::from_ca_cert_pem(&self.ca_pem, KeyPair::from_pem(&self.ca_key_pem).expect("CA key"))
            .expect("the cluster CA");
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, o.as_str());
        }
        p.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(s.to_string().try_into().expect("a DNS name")),
            })
            .collect();
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a key");
        let cert = p.signed_by(&key, &issuer).expect("a certificate");
        (cert.der().clone(), PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
    }

    /// The client to kube-apiserver for `who`: with a certificate of the same subject, or none.
    fn client(&self, who: Option<&CertUser>) -> Upstream {
        let mut clients = lock(&self.clients);
        if let Some(c) = clients.get(&who.cloned()) {
            return c.clone();
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(self.roots.clone());
        let config = match who {
            Some(u) => {
                let (cert, key) = self.leaf(&u.user, &u.groups, &[], ExtendedKeyUsagePurpose::ClientAuth);
                config.with_client_auth_cert(vec![cert], key).expect("a client certificate")
            }
            None => config.with_no_client_auth(),
        };
        // HTTP/1.1, so that upgrades (exec, port-forward) pass too; each watch has a connection of its own.
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        // Each watch event as it comes, not after the peer's delayed ACK.
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
        clients.insert(who.cloned(), client.clone());
        client
    }

    async fn connection(self: Arc<Self>, acceptor: tokio_rustls::TlsAcceptor, tcp: tokio::net::TcpStream) {
        let _ = tcp.set_nodelay(true);
        let Ok(tls) = acceptor.accept(tcp).await else { return };
        // rustls has verified the chain against the cluster CA.
        let cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(subject);
        let cert = cert.map(|s| CertUser { user: s.common_name, groups: s.organizations });
        let svc = hyper::service::service_fn(move |req| {
            let front = self.clone();
            let cert = cert.clone();
            async move { Ok::<_, Infallible>(front.handle(cert, req).await) }
        });
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        let _ = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc).await;
    }

    async fn handle(self: Arc<Self>, cert: Option<CertUser>, req: Request<Incoming>) -> Response<Body> {
        let user = match (&cert, req.headers().contains_key(header::AUTHORIZATION)) {
            (Some(c), _) => c.user.clone(),
            (None, true) => "Bearer".to_owned(),
            (None, false) => "anonymous".to_owned(),
        };
        let (method, uri) =
            (req.method().to_string(), req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned());
        let resp = match route(req.uri().path()) {
            Some(Route::Discovery) if req.method() == Method::GET => self.discovery(cert, req).await,
            Some(Route::Resource(r)) => self.serve(cert, req, r).await.unwrap_or_else(|e| e.response()),
            Some(Route::NotFound) => ApiError::not_found_path().response(),
            _ => self.forward(cert, req).await,
        };
        let mut requests = lock(&self.requests);
        requests.push_back(FrontRequest { user, method, uri, code: resp.status().as_u16() });
        if requests.len() > REQUESTS_KEPT {
            requests.pop_front();
        }
        drop(requests);
        resp
    }

    /// Sends `parts` and `body` to kube-apiserver as the caller: with a certificate of the caller's subject, or
    /// without one and the caller's `Authorization` header.
    async fn send(
        &self,
        cert: Option<&CertUser>,
        mut parts: http::request::Parts,
        body: Body,
        upgrade: bool,
    ) -> Result<Response<Incoming>, ApiError> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = format!("{}{path}", self.upstream).parse().map_err(|e| ApiError::bad_request(format!("{e}")))?;
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers, upgrade);
        parts.headers.remove(header::HOST);
        let req = Request::from_parts(parts, body);
        self.client(cert)
            .request(req)
            .await
            .map_err(|e| ApiError::new(503, "ServiceUnavailable", format!("error trying to reach kube-apiserver: {e}")))
    }

    /// Anything not served here, to kube-apiserver unchanged; bodies stream both ways (watches, logs), and an
    /// upgrade (exec, port-forward over HTTP/1.1) is joined end to end.
    async fn forward(&self, cert: Option<CertUser>, mut req: Request<Incoming>) -> Response<Body> {
        let upgrade = req.version() <= Version::HTTP_11 && req.headers().contains_key(header::UPGRADE);
        let downstream = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let mut resp = match self.send(cert.as_ref(), parts, body.map_err(BoxError::from).boxed_unsync(), upgrade).await
        {
            Ok(resp) => resp,
            Err(e) => return e.response(),
        };
        match downstream {
            Some(downstream) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                let upstream = hyper::upgrade::on(&mut resp);
                tokio::spawn(async move {
                    if let (Ok(down), Ok(up)) = (downstream.await, upstream.await) {
                        let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(down), &mut TokioIo::new(up)).await;
                    }
                });
            }
            _ => strip_hop_by_hop(resp.headers_mut(), false),
        }
        resp.map(|b| b.map_err(BoxError::from).boxed_unsync())
    }

    /// kube-apiserver's APIResourceList for the group version, with the resources served here added.
    async fn discovery(&self, cert: Option<CertUser>, req: Request<Incoming>) -> Response<Body> {
        let (mut parts, _) = req.into_parts();
        // Read here, so plain JSON.
        parts.headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        parts.headers.remove(header::ACCEPT_ENCODING);
        let resp = match self.send(cert.as_ref(), parts, empty(), false).await {
            Ok(resp) => resp,
            Err(e) => return e.response(),
        };
        let (mut head, body) = resp.into_parts();
        let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
            return ApiError::new(503, "ServiceUnavailable", "kube-apiserver's discovery ended early".into())
                .response();
        };
        strip_hop_by_hop(&mut head.headers, false);
        head.headers.remove(header::CONTENT_LENGTH);
        let merged = (head.status == StatusCode::OK)
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
            .map(|mut list| {
                merge_discovery(&mut list);
                Bytes::from(serde_json::to_vec(&list).expect("JSON"))
            });
        Response::from_parts(head, Full::new(merged.unwrap_or(body)).map_err(BoxError::from).boxed_unsync())
    }

    /// POSTs `body` to kube-apiserver as the admin; the answer's JSON.
    async fn review(&self, path: &str, body: Value) -> Result<Value, ApiError> {
        let req = Request::post(path).header(header::CONTENT_TYPE, "application/json").body(()).expect("a request");
        let (parts, ()) = req.into_parts();
        let body = Full::new(Bytes::from(body.to_string())).map_err(BoxError::from).boxed_unsync();
        let resp = self.send(Some(&admin()), parts, body, false).await?;
        let code = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| ApiError::internal(format!("{path}: {e}")))?;
        let answer: Value = serde_json::from_slice(&bytes.to_bytes()).unwrap_or(Value::Null);
        if !code.is_success() {
            return Err(ApiError::internal(format!("{path}: {code} {answer}")));
        }
        Ok(answer)
    }

    /// The caller, as kube-apiserver would authenticate them: the certificate's subject, a token's user by a
    /// TokenReview, or anonymous.
    async fn authenticate(&self, cert: &Option<CertUser>, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        if let Some(c) = cert {
            let mut groups = c.groups.clone();
            groups.push("system:authenticated".into());
            return Ok(UserInfo { name: c.user.clone(), uid: None, groups, extra: Value::Null });
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(token) = token else {
            return Ok(UserInfo {
                name: "system:anonymous".into(),
                uid: None,
                groups: vec!["system:unauthenticated".into()],
                extra: Value::Null,
            });
        };
        let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
        let answer = self.review("/apis/authentication.k8s.io/v1/tokenreviews", review).await?;
        let status = &answer["status"];
        if status["authenticated"] != true {
            return Err(ApiError::new(401, "Unauthorized", "Unauthorized".into()));
        }
        let user = &status["user"];
        Ok(UserInfo {
            name: user["username"].as_str().unwrap_or_default().to_owned(),
            uid: user["uid"].as_str().map(str::to_owned),
            groups: user["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(Into::into))
                .collect(),
            extra: user["extra"].clone(),
        })
    }

    /// Whether `user` may `verb` the resource, by a SubjectAccessReview; 403 as kube-apiserver words it if not.
    async fn authorize(&self, user: &UserInfo, verb: &str, r: &Target) -> Result<(), ApiError> {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Ok(());
        }
        let mut spec = json!({"user": user.name, "groups": user.groups, "resourceAttributes": r.attributes(verb)});
        if let Some(uid) = &user.uid {
            spec["uid"] = uid.as_str().into();
        }
        if user.extra.is_object() {
            spec["extra"] = user.extra.clone();
        }
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec});
        let answer = self.review("/apis/authorization.k8s.io/v1/subjectaccessreviews", review).await?;
        if answer["status"]["allowed"] == true {
            return Ok(());
        }
        let resource = if r.status { format!("{}/status", r.kind.resource()) } else { r.kind.resource().to_owned() };
        let mut message = format!(
            "User {:?} cannot {verb} resource {resource:?} in API group {GROUP:?} at the cluster scope",
            user.name
        );
        if let Some(reason) = answer["status"]["reason"].as_str().filter(|r| !r.is_empty()) {
            message = format!("{message}: {reason}");
        }
        Err(ApiError::forbidden(r.kind, r.name.as_deref(), message))
    }

    /// A request for one of the served resources.
    async fn serve(
        self: &Arc<Self>,
        cert: Option<CertUser>,
        req: Request<Incoming>,
        r: Target,
    ) -> Result<Response<Body>, ApiError> {
        if req.headers().keys().any(|k| k.as_str().starts_with("impersonate-")) {
            return Err(ApiError::bad_request(
                "the policy API front does not support impersonation on the resources it serves".into(),
            ));
        }
        let user = self.authenticate(&cert, req.headers()).await?;
        let query: HashMap<String, String> =
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect();
        let flag = |k: &str| query.get(k).is_some_and(|v| v == "1" || v == "true");
        let watching = r.watch || flag("watch");
        let verb = match (req.method().clone(), &r.name, watching) {
            (Method::GET, _, true) => "watch",
            (Method::GET, None, false) => "list",
            (Method::GET, Some(_), false) => "get",
            (Method::POST, None, _) => "create",
            (Method::PUT, Some(_), _) => "update",
            (Method::PATCH, Some(_), _) => "patch",
            (Method::DELETE, Some(_), _) => "delete",
            (Method::DELETE, None, _) => "deletecollection",
            _ => {
                return Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource".into(),
                ))
            }
        };
        if r.status && !matches!(verb, "get" | "update" | "patch") {
            return Err(ApiError::not_found_path());
        }
        self.authorize(&user, verb, &r).await?;
        let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
        let table = wants_table(req.headers());
        let include_object = query.get("includeObject").cloned().unwrap_or_default();
        let selectors = || -> Result<Filter, ApiError> {
            let labels = Selector::parse(query.get("labelSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?;
            let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?;
            Ok(Filter { labels, fields, name: r.name.clone() })
        };
        let kind = r.kind;
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let body = match *req.method() {
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE => {
                req.into_body().collect().await.map_err(|e| ApiError::bad_request(e.to_string()))?.to_bytes()
            }
            _ => Bytes::new(),
        };
        let name = r.name.clone().unwrap_or_default();
        let (code, object) = match verb {
            "watch" => return self.watch(kind, selectors()?, &query),
            "get" => {
                let store = lock(&self.store);
                let object =
                    store.objects.get(&(kind, name.clone())).cloned().ok_or(ApiError::not_found(kind, &name))?;
                if table {
                    return Ok(json_response(200, &table_of(kind, &[object], &include_object, None)));
                }
                (200, object)
            }
            "list" => {
                let filter = selectors()?;
                let store = lock(&self.store);
                let items: Vec<Value> = store.list(kind).filter(|o| filter.matches(o)).cloned().collect();
                if table {
                    return Ok(json_response(200, &table_of(kind, &items, &include_object, Some(store.rv))));
                }
                (200, list_of(kind, items, store.rv))
            }
            "create" => {
                let object = decode_body(&content_type, &body)?;
                let made = self.write(|s| s.create(kind, object, dry_run))?;
                (201, made)
            }
            "update" => {
                let object = decode_body(&content_type, &body)?;
                (200, self.write(|s| s.update(kind, &name, object, r.status, dry_run))?)
            }
            "patch" => {
                let field_manager = query.get("fieldManager").cloned().unwrap_or_default();
                if content_type == "application/apply-patch+yaml" {
                    let exists = lock(&self.store).objects.contains_key(&(kind, name.clone()));
                    if !exists && !r.status {
                        // Creating by apply takes create permission too, as kube-apiserver's patch handler checks.
                        self.authorize(&user, "create", &r).await?;
                    }
                }
                self.write(|s| s.patch(kind, &name, &content_type, &body, r.status, dry_run, &field_manager))?
            }
            "delete" => {
                let options: Value = if body.is_empty() { Value::Null } else { decode_body(&content_type, &body)? };
                let gone = self.write(|s| s.delete(kind, &name, &options, dry_run))?;
                let details =
                    json!({"name": name, "group": GROUP, "kind": kind.resource(), "uid": gone["metadata"]["uid"]});
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                )
            }
            _ => {
                let filter = selectors()?;
                let (gone, rv) = self.write(|s| {
                    let names: Vec<String> =
                        s.list(kind).filter(|o| filter.matches(o)).map(|o| name_of(o).to_owned()).collect();
                    let gone: Vec<Value> =
                        names.iter().map(|n| s.delete(kind, n, &Value::Null, dry_run)).collect::<Result<_, _>>()?;
                    Ok((gone, s.rv))
                })?;
                (200, list_of(kind, gone, rv))
            }
        };
        Ok(json_response(code, &object))
    }

    /// Runs a change to the store, then wakes the watches.
    fn write<T>(&self, change: impl FnOnce(&mut Store) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (out, rv) = {
            let mut store = lock(&self.store);
            let out = change(&mut store)?;
            (out, store.rv)
        };
        self.changed.send_replace(rv);
        Ok(out)
    }

    /// A watch: newline-delimited WatchEvents, streamed by a task of its own until the timeout or the client leaves.
    fn watch(
        self: &Arc<Self>,
        kind: Kind,
        filter: Filter,
        query: &HashMap<String, String>,
    ) -> Result<Response<Body>, ApiError> {
        let from = match query.get("resourceVersion").map(String::as_str) {
            None | Some("") | Some("0") => None,
            Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("resourceVersion: Invalid value: {rv:?}: must be a number"))
            })?),
        };
        let timeout =
            query.get("timeoutSeconds").and_then(|t| t.parse().ok()).map_or(WATCH_TIMEOUT, Duration::from_secs);
        let flag = |k: &str| query.get(k).is_some_and(|v| v == "1" || v == "true");
        let watch = Watch {
            kind,
            filter,
            from: if flag("sendInitialEvents") { None } else { from },
            bookmarks: flag("allowWatchBookmarks"),
            initial_events_end: flag("sendInitialEvents"),
            timeout,
        };
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(watch.run(self.clone(), tx));
        let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut resp = Response::new(body.boxed_unsync());
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(resp)
    }
}

/// One watch's parameters.
struct Watch {
    kind: Kind,
    filter: Filter,
    /// Events after this resourceVersion; None: the current objects as ADDED first.
    from: Option<u64>,
    bookmarks: bool,
    /// A bookmark annotated [`INITIAL_EVENTS_END`] after the initial events (`sendInitialEvents=true`).
    initial_events_end: bool,
    timeout: Duration,
}

type Sink = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// Sends one WatchEvent; false once the client has gone.
async fn send_event(tx: &Sink, typ: &str, object: &Value) -> bool {
    let mut line = serde_json::to_vec(&json!({"type": typ, "object": object})).expect("JSON");
    line.push(b'\n');
    tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_ok()
}

impl Watch {
    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        json!({"apiVersion": GROUP_VERSION, "kind": self.kind.kind(), "metadata": metadata})
    }

    fn expired(requested: u64, store: &Store) -> Value {
        let e =
            ApiError::new(410, "Expired", format!("too old resource version: {requested} ({})", store.compacted + 1));
        e.status()
    }

    async fn run(self, front: Arc<Front>, tx: Sink) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut changed = front.changed.subscribe();
        changed.borrow_and_update();
        let start = {
            let store = lock(&front.store);
            match self.from {
                None => Ok((store.rv, store.list(self.kind).filter(|o| self.filter.matches(o)).cloned().collect())),
                Some(from) if from < store.compacted => Err(Self::expired(from, &store)),
                Some(from) => Ok((from, Vec::new())),
            }
        };
        let (mut last, initial): (u64, Vec<Value>) = match start {
            Ok(start) => start,
            Err(expired) => {
                send_event(&tx, "ERROR", &expired).await;
                return;
            }
        };
        for object in &initial {
            if !send_event(&tx, "ADDED", object).await {
                return;
            }
        }
        if self.initial_events_end && self.bookmarks && !send_event(&tx, "BOOKMARK", &self.bookmark(last, true)).await {
            return;
        }
        let mut bookmarks = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            changed.borrow_and_update();
            let batch = {
                let store = lock(&front.store);
                if last < store.compacted {
                    // Fell behind what is kept.
                    Err(Self::expired(last, &store))
                } else {
                    Ok(store.history.iter().filter(|c| c.rv > last).cloned().collect::<Vec<Change>>())
                }
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(expired) => {
                    send_event(&tx, "ERROR", &expired).await;
                    return;
                }
            };
            for change in batch {
                last = change.rv;
                if change.kind != self.kind {
                    continue;
                }
                if let Some((typ, object)) = self.filter.translate(&change) {
                    if !send_event(&tx, typ, &object).await {
                        return;
                    }
                }
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = bookmarks.tick(), if self.bookmarks => {
                    if !send_event(&tx, "BOOKMARK", &self.bookmark(last, false)).await {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    }
}

/// A list's or watch's selectors, and the one name a request on `/{name}` (or `?watch` of one) is about.
struct Filter {
    labels: Selector,
    fields: FieldSelector,
    name: Option<String>,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(object["metadata"]["labels"].clone()).unwrap_or_default();
        let name = name_of(object);
        self.name.as_deref().is_none_or(|n| n == name)
            && self.labels.matches(&labels)
            && self.fields.matches_meta(name, "")
    }

    /// The event a watch with this filter sees for `change`: an object entering the selection is ADDED, one
    /// leaving it DELETED (its earlier state at the change's resourceVersion), as kube-apiserver's watch cache does.
    fn translate(&self, change: &Change) -> Option<(&'static str, Value)> {
        let now = self.matches(&change.object);
        match (change.typ, change.old.as_ref().map(|o| self.matches(o))) {
            ("MODIFIED", Some(true)) if !now => {
                let mut old = change.old.clone().expect("an earlier state");
                old["metadata"]["resourceVersion"] = change.rv.to_string().into();
                Some(("DELETED", old))
            }
            ("MODIFIED", Some(false)) if now => Some(("ADDED", change.object.clone())),
            ("MODIFIED", Some(false)) => None,
            (typ, _) => now.then(|| (typ, change.object.clone())),
        }
    }
}

/// The four resources, all cluster-scoped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    ValidatingPolicy,
    ValidatingBinding,
    MutatingPolicy,
    MutatingBinding,
}

impl Kind {
    const ALL: [Kind; 4] =
        [Kind::ValidatingPolicy, Kind::ValidatingBinding, Kind::MutatingPolicy, Kind::MutatingBinding];

    fn from_resource(resource: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.resource() == resource)
    }

    fn resource(self) -> &'static str {
        match self {
            Kind::ValidatingPolicy => "validatingadmissionpolicies",
            Kind::ValidatingBinding => "validatingadmissionpolicybindings",
            Kind::MutatingPolicy => "mutatingadmissionpolicies",
            Kind::MutatingBinding => "mutatingadmissionpolicybindings",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::ValidatingPolicy => "ValidatingAdmissionPolicy",
            Kind::ValidatingBinding => "ValidatingAdmissionPolicyBinding",
            Kind::MutatingPolicy => "MutatingAdmissionPolicy",
            Kind::MutatingBinding => "MutatingAdmissionPolicyBinding",
        }
    }

    fn is_binding(self) -> bool {
        matches!(self, Kind::ValidatingBinding | Kind::MutatingBinding)
    }

    /// Whether it has a `status` and its subresource: only ValidatingAdmissionPolicy does; v1
    /// MutatingAdmissionPolicy has no status field, and kube-apiserver registers no `/status` for it.
    fn has_status(self) -> bool {
        self == Kind::ValidatingPolicy
    }

    /// Through k8s-openapi's type: what is not one is refused, unknown fields are dropped (as kube-apiserver does
    /// without strict field validation), and the JSON is the type's.
    fn decode(self, object: Value) -> Result<Value, ApiError> {
        fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(object: Value) -> serde_json::Result<Value> {
            serde_json::from_value::<T>(object).and_then(serde_json::to_value)
        }
        let decoded = match self {
            Kind::ValidatingPolicy => typed::<ValidatingAdmissionPolicy>(object),
            Kind::ValidatingBinding => typed::<ValidatingAdmissionPolicyBinding>(object),
            Kind::MutatingPolicy => typed::<MutatingAdmissionPolicy>(object),
            Kind::MutatingBinding => typed::<MutatingAdmissionPolicyBinding>(object),
        };
        decoded.map_err(|e| ApiError::bad_request(format!("error decoding {}: {e}", self.kind())))
    }

    /// kube-apiserver's defaults for the fields a policy's matching reads (kubernetes'
    /// `pkg/apis/admissionregistration/v1beta1/{defaults,zz_generated.defaults}.go` for the mutating kinds, v1's for
    /// the validating ones): a policy's failurePolicy Fail (`SetDefaults_*AdmissionPolicySpec`), then
    /// `SetDefaults_MatchResources` and `SetDefaults_Rule` over its matchConstraints, or over a binding's
    /// matchResources. Nothing defaults reinvocationPolicy or a paramRef's parameterNotFoundAction: the v1 API
    /// (k8s-openapi's docs) has both Required, and failurePolicy "Defaults to Fail".
    fn default(self, object: &mut Value) {
        let match_resources = |m: &mut Value| {
            if !m.is_object() {
                return;
            }
            for (field, value) in
                [("matchPolicy", json!("Equivalent")), ("namespaceSelector", json!({})), ("objectSelector", json!({}))]
            {
                if m.get(field).is_none_or(Value::is_null) {
                    m[field] = value;
                }
            }
            for rules in ["resourceRules", "excludeResourceRules"] {
                for rule in m.get_mut(rules).and_then(Value::as_array_mut).into_iter().flatten() {
                    if rule.get("scope").is_none_or(Value::is_null) {
                        rule["scope"] = "*".into();
                    }
                }
            }
        };
        let spec = &mut object["spec"];
        if self.is_binding() {
            if let Some(m) = spec.get_mut("matchResources") {
                match_resources(m);
            }
            return;
        }
        if spec.get("failurePolicy").is_none_or(Value::is_null) {
            spec["failurePolicy"] = "Fail".into();
        }
        if let Some(m) = spec.get_mut("matchConstraints") {
            match_resources(m);
        }
    }

    /// The checks kube-apiserver makes that a test is likely to meet: names, and the required fields.
    fn validate(self, object: &Value) -> Result<(), ApiError> {
        let name = name_of(object);
        let mut causes = Vec::new();
        let mut cause = |field: &str, message: String| causes.push((field.to_owned(), message));
        if name.is_empty() {
            cause("metadata.name", "Required value: name or generateName is required".into());
        } else if let Some(e) = dns1123_subdomain_errors(name).into_iter().next() {
            cause("metadata.name", format!("Invalid value: {name:?}: {e}"));
        }
        let spec = &object["spec"];
        let empty = |v: &Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty) || v.as_str() == Some("");
        if !self.is_binding() {
            if spec["matchConstraints"].is_null() {
                cause("spec.matchConstraints", "Required value".into());
            } else if empty(&spec["matchConstraints"]["resourceRules"]) {
                cause("spec.matchConstraints.resourceRules", "Required value".into());
            }
        }
        match self {
            Kind::ValidatingPolicy => {
                if empty(&spec["validations"]) && empty(&spec["auditAnnotations"]) {
                    cause(
                        "spec.validations",
                        "Required value: validations or auditAnnotations must contain at least one item".into(),
                    );
                }
            }
            Kind::MutatingPolicy => {
                if empty(&spec["mutations"]) {
                    cause("spec.mutations", "Required value: mutations must contain at least one item".into());
                }
                if empty(&spec["reinvocationPolicy"]) {
                    cause("spec.reinvocationPolicy", "Required value".into());
                }
            }
            Kind::ValidatingBinding | Kind::MutatingBinding => {
                if empty(&spec["policyName"]) {
                    cause("spec.policyName", "Required value".into());
                }
                if self == Kind::ValidatingBinding && empty(&spec["validationActions"]) {
                    cause(
                        "spec.validationActions",
                        "Required value: at least one validation action is required".into(),
                    );
                }
            }
        }
        if causes.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(self, name, &causes))
    }
}

/// The entries discovery adds to kube-apiserver's list, as a 1.36+ kube-apiserver lists them (categories from each
/// resource's REST storage; no short names).
fn served_resources() -> Vec<Value> {
    let verbs = json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]);
    let mut resources = Vec::new();
    for kind in Kind::ALL {
        resources.push(json!({"name": kind.resource(), "singularName": kind.kind().to_ascii_lowercase(),
                              "namespaced": false, "kind": kind.kind(), "verbs": verbs,
                              "categories": ["api-extensions"]}));
        if kind.has_status() {
            resources.push(json!({"name": format!("{}/status", kind.resource()), "singularName": "",
                                  "namespaced": false, "kind": kind.kind(), "verbs": ["get", "patch", "update"]}));
        }
    }
    resources
}

/// kube-apiserver's APIResourceList for the group version with the served resources in it, in the order
/// kube-apiserver lists a group version's resources: by name, as its installer registers the sorted paths.
fn merge_discovery(list: &mut Value) {
    if let Some(resources) = list["resources"].as_array_mut() {
        let served = |r: &Value| r["name"].as_str().and_then(|n| n.split('/').next()).and_then(Kind::from_resource);
        resources.retain(|r| served(r).is_none());
        resources.extend(served_resources());
        resources.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    }
}

/// One change, kept for watches.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: Kind,
    typ: &'static str,
    /// The object after the change (as it was last, for DELETED), at the change's resourceVersion.
    object: Value,
    /// Before, for MODIFIED: a watch's selector may have matched it and no longer match, or the reverse.
    old: Option<Value>,
}

/// The four resources, and their recent changes.
#[derive(Default)]
struct Store {
    /// The last resourceVersion given out, shared by all four resources as etcd's revision.
    rv: u64,
    objects: BTreeMap<(Kind, String), Value>,
    history: VecDeque<Change>,
    /// Changes up to this resourceVersion are forgotten: watches from before it get `410 Gone`.
    compacted: u64,
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn rv_of(object: &Value) -> &str {
    object["metadata"]["resourceVersion"].as_str().unwrap_or_default()
}

/// Now, as kube-apiserver writes timestamps.
fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Drops a strategic merge patch's directives (`$patch`, `$setElementOrder/...`, `$retainKeys`, ...): the fields of
/// the four resources are plain maps and, but for `matchConditions` (which kube-apiserver merges by name and a merge
/// patch replaces whole), atomic lists, so what is left applies as a merge patch.
fn strip_directives(patch: &mut Value) {
    match patch {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(strip_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

impl Store {
    /// The objects of `kind`, by name.
    fn list(&self, kind: Kind) -> impl Iterator<Item = &Value> {
        self.objects.range((kind, String::new())..).take_while(move |((k, _), _)| *k == kind).map(|(_, o)| o)
    }

    /// Stores `object` (removes it for a DELETED change) at the next resourceVersion, and keeps the change for
    /// watches; the object as stored.
    fn commit(&mut self, kind: Kind, typ: &'static str, mut object: Value, old: Option<Value>) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        let key = (kind, name_of(&object).to_owned());
        if typ == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, object.clone());
        }
        self.history.push_back(Change { rv: self.rv, kind, typ, object: object.clone(), old });
        while self.history.len() > HISTORY {
            if let Some(forgotten) = self.history.pop_front() {
                self.compacted = forgotten.rv;
            }
        }
        object
    }

    fn create(&mut self, kind: Kind, object: Value, dry_run: bool) -> Result<Value, ApiError> {
        let mut object = kind.decode(object)?;
        let meta = &mut object["metadata"];
        if meta["name"].as_str().is_none_or(str::is_empty) {
            if let Some(prefix) = meta["generateName"].as_str().filter(|p| !p.is_empty()) {
                // As the apiserver's name generator: five of these.
                const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                let random = uuid::Uuid::new_v4();
                let suffix: String =
                    random.as_bytes()[..5].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect();
                meta["name"] = format!("{prefix}{suffix}").into();
            }
        }
        let meta = meta.as_object_mut().expect("metadata is an object");
        for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"]
        {
            meta.remove(field);
        }
        meta.insert("uid".into(), uuid::Uuid::new_v4().to_string().into());
        meta.insert("creationTimestamp".into(), now().into());
        meta.insert("generation".into(), 1.into());
        if kind.has_status() {
            object["status"] = json!({});
        }
        kind.default(&mut object);
        kind.validate(&object)?;
        let name = name_of(&object).to_owned();
        if self.objects.contains_key(&(kind, name.clone())) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if dry_run {
            return Ok(object);
        }
        Ok(self.commit(kind, "ADDED", object, None))
    }

    /// A PUT of `object` to `name` (its `status` when `status`): optimistic concurrency on
    /// `metadata.resourceVersion` when given, the generation bumped when the spec changes, no write when nothing does.
    fn update(
        &mut self,
        kind: Kind,
        name: &str,
        object: Value,
        status: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = self.objects.get(&(kind, name.to_owned())).cloned().ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut new = kind.decode(object)?;
        if name_of(&new) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&new)
            )));
        }
        let wanted = rv_of(&new);
        if !wanted.is_empty() && wanted != rv_of(&old) {
            return Err(ApiError::conflict(kind, name));
        }
        if status {
            // The status subresource writes status alone.
            new["metadata"] = old["metadata"].clone();
            new["spec"] = old["spec"].clone();
        } else {
            if kind.has_status() {
                new["status"] = old["status"].clone();
            }
            let meta = new["metadata"].as_object_mut().expect("metadata is an object");
            meta.remove("managedFields");
            for field in ["uid", "creationTimestamp", "deletionTimestamp", "resourceVersion"] {
                match old["metadata"].get(field) {
                    Some(v) => meta.insert(field.into(), v.clone()),
                    None => meta.remove(field),
                };
            }
            kind.default(&mut new);
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            let changed = new["spec"] != old["spec"];
            new["metadata"]["generation"] = (generation + i64::from(changed)).into();
        }
        new["metadata"]["resourceVersion"] = rv_of(&old).into();
        kind.validate(&new)?;
        if new == old || dry_run {
            return Ok(new);
        }
        Ok(self.commit(kind, "MODIFIED", new, Some(old)))
    }

    /// A PATCH: merge patches (strategic ones as merge patches), JSON patches, and apply patches as a create, or a
    /// merge onto the object, of the applied configuration.
    #[allow(clippy::too_many_arguments)]
    fn patch(
        &mut self,
        kind: Kind,
        name: &str,
        content_type: &str,
        patch: &[u8],
        status: bool,
        dry_run: bool,
        field_manager: &str,
    ) -> Result<(u16, Value), ApiError> {
        let old = self.objects.get(&(kind, name.to_owned())).cloned();
        let parse = |bytes: &[u8]| -> Result<Value, ApiError> {
            serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        let mut patched = match content_type {
            "application/apply-patch+yaml" => {
                if field_manager.is_empty() {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
                            .into(),
                    ));
                }
                let applied: Value = serde_yaml::from_slice(patch)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                if name_of(&applied) != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        name_of(&applied)
                    )));
                }
                let Some(mut old) = old else {
                    if status {
                        return Err(ApiError::not_found(kind, name));
                    }
                    return Ok((201, self.create(kind, applied, dry_run)?));
                };
                json_patch::merge(&mut old, &applied);
                old
            }
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                let mut merge = parse(patch)?;
                if content_type.starts_with("application/strategic") {
                    strip_directives(&mut merge);
                }
                let mut old = old.ok_or_else(|| ApiError::not_found(kind, name))?;
                json_patch::merge(&mut old, &merge);
                old
            }
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_value(parse(patch)?)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut old = old.ok_or_else(|| ApiError::not_found(kind, name))?;
                json_patch::patch(&mut old, &ops).map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?;
                old
            }
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (not {other:?})"),
                ))
            }
        };
        if patched["metadata"]["name"].is_null() {
            patched["metadata"]["name"] = name.into();
        }
        Ok((200, self.update(kind, name, patched, status, dry_run)?))
    }

    /// A DELETE, with `DeleteOptions`' preconditions; the object as it was, at the deletion's resourceVersion.
    fn delete(&mut self, kind: Kind, name: &str, options: &Value, dry_run: bool) -> Result<Value, ApiError> {
        let old = self.objects.get(&(kind, name.to_owned())).cloned().ok_or_else(|| ApiError::not_found(kind, name))?;
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(wanted) = options["preconditions"][field].as_str() {
                let have = old["metadata"][field].as_str().unwrap_or_default();
                if wanted != have {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {}.{GROUP} {name:?}: Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {have}",
                            kind.resource()
                        ),
                    )
                    .with_details(kind, Some(name)));
                }
            }
        }
        if dry_run {
            return Ok(old);
        }
        Ok(self.commit(kind, "DELETED", old.clone(), Some(old)))
    }
}

/// What a path under [`PREFIX`] is.
enum Route {
    /// The group version's discovery.
    Discovery,
    Resource(Target),
    /// Under one of the served resources, but nothing there.
    NotFound,
}

/// A request for one of the served resources.
struct Target {
    kind: Kind,
    name: Option<String>,
    /// The `status` subresource (of a kind that has one).
    status: bool,
    /// The deprecated `/watch/` path.
    watch: bool,
}

impl Target {
    /// The SubjectAccessReview's resourceAttributes for `verb` on it, as kube-apiserver's authorizer sees the request.
    fn attributes(&self, verb: &str) -> Value {
        let mut attributes = json!({"verb": verb, "group": GROUP, "version": "v1", "resource": self.kind.resource()});
        if self.status {
            attributes["subresource"] = "status".into();
        }
        if let Some(name) = &self.name {
            attributes["name"] = name.as_str().into();
        }
        attributes
    }
}

/// None: not served here (kube-apiserver's own resources in the group, and every other path).
fn route(path: &str) -> Option<Route> {
    let rest = path.strip_prefix(PREFIX)?;
    if rest.is_empty() || rest == "/" {
        return Some(Route::Discovery);
    }
    let mut segments: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
    let watch = segments.first() == Some(&"watch");
    if watch {
        segments.remove(0);
    }
    let kind = Kind::from_resource(segments.first()?)?;
    let target =
        |name: Option<&str>, status| Route::Resource(Target { kind, name: name.map(Into::into), status, watch });
    Some(match segments[1..] {
        [] => target(None, false),
        [name] if !name.is_empty() => target(Some(name), false),
        // Other kinds have no status subresource: 404, as kube-apiserver answers for a path it does not serve.
        [name, "status"] if kind.has_status() && !watch && !name.is_empty() => target(Some(name), true),
        _ => Route::NotFound,
    })
}

/// A `metav1.Status` failure.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        Self { code, reason, message, details: None }
    }

    fn with_details(mut self, kind: Kind, name: Option<&str>) -> Self {
        let mut details = json!({"group": GROUP, "kind": kind.resource()});
        if let Some(name) = name {
            details["name"] = name.into();
        }
        self.details = Some(details);
        self
    }

    fn qualified(kind: Kind) -> String {
        format!("{}.{GROUP}", kind.resource())
    }

    fn not_found(kind: Kind, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} {name:?} not found", Self::qualified(kind)))
            .with_details(kind, Some(name))
    }

    fn not_found_path() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource".into())
    }

    fn already_exists(kind: Kind, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} {name:?} already exists", Self::qualified(kind)))
            .with_details(kind, Some(name))
    }

    fn conflict(kind: Kind, name: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
            Self::qualified(kind)
        );
        Self::new(409, "Conflict", message).with_details(kind, Some(name))
    }

    fn forbidden(kind: Kind, name: Option<&str>, why: String) -> Self {
        let message = match name {
            Some(name) => format!("{} {name:?} is forbidden: {why}", Self::qualified(kind)),
            None => format!("{} is forbidden: {why}", Self::qualified(kind)),
        };
        Self::new(403, "Forbidden", message).with_details(kind, name)
    }

    fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn internal(message: String) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {message}"))
    }

    /// 422 with the field errors as kube-apiserver words them.
    fn invalid(kind: Kind, name: &str, causes: &[(String, String)]) -> Self {
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let list = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
        let message = format!("{}.{GROUP} {name:?} is invalid: {list}", kind.kind());
        let causes: Vec<Value> = causes
            .iter()
            .map(|(field, m)| {
                let reason = if m.starts_with("Required value") { "FieldValueRequired" } else { "FieldValueInvalid" };
                json!({"reason": reason, "message": m, "field": field})
            })
            .collect();
        let details = json!({"name": name, "group": GROUP, "kind": kind.kind(), "causes": causes});
        Self { code: 422, reason: "Invalid", message, details: Some(details) }
    }

    fn status(&self) -> Value {
        let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    fn response(&self) -> Response<Body> {
        json_response(self.code, &self.status())
    }
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(BoxError::from).boxed_unsync()
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("JSON"));
    let mut resp = Response::new(Full::new(bytes).map_err(BoxError::from).boxed_unsync());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A request body: JSON, or YAML when it says so.
fn decode_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if content_type.contains("yaml") {
        serde_yaml::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))
    }
}

/// The headers of one hop (RFC 9110 7.6.1): a proxy does not pass them on. An upgrade keeps `Connection` and
/// `Upgrade`, which ask for it.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .filter(|n| !upgrade || n != "upgrade")
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in ["keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding"] {
        headers.remove(name);
    }
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

fn list_of(kind: Kind, items: Vec<Value>, rv: u64) -> Value {
    json!({"apiVersion": GROUP_VERSION, "kind": format!("{}List", kind.kind()),
           "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

/// Whether the client asks for a `meta.k8s.io` Table (kubectl get).
fn wants_table(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|v| v.contains("as=Table"))
}

/// The objects as kube-apiserver's Table for them (`pkg/printers/internalversion/printers.go`, `AddHandlers` and
/// `print*AdmissionPolicy*`): Name, Validations (or Mutations), ParamKind, Age for policies; Name, PolicyName,
/// ParamRef, Age for bindings.
fn table_of(kind: Kind, objects: &[Value], include_object: &str, rv: Option<u64>) -> Value {
    let column = |name: &str, typ: &str, format: &str, description: &str| json!({"name": name, "type": typ, "format": format, "description": description, "priority": 0});
    let name_column = column("Name", "string", "name", "Name must be unique within a namespace.");
    let age_column = column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    // The rules a policy counts, with kube's descriptions (typos included).
    let (rules, rules_column) = match kind {
        Kind::MutatingPolicy => (
            "mutations",
            column(
                "Mutations",
                "integer",
                "",
                "Mutation indicates the number of mutations rules defined in this configuration",
            ),
        ),
        _ => (
            "validations",
            column(
                "Validations",
                "integer",
                "",
                "Validations indicates the number of validation rules defined in this configuration",
            ),
        ),
    };
    let columns = if kind.is_binding() {
        vec![
            name_column,
            column(
                "PolicyName",
                "string",
                "",
                "PolicyName indicates the policy definition which the policy binding binded to",
            ),
            column("ParamRef", "string", "", "ParamRef indicates the param resource which sets the configration param"),
            age_column,
        ]
    } else {
        vec![
            name_column,
            rules_column,
            column(
                "ParamKind",
                "string",
                "",
                "ParamKind specifies the kind of resources used to parameterize this policy",
            ),
            age_column,
        ]
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let spec = &o["spec"];
            let age = o["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map_or_else(|| "<unknown>".to_owned(), |t| human_duration(jiff::Timestamp::now().as_second() - t.as_second()));
            let cells = if kind.is_binding() {
                let p = &spec["paramRef"];
                let param_ref = match (p["name"].as_str().filter(|n| !n.is_empty()), p["namespace"].as_str()) {
                    _ if p.is_null() => "<unset>".to_owned(),
                    (Some(name), Some(ns)) if !ns.is_empty() => format!("{ns}/{name}"),
                    (Some(name), _) => format!("*/{name}"),
                    (None, _) => serde_json::from_value(p["selector"].clone())
                        .ok()
                        .and_then(|s| Selector::from_label_selector(&s).ok())
                        .map_or_else(|| "<unset>".to_owned(), |s| s.to_string()),
                };
                json!([name_of(o), spec["policyName"], param_ref, age])
            } else {
                let param_kind = match &spec["paramKind"] {
                    Value::Null => "<unset>".to_owned(),
                    p => format!("{}/{}", p["apiVersion"].as_str().unwrap_or_default(), p["kind"].as_str().unwrap_or_default()),
                };
                json!([name_of(o), spec[rules].as_array().map_or(0, Vec::len), param_kind, age])
            };
            let mut row = json!({"cells": cells});
            match include_object {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => {
                    row["object"] =
                        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
                }
            }
            row
        })
        .collect();
    let mut table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "columnDefinitions": columns, "rows": rows});
    if let Some(rv) = rv {
        table["metadata"]["resourceVersion"] = rv.to_string().into();
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str) -> Value {
        json!({"apiVersion": GROUP_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name, "labels": {"a": "b"}},
               "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
                        "validations": [{"expression": "true"}]}})
    }

    fn mutating_policy(name: &str) -> Value {
        json!({"apiVersion": GROUP_VERSION, "kind": "MutatingAdmissionPolicy", "metadata": {"name": name},
               "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}]},
                        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": "[]"}},
                                      {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}],
                        "reinvocationPolicy": "Never"}})
    }

    #[test]
    fn routes() {
        assert!(matches!(route("/apis/admissionregistration.k8s.io/v1"), Some(Route::Discovery)));
        assert!(matches!(route("/apis/admissionregistration.k8s.io/v1/"), Some(Route::Discovery)));
        assert!(route("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations").is_none());
        assert!(route("/apis/admissionregistration.k8s.io/v1beta1/validatingadmissionpolicies").is_none());
        assert!(route("/api/v1/configmaps").is_none());
        let Some(Route::Resource(t)) =
            route("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/p/status")
        else {
            panic!("a status route")
        };
        assert!(t.kind == Kind::ValidatingPolicy && t.status && t.name.as_deref() == Some("p"));
        let Some(Route::Resource(t)) =
            route("/apis/admissionregistration.k8s.io/v1/watch/validatingadmissionpolicybindings/b")
        else {
            panic!("a watch route")
        };
        assert!(t.kind == Kind::ValidatingBinding && t.watch && !t.status);
        assert!(matches!(
            route("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/b/status"),
            Some(Route::NotFound)
        ));
    }

    #[test]
    fn create_update_conflict_status_and_delete() {
        let mut s = Store::default();
        let made = s.create(Kind::ValidatingPolicy, policy("p"), false).unwrap();
        assert_eq!(made["metadata"]["generation"], 1);
        assert_eq!(made["metadata"]["resourceVersion"], "1");
        assert_eq!(made["spec"]["failurePolicy"], "Fail");
        assert_eq!(made["spec"]["matchConstraints"]["resourceRules"][0]["scope"], "*");
        assert_eq!(made["status"], json!({}));
        assert_eq!(s.create(Kind::ValidatingPolicy, policy("p"), false).unwrap_err().reason, "AlreadyExists");
        // A binding of the same name is another object, on the same counter.
        let binding = json!({"metadata": {"name": "p"}, "spec": {"policyName": "p", "validationActions": ["Deny"]}});
        assert_eq!(s.create(Kind::ValidatingBinding, binding, false).unwrap()["metadata"]["resourceVersion"], "2");

        let mut stale = made.clone();
        stale["spec"]["validations"][0]["expression"] = "false".into();
        let updated = s.update(Kind::ValidatingPolicy, "p", stale.clone(), false, false).unwrap();
        assert_eq!(
            (updated["metadata"]["generation"].clone(), updated["metadata"]["resourceVersion"].clone()),
            (json!(2), json!("3"))
        );
        assert_eq!(s.update(Kind::ValidatingPolicy, "p", stale, false, false).unwrap_err().code, 409);
        // Nothing changed: no write.
        assert_eq!(
            s.update(Kind::ValidatingPolicy, "p", updated.clone(), false, false).unwrap()["metadata"]
                ["resourceVersion"],
            "3"
        );

        let mut with_status = updated.clone();
        with_status["status"] = json!({"observedGeneration": 2});
        with_status["spec"]["validations"] = json!([]);
        let after = s.update(Kind::ValidatingPolicy, "p", with_status, true, false).unwrap();
        assert_eq!(after["status"]["observedGeneration"], 2);
        assert_eq!(after["spec"], updated["spec"], "the status subresource keeps the spec");
        assert_eq!(after["metadata"]["generation"], 2);

        let merged = s
            .patch(
                Kind::ValidatingPolicy,
                "p",
                "application/strategic-merge-patch+json",
                br#"{"$setElementOrder/validations":[{"expression":"x"}],"metadata":{"labels":{"c":"d"}}}"#,
                false,
                false,
                "",
            )
            .unwrap();
        assert_eq!(merged.1["metadata"]["labels"], json!({"a": "b", "c": "d"}));
        assert!(merged.1["spec"].get("$setElementOrder/validations").is_none());

        let applied = s
            .patch(
                Kind::ValidatingPolicy,
                "q",
                "application/apply-patch+yaml",
                serde_yaml::to_string(&policy("q")).unwrap().as_bytes(),
                false,
                false,
                "test",
            )
            .unwrap();
        assert_eq!(applied.0, 201);

        let gone =
            s.delete(Kind::ValidatingPolicy, "p", &json!({"preconditions": {"uid": "nope"}}), false).unwrap_err();
        assert_eq!(gone.code, 409);
        let gone = s.delete(Kind::ValidatingPolicy, "p", &Value::Null, false).unwrap();
        assert_eq!(gone["metadata"]["resourceVersion"], s.rv.to_string());
        assert_eq!(s.history.back().unwrap().typ, "DELETED");
        assert_eq!(s.delete(Kind::ValidatingPolicy, "p", &Value::Null, false).unwrap_err().reason, "NotFound");
    }

    #[test]
    fn invalid_objects_are_refused_as_kube_apiserver_words_it() {
        let mut s = Store::default();
        let e = s
            .create(Kind::ValidatingBinding, json!({"metadata": {"name": "b"}, "spec": {"policyName": "p"}}), false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.message,
            "ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io \"b\" is invalid: spec.validationActions: Required value: at least one validation action is required"
        );
        let e = s
            .create(Kind::ValidatingPolicy, json!({"kind": "ConfigMap", "metadata": {"name": "p"}}), false)
            .unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn a_selector_turns_changes_into_the_events_a_watch_sees() {
        let filter = Filter { labels: Selector::parse("a=b").unwrap(), fields: FieldSelector::default(), name: None };
        let mut old = policy("p");
        let mut new = old.clone();
        new["metadata"]["labels"]["a"] = "c".into();
        let change = |object: &Value, old: &Value| Change {
            rv: 7,
            kind: Kind::ValidatingPolicy,
            typ: "MODIFIED",
            object: object.clone(),
            old: Some(old.clone()),
        };
        let (typ, object) = filter.translate(&change(&new, &old)).unwrap();
        assert_eq!((typ, object["metadata"]["labels"]["a"].as_str()), ("DELETED", Some("b")));
        assert_eq!(object["metadata"]["resourceVersion"], "7");
        assert_eq!(filter.translate(&change(&old, &new)).unwrap().0, "ADDED");
        old["metadata"]["labels"]["a"] = "x".into();
        assert!(filter.translate(&change(&new, &old)).is_none());
    }

    #[test]
    fn mutating_policies_and_bindings_are_created_listed_and_defaulted_as_kube_apiserver_does() {
        let mut s = Store::default();
        // A status in the body is not a field of v1 MutatingAdmissionPolicy: dropped, and none is added.
        let mut body = mutating_policy("m");
        body["status"] = json!({"observedGeneration": 3});
        let made = s.create(Kind::MutatingPolicy, body, false).unwrap();
        assert_eq!(made["kind"], "MutatingAdmissionPolicy");
        assert_eq!(made["metadata"]["generation"], 1);
        assert!(made.get("status").is_none(), "{made}");
        let spec = &made["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");
        let m = &spec["matchConstraints"];
        assert_eq!(
            (&m["matchPolicy"], &m["namespaceSelector"], &m["objectSelector"]),
            (&json!("Equivalent"), &json!({}), &json!({}))
        );
        assert_eq!(m["resourceRules"][0]["scope"], "*");
        assert_eq!(spec["reinvocationPolicy"], "Never");
        assert_eq!(s.create(Kind::MutatingPolicy, mutating_policy("m"), false).unwrap_err().reason, "AlreadyExists");

        // The binding: matchResources defaulted; a paramRef's parameterNotFoundAction is not (v1 requires it).
        let binding = json!({"metadata": {"name": "m"},
                             "spec": {"policyName": "m", "paramRef": {"name": "limits", "namespace": "default"},
                                      "matchResources": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}]}}});
        let bound = s.create(Kind::MutatingBinding, binding, false).unwrap();
        assert_eq!(bound["kind"], "MutatingAdmissionPolicyBinding");
        assert_eq!(bound["metadata"]["resourceVersion"], "2");
        let r = &bound["spec"]["matchResources"];
        assert_eq!(
            (&r["matchPolicy"], &r["namespaceSelector"], &r["objectSelector"]),
            (&json!("Equivalent"), &json!({}), &json!({}))
        );
        assert_eq!(r["resourceRules"][0]["scope"], "*");
        assert!(bound["spec"]["paramRef"].get("parameterNotFoundAction").is_none(), "{bound}");
        assert!(bound["spec"].get("validationActions").is_none());

        // Same names, other kinds: other objects, each listed under its own kind only.
        s.create(Kind::ValidatingPolicy, policy("m"), false).unwrap();
        assert_eq!(s.objects.get(&(Kind::MutatingPolicy, "m".into())), Some(&made));
        let listed: Vec<&Value> = s.list(Kind::MutatingPolicy).collect();
        assert_eq!(listed, [&made]);
        assert_eq!(s.list(Kind::MutatingBinding).map(name_of).collect::<Vec<_>>(), ["m"]);
        let list = list_of(Kind::MutatingBinding, s.list(Kind::MutatingBinding).cloned().collect(), s.rv);
        assert_eq!(
            (&list["kind"], &list["metadata"]["resourceVersion"]),
            (&json!("MutatingAdmissionPolicyBindingList"), &json!("3"))
        );

        // An update keeps the policy without a status, and a spec change bumps the generation.
        let mut changed = made.clone();
        changed["spec"]["reinvocationPolicy"] = "IfNeeded".into();
        let updated = s.update(Kind::MutatingPolicy, "m", changed, false, false).unwrap();
        assert_eq!((&updated["metadata"]["generation"], updated.get("status")), (&json!(2), None));
    }

    #[test]
    fn mutating_kinds_refuse_what_kube_apiserver_requires() {
        let mut s = Store::default();
        let mut body = mutating_policy("m");
        body["spec"].as_object_mut().unwrap().remove("reinvocationPolicy");
        body["spec"]["mutations"] = json!([]);
        let e = s.create(Kind::MutatingPolicy, body, false).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.message,
            "MutatingAdmissionPolicy.admissionregistration.k8s.io \"m\" is invalid: [spec.mutations: Required value: mutations must contain at least one item, spec.reinvocationPolicy: Required value]"
        );
        let e = s.create(Kind::MutatingBinding, json!({"metadata": {"name": "b"}, "spec": {}}), false).unwrap_err();
        assert_eq!(
            e.message,
            "MutatingAdmissionPolicyBinding.admissionregistration.k8s.io \"b\" is invalid: spec.policyName: Required value"
        );
        assert!(s.objects.is_empty());
    }

    #[test]
    fn a_mutating_policy_has_no_status_subresource() {
        let path = |rest: &str| format!("{PREFIX}/{rest}");
        for rest in ["mutatingadmissionpolicies/m/status", "mutatingadmissionpolicybindings/b/status"] {
            assert!(matches!(route(&path(rest)), Some(Route::NotFound)), "{rest}");
        }
        // What the front answers for Route::NotFound: kube-apiserver's 404 for a path it does not serve.
        let status = ApiError::not_found_path();
        assert_eq!((status.code, status.reason), (404, "NotFound"));
        assert_eq!(status.response().status(), StatusCode::NOT_FOUND);
        assert!(matches!(route(&path("validatingadmissionpolicies/v/status")), Some(Route::Resource(t)) if t.status));

        let Some(Route::Resource(t)) = route(&path("mutatingadmissionpolicies/m")) else { panic!("a MAP route") };
        assert!(t.kind == Kind::MutatingPolicy && !t.status && t.name.as_deref() == Some("m"));
        let Some(Route::Resource(t)) = route(&path("watch/mutatingadmissionpolicybindings")) else { panic!("a watch") };
        assert!(t.kind == Kind::MutatingBinding && t.watch && t.name.is_none());
        // RBAC is asked about the resource as kube-apiserver's authorizer names it.
        assert_eq!(
            t.attributes("watch"),
            json!({"verb": "watch", "group": GROUP, "version": "v1", "resource": "mutatingadmissionpolicybindings"})
        );
    }

    #[test]
    fn discovery_adds_the_four_resources_where_kube_apiserver_lists_them() {
        let webhook = |name: &str, kind: &str| json!({"name": name, "singularName": "", "namespaced": false, "kind": kind, "verbs": ["get"]});
        let mut list = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
                              "resources": [webhook("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
                                            webhook("validatingwebhookconfigurations", "ValidatingWebhookConfiguration")]});
        merge_discovery(&mut list);
        // Merging again (or over a list that has them) gives the same list.
        let once = list.clone();
        merge_discovery(&mut list);
        assert_eq!(list, once);
        let resources = list["resources"].as_array().unwrap();
        let names: Vec<&str> = resources.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "mutatingadmissionpolicies",
                "mutatingadmissionpolicybindings",
                "mutatingwebhookconfigurations",
                "validatingadmissionpolicies",
                "validatingadmissionpolicies/status",
                "validatingadmissionpolicybindings",
                "validatingwebhookconfigurations",
            ]
        );
        let map = &resources[0];
        assert_eq!(
            map,
            &json!({"name": "mutatingadmissionpolicies", "singularName": "mutatingadmissionpolicy", "namespaced": false,
                    "kind": "MutatingAdmissionPolicy", "categories": ["api-extensions"],
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]})
        );
        assert_eq!(
            (&resources[1]["kind"], &resources[1]["singularName"]),
            (&json!("MutatingAdmissionPolicyBinding"), &json!("mutatingadmissionpolicybinding"))
        );
    }

    #[test]
    fn tables_have_kube_apiserver_printer_columns() {
        let columns = |t: &Value| -> Vec<String> {
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect()
        };
        let mut s = Store::default();
        let mut with_params = mutating_policy("m");
        with_params["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        let m = s.create(Kind::MutatingPolicy, with_params, false).unwrap();
        let table = table_of(Kind::MutatingPolicy, &[m], "", Some(s.rv));
        assert_eq!(columns(&table), ["Name", "Mutations", "ParamKind", "Age"]);
        let cells = &table["rows"][0]["cells"];
        assert_eq!((&cells[0], &cells[1], &cells[2]), (&json!("m"), &json!(2), &json!("v1/ConfigMap")));
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(table["metadata"]["resourceVersion"], s.rv.to_string());

        let binding = json!({"metadata": {"name": "b"}, "spec": {"policyName": "m", "paramRef": {"name": "limits"}}});
        let b = s.create(Kind::MutatingBinding, binding, false).unwrap();
        let table = table_of(Kind::MutatingBinding, &[b], "None", None);
        assert_eq!(columns(&table), ["Name", "PolicyName", "ParamRef", "Age"]);
        let cells = &table["rows"][0]["cells"];
        assert_eq!((&cells[0], &cells[1], &cells[2]), (&json!("b"), &json!("m"), &json!("*/limits")));
        assert!(table["rows"][0].get("object").is_none());

        let v = s.create(Kind::ValidatingPolicy, policy("v"), false).unwrap();
        let table = table_of(Kind::ValidatingPolicy, &[v], "", None);
        assert_eq!(columns(&table), ["Name", "Validations", "ParamKind", "Age"]);
        assert_eq!(table["rows"][0]["cells"][1], 1);
    }
}
