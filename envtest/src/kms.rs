//! A KMS v2 plugin for tests, like k8s.io/apiserver's `Base64Plugin` (envelope/testing/v2/kms_plugin_mock.go): the
//! real `k8s.io/kms` v2 gRPC API on a unix socket, "encrypting" with base64, with controls to rotate its key, fail,
//! go away and come back. It serves from its own thread and runtime, so synchronous and async tests can both use it.

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use podset_apiserver::storage::value::kmsv2::api::{
    DecryptRequest, DecryptResponse, EncryptRequest, EncryptResponse, StatusRequest, StatusResponse, DECRYPT, ENCRYPT,
    SERVICE, STATUS,
};
use tonic::body::Body;
use tonic::{Request, Response, Status};

/// The annotation the plugin adds to each encryption, as kube's mock does.
pub const LOCAL_KEK_ANNOTATION: &str = "local-kek.kms.kubernetes.io";

/// How long a stopped server lets open connections finish before dropping them: a client that keeps its connection
/// open (or cannot run, its runtime blocked in [`KmsPlugin::stop`]) would otherwise hold a graceful shutdown forever.
const DRAIN: Duration = Duration::from_millis(200);

/// A KMS v2 plugin serving on a unix socket until dropped.
pub struct KmsPlugin {
    socket: PathBuf,
    state: Arc<State>,
    serving: Mutex<Option<Serving>>,
}

/// A running server: its thread, and what tells it to stop.
struct Serving {
    stop: tokio::sync::watch::Sender<()>,
    thread: JoinHandle<()>,
}

impl KmsPlugin {
    /// Serves on `socket` (replacing a stale file there) with key id `1`.
    pub fn start(socket: &Path) -> KmsPlugin {
        let state = State { key_id: Mutex::new("1".into()), ..State::default() };
        let plugin = KmsPlugin { socket: socket.to_owned(), state: Arc::new(state), serving: Mutex::new(None) };
        plugin.resume();
        plugin
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The key id that Status and Encrypt answer from now on (a key rotation).
    pub fn set_key_id(&self, key_id: &str) {
        *lock(&self.state.key_id) = key_id.to_owned();
    }

    /// While `failing`, every RPC answers FailedPrecondition, as a plugin whose key is disabled.
    pub fn fail(&self, failing: bool) {
        self.state.failing.store(failing, SeqCst);
    }

    /// Stops serving and removes the socket: a client then cannot connect. Connections still open are dropped.
    pub fn stop(&self) {
        let Some(serving) = lock(&self.serving).take() else { return };
        // Removed first so that nothing connects while the server drains.
        let _ = std::fs::remove_file(&self.socket);
        let _ = serving.stop.send(());
        if serving.thread.join().is_err() && !std::thread::panicking() {
            panic!("the KMS plugin's server on {} panicked", self.socket.display());
        }
    }

    /// Serves again on the same socket, with the same key id and counters. Does nothing while serving.
    pub fn resume(&self) {
        let mut serving = lock(&self.serving);
        if serving.is_some() {
            return;
        }
        match std::fs::remove_file(&self.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("removing {}: {e}", self.socket.display()),
            _ => {}
        }
        // Bound here, so the socket accepts connections once this returns.
        let listener = std::os::unix::net::UnixListener::bind(&self.socket)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .unwrap_or_else(|e| panic!("listening on {}: {e}", self.socket.display()));
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        let svc = KmsService(self.state.clone());
        let thread = std::thread::Builder::new()
            .name("kms-plugin".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                runtime.expect("a runtime for the KMS plugin").block_on(async move {
                    let listener = tokio::net::UnixListener::from_std(listener).expect("a tokio unix listener");
                    let mut draining = stopped.clone();
                    // A closed channel (the plugin gone) stops it too.
                    let shutdown = async move {
                        let _ = stopped.changed().await;
                    };
                    let serve = tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        shutdown,
                    );
                    let drained = async move {
                        let _ = draining.changed().await;
                        tokio::time::sleep(DRAIN).await;
                    };
                    // Leaving drops the runtime, and with it the connections that are left.
                    tokio::select! {
                        served = serve => served.expect("serving the KMS plugin"),
                        () = drained => {}
                    }
                });
            })
            .expect("a thread for the KMS plugin");
        *serving = Some(Serving { stop, thread });
    }

    /// How many Encrypt, Decrypt and Status calls it received (failed ones too).
    pub fn calls(&self) -> (usize, usize, usize) {
        let s = &self.state;
        (s.encrypts.load(SeqCst), s.decrypts.load(SeqCst), s.statuses.load(SeqCst))
    }

    /// The plaintext of the last Encrypt that succeeded.
    pub fn last_encrypt_plaintext(&self) -> Option<Vec<u8>> {
        lock(&self.state.last_plaintext).clone()
    }

    /// The `:authority` of each request received, in order: what a client dialing a unix socket puts there
    /// (kube-apiserver sends `localhost`).
    pub fn authorities(&self) -> Vec<String> {
        lock(&self.state.authorities).clone()
    }
}

