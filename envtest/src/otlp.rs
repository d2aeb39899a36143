//! An OpenTelemetry collector for tests: the OTLP/gRPC trace service (`opentelemetry.proto.collector.trace.v1`) on
//! a loopback port, keeping every span it receives. It serves from its own thread and runtime, so synchronous and
//! async tests can both use it, and it can be slowed down to play a collector that does not keep up.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;

/// One span as received, its IDs in hex as W3C `traceparent` writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// `service.name` of the resource that sent it.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP's `SpanKind`: 2 server, 3 client.
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    /// (trace ID, span ID) of each link.
    pub links: Vec<(String, String)>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

impl Span {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct State {
    spans: Mutex<Vec<Span>>,
    /// How long each export is held before it is answered, in milliseconds.
    delay_ms: AtomicU64,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpReceiver {
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port for the OTLP receiver");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State::default());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let svc = TraceServiceServer::new(Receiver(state.clone()));
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                runtime.expect("a runtime for the OTLP receiver").block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    let serve = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming_shutdown(incoming, shutdown);
                    // Leaving drops the runtime and any export still held.
                    let _ = serve.await;
                });
            })
            .expect("a thread for the OTLP receiver");
        Self { addr, state, stop: Some(stop), thread: Some(thread) }
    }

    /// `host:port`, as a TracingConfiguration's `endpoint` takes it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.state.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn clear(&self) {
        self.state.spans.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Holds each export this long before answering it: a collector that does not keep up.
    pub fn set_delay(&self, delay: Duration) {
        self.state.delay_ms.store(delay.as_millis() as u64, SeqCst);
    }

    /// Waits up to `timeout` for the spans received to satisfy `done`; returns them either way.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Receiver(Arc<State>);

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref().and_then(|v| v.value.as_ref())))).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let delay = Duration::from_millis(self.0.delay_ms.load(SeqCst));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for s in scope.spans {
                    received.push(Span {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        kind: s.kind,
                        attributes: attributes(&s.attributes),
                        links: s.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                        start_unix_nanos: s.start_time_unix_nano,
                        end_unix_nanos: s.end_time_unix_nano,
                    });
                }
            }
        }
        self.0.spans.lock().unwrap_or_else(PoisonError::into_inner).extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}
