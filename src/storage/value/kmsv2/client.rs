//! A KMS v2 plugin's gRPC client over its unix socket, as kube-apiserver's (`envelope/kmsv2/grpc_service.go`):
//! authority `localhost`, every call bounded by the configured timeout. Calls run on a runtime of the client's
//! own, so the synchronous storage paths (sled's writer thread, a cache load) can wait for one.

use std::future::Future;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use super::api;
use crate::storage::value::metrics::metrics;
use crate::storage::value::ValueError;

pub struct Client {
    runtime: Option<tokio::runtime::Runtime>,
    channel: Channel,
    timeout: Duration,
    /// The provider's name, for metrics.
    name: String,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Never blocks: a client is dropped from async code on a configuration reload.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The socket path of `unix:///path` (`unix:///@name`: an abstract socket).
pub fn socket_path(endpoint: &str) -> Result<String, String> {
    if endpoint.is_empty() {
        return Err("remote KMS provider can't use empty string as endpoint".into());
    }
    let Some(path) = endpoint.strip_prefix("unix://") else {
        let scheme = endpoint.split_once("://").map_or(endpoint, |(s, _)| s);
        return Err(format!("unsupported scheme {scheme:?} for remote KMS provider"));
    };
    match path.strip_prefix("/@") {
        Some(name) => Ok(format!("\0{name}")),
        None if path.is_empty() => Err(format!("invalid endpoint {endpoint:?} for remote KMS provider")),
        None => Ok(path.to_owned()),
    }
}

impl Client {
    /// A client of the plugin at `endpoint`; it connects on its first call (a plugin that is not up yet is not an
    /// error here).
    pub fn new(name: &str, endpoint: &str, timeout: Duration) -> Result<Self, String> {
        let path = socket_path(endpoint)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("kms-{name}"))
            .enable_all()
            .build()
            .map_err(|e| format!("starting the KMS client: {e}"))?;
        let channel = {
            let _entered = runtime.enter();
            Endpoint::from_static("http://localhost").connect_timeout(timeout).connect_with_connector_lazy(
                tower::service_fn(move |_| {
                    let path = path.clone();
                    async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(connect(&path).await?)) }
                }),
            )
        };
        Ok(Self { runtime: Some(runtime), channel, timeout, name: name.to_owned() })
    }

    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime.as_ref().expect("running until dropped").handle()
    }

    /// One unary call, timed and counted as `apiserver_envelope_encryption_kms_operations_latency_seconds`.
    pub async fn call<Req, Resp>(&self, method: &'static str, request: Req) -> Result<Resp, ValueError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let started = Instant::now();
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let call = async {
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(tonic::Request::new(request), PathAndQuery::from_static(method), codec).await
        };
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!("no answer within {:?}", self.timeout))),
        };
        let code = match &result {
            Ok(_) => "OK",
            Err(s) => code_name(s.code()),
        };
        metrics().envelope.kms_operation(&self.name, method, code, started.elapsed());
        result.map_err(|s| {
            ValueError::grpc(
                format!("rpc error: code = {} desc = {}", code_name(s.code()), s.message()),
                code_name(s.code()),
            )
        })
    }

    /// Runs `f` on the client's runtime and waits for it, from any thread.
    pub fn block<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.runtime().spawn(async move {
            let _ = tx.send(f.await);
        });
        let wait = || rx.recv().expect("the KMS client's runtime answers while it runs");
        match tokio::runtime::Handle::try_current() {
            // A worker of a runtime that has others: let them run meanwhile.
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }
}

async fn connect(path: &str) -> std::io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(path).await
}

/// A gRPC code's name, as Go's `codes.Code.String()` writes it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The plugin's answer to `Status`.
pub async fn status(client: &Client) -> Result<api::StatusResponse, ValueError> {
    client.call(api::STATUS, api::StatusRequest {}).await
}