impl Drop for KmsPlugin {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the plugin knows, shared by its controls and its server.
#[derive(Default)]
struct State {
    key_id: Mutex<String>,
    failing: AtomicBool,
    encrypts: AtomicUsize,
    decrypts: AtomicUsize,
    statuses: AtomicUsize,
    last_plaintext: Mutex<Option<Vec<u8>>>,
    authorities: Mutex<Vec<String>>,
}

/// A test that panicked holding a lock should not hide its failure behind the plugin's.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn check(&self) -> Result<(), Status> {
        match self.failing.load(SeqCst) {
            true => Err(Status::failed_precondition("failed precondition - key disabled")),
            false => Ok(()),
        }
    }

    fn status(&self, _: StatusRequest) -> Result<StatusResponse, Status> {
        self.statuses.fetch_add(1, SeqCst);
        self.check()?;
        Ok(StatusResponse { version: "v2".into(), healthz: "ok".into(), key_id: lock(&self.key_id).clone() })
    }

    fn encrypt(&self, req: EncryptRequest) -> Result<EncryptResponse, Status> {
        self.encrypts.fetch_add(1, SeqCst);
        self.check()?;
        if req.uid.is_empty() {
            return Err(Status::invalid_argument("uid is required"));
        }
        let ciphertext = STANDARD.encode(&req.plaintext).into_bytes();
        *lock(&self.last_plaintext) = Some(req.plaintext);
        let annotations = [(LOCAL_KEK_ANNOTATION.to_owned(), b"encrypted-local-kek".to_vec())].into();
        Ok(EncryptResponse { ciphertext, key_id: lock(&self.key_id).clone(), annotations })
    }

    fn decrypt(&self, req: DecryptRequest) -> Result<DecryptResponse, Status> {
        self.decrypts.fetch_add(1, SeqCst);
        self.check()?;
        if req.uid.is_empty() {
            return Err(Status::invalid_argument("uid is required"));
        }
        if req.key_id.is_empty() {
            return Err(Status::invalid_argument("key_id is required"));
        }
        let plaintext = STANDARD.decode(&req.ciphertext).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(DecryptResponse { plaintext })
    }
}

/// The gRPC service, written as tonic-build would generate it (no protoc): each method's path goes through tonic's
/// unary handling to its handler; any other path answers Unimplemented.
#[derive(Clone)]
struct KmsService(Arc<State>);

impl tonic::server::NamedService for KmsService {
    const NAME: &'static str = SERVICE;
}

impl tower::Service<http::Request<Body>> for KmsService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // HTTP/2 carries `:authority` in the URI; the host header stands in for it otherwise.
        let host = || req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).map(str::to_owned);
        let authority = req.uri().authority().map(ToString::to_string).or_else(host);
        lock(&self.0.authorities).extend(authority);
        let state = self.0.clone();
        Box::pin(async move {
            Ok(match req.uri().path() {
                STATUS => unary(req, state, State::status).await,
                ENCRYPT => unary(req, state, State::encrypt).await,
                DECRYPT => unary(req, state, State::decrypt).await,
                _ => {
                    let mut response = http::Response::new(Body::default());
                    let headers = response.headers_mut();
                    headers.insert(Status::GRPC_STATUS, (tonic::Code::Unimplemented as i32).into());
                    headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
                    response
                }
            })
        })
    }
}

/// Decodes a request for `handle` and encodes its answer (or its status), as generated code does.
async fn unary<Q, A>(
    req: http::Request<Body>,
    state: Arc<State>,
    handle: fn(&State, Q) -> Result<A, Status>,
) -> http::Response<Body>
where
    Q: prost::Message + Default + Send + 'static,
    A: prost::Message + Send + 'static,
{
    // A tower service of tonic requests is a `UnaryService`.
    let method =
        tower::service_fn(move |r: Request<Q>| std::future::ready(handle(&state, r.into_inner()).map(Response::new)));
    tonic::server::Grpc::new(tonic_prost::ProstCodec::<A, Q>::default()).unary(method, req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::uri::PathAndQuery;
    use tonic::transport::{Channel, Endpoint};
    use tonic::Code;

    async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
        let socket = socket.to_owned();
        let connector = tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?))
            }
        });
        Endpoint::try_from("http://localhost")?.connect_with_connector(connector).await
    }

    async fn call<Q, A>(channel: &Channel, path: &'static str, msg: Q) -> Result<A, Status>
    where
        Q: prost::Message + Send + 'static,
        A: prost::Message + Default + Send + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        grpc.unary(Request::new(msg), PathAndQuery::from_static(path), codec).await.map(Response::into_inner)
    }

    async fn status(channel: &Channel) -> Result<StatusResponse, Status> {
        call(channel, STATUS, StatusRequest {}).await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn serves_the_kms_v2_api() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kms.sock");
        std::fs::write(&socket, "stale").unwrap();
        let plugin = KmsPlugin::start(&socket);
        let channel = connect(&socket).await.unwrap();

        let s = status(&channel).await.unwrap();
        assert_eq!((s.version.as_str(), s.healthz.as_str(), s.key_id.as_str()), ("v2", "ok", "1"));

        let req = EncryptRequest { plaintext: b"a secret".to_vec(), uid: "u1".into() };
        let e: EncryptResponse = call(&channel, ENCRYPT, req).await.unwrap();
        assert_eq!((e.ciphertext.as_slice(), e.key_id.as_str()), (&b"YSBzZWNyZXQ="[..], "1"));
        assert_eq!(e.annotations[LOCAL_KEK_ANNOTATION], b"encrypted-local-kek");
        assert_eq!(plugin.last_encrypt_plaintext().as_deref(), Some(&b"a secret"[..]));

        let req =
            DecryptRequest { ciphertext: e.ciphertext, uid: "u2".into(), key_id: e.key_id, annotations: e.annotations };
        let d: DecryptResponse = call(&channel, DECRYPT, req.clone()).await.unwrap();
        assert_eq!(d.plaintext, b"a secret");

        // Bad requests.
        let bad = DecryptRequest { ciphertext: b"not base64!".to_vec(), ..req.clone() };
        let err = call::<_, DecryptResponse>(&channel, DECRYPT, bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let no_uid = EncryptRequest { plaintext: b"x".to_vec(), uid: String::new() };
        let err = call::<_, EncryptResponse>(&channel, ENCRYPT, no_uid).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "uid is required"));
        let err = call::<_, StatusResponse>(&channel, "/v2.KeyManagementService/Nope", StatusRequest {}).await;
        assert_eq!(err.unwrap_err().code(), Code::Unimplemented);

        // A rotation, then a disabled key.
        plugin.set_key_id("2");
        assert_eq!(status(&channel).await.unwrap().key_id, "2");
        plugin.fail(true);
        let err = status(&channel).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::FailedPrecondition, "failed precondition - key disabled"));
        let err = call::<_, DecryptResponse>(&channel, DECRYPT, req.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        plugin.fail(false);

        assert_eq!(plugin.calls(), (2, 3, 3));
        assert!(plugin.authorities().len() == 9 && plugin.authorities().iter().all(|a| a == "localhost"));

        // Gone: no socket, nothing connects, the open channel fails.
        let started = std::time::Instant::now();
        plugin.stop();
        assert!(started.elapsed() < Duration::from_secs(1), "stop took {:?}", started.elapsed());
        assert!(!socket.exists());
        assert!(connect(&socket).await.is_err());
        assert_eq!(status(&channel).await.unwrap_err().code(), Code::Unavailable);

        // Back, as it was: a new connection and the old channel both reach it.
        plugin.resume();
        assert_eq!(status(&connect(&socket).await.unwrap()).await.unwrap().key_id, "2");
        assert_eq!(status(&channel).await.unwrap().key_id, "2");
        assert_eq!(plugin.calls().2, 5);
    }

    /// From a synchronous test, and from a current-thread runtime that blocks in `stop` and `drop`.
    #[test]
    fn works_without_an_async_test() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kms.sock");
        let plugin = KmsPlugin::start(&socket);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let channel = runtime.block_on(connect(&socket)).unwrap();
        assert_eq!(runtime.block_on(status(&channel)).unwrap().key_id, "1");
        plugin.stop();
        assert!(runtime.block_on(status(&channel)).is_err());
        plugin.resume();
        assert_eq!(runtime.block_on(status(&channel)).unwrap().healthz, "ok");
        drop(plugin);
        assert!(!socket.exists());
    }
}
