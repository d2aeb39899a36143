//! Watch over HTTP: the registry's watch as a chunked stream of JSON `WatchEvent`s in the negotiated
//! representation, with bookmarks, WatchList's end marker, timeouts, and 410 as an ERROR event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use http::{header, HeaderValue, StatusCode};
use kube::core::watch::{Bookmark, BookmarkMeta};
use kube::core::{TypeMeta, WatchEvent};
use rand::Rng;
use serde_json::Value;
use tokio::time::{Interval, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::error::{ApiError, ApiResult, StatusBody};
use super::metrics::{metrics, GroupVersionResource};
use super::negotiate::Output;
use super::render::{bookmark_table, partial_metadata, single_row_table};
use super::request::{IncludeObject, Query};
use crate::api::resource::{ResourceInfo, VersionIndex};
use crate::api::selector::{FieldSelector, Selector};
use crate::registry::{self, Event, EventType, Notification, RestStorage, Revision, WatchRequest as RegistryWatch};

/// Settings for every watch this server serves.
#[derive(Clone)]
pub struct WatchConfig {
    pub bookmark_interval: Duration,
    /// `--min-request-timeout`: a watch without `timeoutSeconds` ends after a random time in [this, twice this).
    pub min_request_timeout: Duration,
    pub shutdown: CancellationToken,
}

impl WatchConfig {
    /// How long a watch runs: what it asked for, else (also for `timeoutSeconds=0`, as in kube-apiserver) spread
    /// over [t, 2t), so clients that connected together (after a restart, say) do not all reconnect together.
    fn timeout(&self, timeout_seconds: Option<u64>) -> Duration {
        match timeout_seconds {
            Some(s) if s > 0 => Duration::from_secs(s),
            _ => self.min_request_timeout.mul_f64(1.0 + rand::rng().random::<f64>()),
        }
    }
}

/// One watch request, parsed.
pub struct WatchRequest {
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: FieldSelector,
    pub query: Query,
    pub output: Output,
    pub resource: &'static ResourceInfo,
    /// The version events are sent in.
    pub version: VersionIndex,
}

/// The line forms a watch can send: JSON (as stored), PartialObjectMetadata, and Table with each `includeObject`.
const FORMS: usize = 5;
/// A Table line carries an Age: shared only while it is this fresh, so a watcher never sends a stale one.
const TABLE_FRESH: Duration = Duration::from_secs(1);

/// One revision's encoded lines, by version, event type and form: encoded (and converted) by the first watcher to
/// send one, shared (as `Bytes`, not copied) by the others. A version's table is made when a watcher of it comes:
/// most revisions are watched in one version only, and every revision watched keeps its lines.
struct Lines(Box<[OnceLock<Box<VersionLines>>]>);

impl Lines {
    fn new(versions: usize) -> Self {
        Self((0..versions).map(|_| OnceLock::new()).collect())
    }
}

/// One version's lines, by event type and form.
type VersionLines = [[OnceLock<Line>; FORMS]; 3];

struct Line {
    made: Instant,
    bytes: Bytes,
}

struct Encoder {
    output: Output,
    include: IncludeObject,
    resource: &'static ResourceInfo,
    version: VersionIndex,
    /// `apiserver_watch_events_total` of the resource in the version.
    sent: prometheus_client::metrics::counter::Counter,
}

impl Encoder {
    fn form(&self) -> usize {
        match (self.output, self.include) {
            (Output::Table, IncludeObject::None) => 2,
            (Output::Table, IncludeObject::Metadata) => 3,
            (Output::Table, IncludeObject::Object) => 4,
            (Output::Metadata, _) => 1,
            _ => 0,
        }
    }

    fn event(&self, ev: &Event) -> Bytes {
        self.sent.inc();
        let Some(lines) = ev.memo(|| Lines::new(self.resource.versions.len())) else { return self.encode(ev) };
        let kind = match ev.kind {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
        };
        let Some(lines) = lines.0.get(self.version.get()) else { return self.encode(ev) };
        let lines = lines.get_or_init(Box::default);
        let line = lines[kind][self.form()].get_or_init(|| Line { made: Instant::now(), bytes: self.encode(ev) });
        if self.output == Output::Table && line.made.elapsed() > TABLE_FRESH {
            return self.encode(ev);
        }
        line.bytes.clone()
    }

    fn encode(&self, ev: &Event) -> Bytes {
        let (obj, kind) = (&ev.object, ev.kind.as_str());
        let framed = match self.output {
            // From the stored object, whose row memo serves every version (a Table line older than TABLE_FRESH is
            // encoded again, its row not).
            Output::Table => single_row_table(obj, self.include, self.version).map(|b| frame(kind, &b)),
            Output::Metadata => partial_metadata(obj, self.version).map(|b| frame(kind, &b)),
            // The object written into the line in the version asked for, with no copy of it in between.
            _ => frame_with(kind, obj.bytes().len(), |buf| Ok(obj.put_in_version(buf, self.version)?)),
        };
        framed.unwrap_or_else(|e| self.error(&e))
    }

    fn bookmark(&self, revision: Revision, initial_events_end: bool) -> Bytes {
        let mut annotations = std::collections::BTreeMap::new();
        if initial_events_end {
            annotations.insert("k8s.io/initial-events-end".to_owned(), "true".to_owned());
        }
        let types = match self.output {
            Output::Metadata => TypeMeta { api_version: "meta.k8s.io/v1".into(), kind: "PartialObjectMetadata".into() },
            _ => TypeMeta {
                api_version: self.resource.version(self.version).api_version.into(),
                kind: self.resource.kind.into(),
            },
        };
        let bookmark =
            Bookmark { types, metadata: BookmarkMeta { resource_version: revision.to_string(), annotations } };
        if self.output == Output::Table {
            // kube-apiserver's table conversion turns every event's object into a Table, bookmarks' too.
            let object = serde_json::to_value(&bookmark).unwrap_or_default();
            return match bookmark_table(self.resource, object, revision, initial_events_end, self.include) {
                Ok(table) => frame("BOOKMARK", &table),
                Err(e) => self.error(&e),
            };
        }
        line(&WatchEvent::<Value>::Bookmark(bookmark))
    }

    fn error(&self, e: &ApiError) -> Bytes {
        let mut v = serde_json::Map::new();
        v.insert("type".into(), Value::String("ERROR".into()));
        v.insert("object".into(), serde_json::to_value(StatusBody::new(&e.status)).unwrap_or_default());
        line(&v)
    }
}

/// `{"type":"<kind>","object":<object>}` and a newline: one event, its object already serialized.
fn frame(kind: &str, object: &[u8]) -> Bytes {
    let Ok(framed) = frame_with(kind, object.len(), |buf| {
        buf.put_slice(object);
        Ok::<_, std::convert::Infallible>(())
    });
    framed
}

/// A watch event line whose object `put` writes (about `size` bytes).
fn frame_with<E>(kind: &str, size: usize, put: impl FnOnce(&mut BytesMut) -> Result<(), E>) -> Result<Bytes, E> {
    let mut buf = BytesMut::with_capacity(size + 40);
    buf.put_slice(b"{\"type\":\"");
    buf.put_slice(kind.as_bytes());
    buf.put_slice(b"\",\"object\":");
    put(&mut buf)?;
    buf.put_slice(b"}\n");
    Ok(buf.freeze())
}

fn line(v: &impl serde::Serialize) -> Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// Notifications one poll of a watch body reads at most (as tokio's budget bounds a task's work per poll).
const READS_PER_POLL: usize = 128;

/// Lines that are ready together go out as one body frame (one chunk, one TLS record, one write) up to this size.
const BATCH_BYTES: usize = 32 << 10;

/// Lines gathered for one frame: a single line is passed on as it is (shared, not copied).
#[derive(Default)]
struct Batch {
    one: Option<Bytes>,
    more: BytesMut,
}

impl Batch {
    fn push(&mut self, line: Bytes) {
        if self.more.is_empty() && self.one.is_none() {
            self.one = Some(line);
            return;
        }
        if let Some(first) = self.one.take() {
            self.more.reserve(first.len() + line.len());
            self.more.put(first);
        }
        self.more.put(line);
    }

    fn len(&self) -> usize {
        self.one.as_ref().map_or(self.more.len(), Bytes::len)
    }

    fn full(&self) -> bool {
        self.len() >= BATCH_BYTES
    }

    fn take(&mut self) -> Option<Bytes> {
        match self.one.take() {
            Some(b) => Some(b),
            None if self.more.is_empty() => None,
            None => Some(std::mem::take(&mut self.more).freeze()),
        }
    }
}

/// A watch's response body, pulled by the connection as it writes: events go from the registry's watch straight
/// into the body, with no task or queue per watcher between them.
struct WatchBody {
    encoder: Encoder,
    /// The initial events, encoded as the connection takes them: encoded up front, 100 watchers opening on 10k
    /// objects would hold a copy of every object each.
    initial: std::vec::IntoIter<Event>,
    /// Sent after the initial events, before any change: the initial-events-end bookmark.
    first: VecDeque<Bytes>,
    events: BoxStream<'static, registry::Result<Notification>>,
    deadline: Pin<Box<Sleep>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Bookmarks, when the watcher allows them.
    ticker: Option<Interval>,
    /// The revision the watcher has been told about, or skipped to (what a bookmark reports).
    seen: Revision,
    done: bool,
    /// What the sources above wake, instead of the connection's own waker.
    wake: Arc<Woken>,
    waker: Waker,
}

/// Wakes the connection for a watch and remembers that it did. The connection polls the body after every frame it
/// writes and on wake-ups of its own; only a poll after this fired reads the sources (locks, timers) again.
struct Woken {
    flag: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Woken {
    /// Set at first, so the first poll reads every source (and registers with it).
    fn new() -> Arc<Self> {
        Arc::new(Woken { flag: AtomicBool::new(true), task: AtomicWaker::new() })
    }
}

impl WatchBody {
    /// A body with nothing to send first and no bookmarks, that ends after `timeout` or at `shutdown`.
    fn new(
        encoder: Encoder,
        events: BoxStream<'static, registry::Result<Notification>>,
        seen: Revision,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        let wake = Woken::new();
        WatchBody {
            encoder,
            initial: Vec::new().into_iter(),
            first: VecDeque::new(),
            events,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            shutdown: Box::pin(shutdown.cancelled_owned()),
            ticker: None,
            seen,
            done: false,
            waker: Waker::from(wake.clone()),
            wake,
        }
    }
}

impl Stream for WatchBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let mut batch = Batch::default();
        while !batch.full() {
            let line = match this.initial.next() {
                Some(ev) => this.encoder.event(&ev),
                None => match this.first.pop_front() {
                    Some(line) => line,
                    None => break,
                },
            };
            batch.push(line);
        }
        if let Some(b) = batch.take() {
            return Poll::Ready(Some(Ok(b)));
        }
        // Registered before the flag is read, so a wake-up in between is not lost.
        this.wake.task.register(cx.waker());
        if !this.wake.flag.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let cx = &mut Context::from_waker(&this.waker);
        if this.deadline.as_mut().poll(cx).is_ready() || this.shutdown.as_mut().poll(cx).is_ready() {
            this.done = true;
            return Poll::Ready(None);
        }
        if let Some(ticker) = &mut this.ticker {
            if ticker.poll_tick(cx).is_ready() {
                this.wake.flag.store(true, Ordering::Release);
                return Poll::Ready(Some(Ok(this.encoder.bookmark(this.seen, false))));
            }
        }
        let mut reads = 0;
        loop {
            if batch.full() || reads == READS_PER_POLL {
                // Not read to its end: the events may not wake us for what is left. A watcher catching up through
                // many events it does not see (a selector's) reads them a share at a time, letting others run.
                this.wake.flag.store(true, Ordering::Release);
                this.wake.task.wake();
                break;
            }
            reads += 1;
            match this.events.poll_next_unpin(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    batch.push(this.encoder.error(&ApiError::from(e)));
                    this.done = true;
                    break;
                }
                Poll::Ready(Some(Ok(Notification::Progress(revision)))) => this.seen = revision,
                Poll::Ready(Some(Ok(Notification::Event(ev)))) => {
                    this.seen = ev.revision;
                    batch.push(this.encoder.event(&ev));
                }
            }
        }
        match batch.take() {
            Some(b) => Poll::Ready(Some(Ok(b))),
            None if this.done => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

fn response(body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

impl Encoder {
    fn new(output: Output, include: IncludeObject, resource: &'static ResourceInfo, version: VersionIndex) -> Self {
        let gvr = GroupVersionResource {
            group: resource.group.into(),
            version: resource.version(version).name.into(),
            resource: resource.plural.into(),
        };
        let sent = metrics().watch_events.get_or_create(&gvr).clone();
        Self { output, include, resource, version, sent }
    }
}

/// Starts a watch on `storage` and returns the streaming response.
pub async fn serve(storage: &dyn RestStorage, cfg: &WatchConfig, req: WatchRequest) -> ApiResult<Response> {
    let q = &req.query;
    let requested = q.revision()?;
    q.check_list_options(true)?;

    let encoder = Encoder::new(req.output, q.include_object, req.resource, req.version);
    let watch = storage.watch(RegistryWatch {
        namespace: req.namespace,
        labels: req.labels,
        fields: req.fields,
        resource_version: requested,
        send_initial_events: q.send_initial_events,
    });
    let watch = match watch.await {
        Ok(w) => w,
        Err(e @ registry::Error::Expired { .. }) => {
            // As the watch cache: HTTP 200 and one ERROR event, so clients relist instead of retrying forever.
            let line: Result<Bytes, Infallible> = Ok(encoder.error(&ApiError::from(e)));
            return Ok(response(Body::from_stream(futures::stream::once(async move { line }))));
        }
        Err(e) => return Err(e.into()),
    };
    let start = watch.revision;
    let mut first = VecDeque::new();
    if q.send_initial_events == Some(true) {
        first.push_back(encoder.bookmark(start, true));
    }
    let ticker = q
        .allow_watch_bookmarks
        .then(|| tokio::time::interval_at(tokio::time::Instant::now() + cfg.bookmark_interval, cfg.bookmark_interval));
    let timeout = cfg.timeout(q.timeout_seconds);
    let initial = watch.initial.into_iter();
    let body = WatchBody {
        initial,
        first,
        ticker,
        ..WatchBody::new(encoder, watch.events, start, timeout, cfg.shutdown.clone())
    };
    Ok(response(Body::from_stream(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Registry = crate::registry::Registry<crate::resources::podset::PodSetStrategy>;
    use crate::api::{Subresource, UserInfo, API_VERSION};
    use crate::api::{Version, KIND};
    use crate::registry::{ObjectKey, PatchType, Stored, WriteOptions};
    use crate::resources::podset::INFO;
    use http_body_util::BodyExt;
    use serde_json::json;

    async fn registry(dir: &std::path::Path) -> Registry {
        Registry::on_sled(dir).await
    }

    fn config() -> WatchConfig {
        WatchConfig {
            bookmark_interval: Duration::from_secs(60),
            min_request_timeout: Duration::from_secs(1800),
            shutdown: CancellationToken::new(),
        }
    }

    async fn create(reg: &Registry, name: &str, app: &str) -> Stored {
        let body = json!({"apiVersion": API_VERSION, "kind": KIND,
                          "metadata": {"name": name, "labels": {"app": app}},
                          "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                                   "template": {"metadata": {"labels": {"app": app}},
                                                "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        reg.create("ns", body, &WriteOptions::manager("test", UserInfo::default())).await.unwrap().object
    }

    async fn patch(reg: &Registry, name: &str, patch: Value) -> Stored {
        let key = ObjectKey::new("ns", name);
        let patch = serde_json::to_vec(&patch).unwrap();
        let opts = WriteOptions::manager("test", UserInfo::default());
        reg.patch(&key, &patch, PatchType::Merge, Subresource::Main, &opts).await.unwrap().object
    }

    async fn watch(reg: &Registry, from: Revision, output: Output, include: IncludeObject, labels: &str) -> Body {
        let query = Query { resource_version: Some(from.to_string()), include_object: include, ..Default::default() };
        let req = WatchRequest {
            namespace: Some("ns".into()),
            labels: Selector::parse(labels).unwrap(),
            fields: FieldSelector::default(),
            query,
            output,
            resource: &INFO,
            version: reg.storage_version().into(),
        };
        serve(reg, &config(), req).await.unwrap().into_body()
    }

    async fn next_frame(body: &mut Body) -> Bytes {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await.unwrap().unwrap().unwrap();
        frame.into_data().unwrap()
    }

    fn event_line(kind: &str, object: &[u8]) -> Vec<u8> {
        [format!(r#"{{"type":"{kind}","object":"#).as_bytes(), object, b"}\n"].concat()
    }

    #[test]
    fn unbounded_watches_end_at_a_random_time_between_t_and_2t() {
        let cfg = WatchConfig {
            bookmark_interval: Duration::from_secs(60),
            min_request_timeout: Duration::from_secs(1800),
            shutdown: CancellationToken::new(),
        };
        let spread: Vec<Duration> = (0..200).map(|_| cfg.timeout(None)).collect();
        assert!(spread.iter().all(|t| (Duration::from_secs(1800)..Duration::from_secs(3600)).contains(t)));
        let distinct: std::collections::HashSet<_> = spread.iter().collect();
        assert!(distinct.len() > 100, "spread out, not one value");
        assert_eq!(cfg.timeout(Some(5)), Duration::from_secs(5), "timeoutSeconds is taken as asked");
        let zero = cfg.timeout(Some(0));
        assert!((Duration::from_secs(1800)..Duration::from_secs(3600)).contains(&zero), "timeoutSeconds=0: {zero:?}");
    }

    #[tokio::test]
    async fn an_event_line_is_encoded_once_per_revision_and_form_for_all_watchers() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let rv = create(&reg, "a", "web").await.resource_version();
        let mut json = Vec::new();
        for _ in 0..20 {
            json.push(watch(&reg, rv, Output::Json, IncludeObject::Metadata, "").await);
        }
        let mut tables = Vec::new();
        for _ in 0..3 {
            tables.push(watch(&reg, rv, Output::Table, IncludeObject::None, "").await);
        }
        let mut metadata = watch(&reg, rv, Output::Metadata, IncludeObject::Metadata, "").await;
        let changed = patch(&reg, "a", json!({"spec": {"replicas": 2}})).await;

        let mut lines = Vec::new();
        for body in &mut json {
            lines.push(next_frame(body).await);
        }
        assert_eq!(lines[0], event_line("MODIFIED", changed.bytes()));
        assert!(lines.iter().all(|l| l.as_ptr() == lines[0].as_ptr()), "one buffer, shared by every JSON watcher");

        let mut rows = Vec::new();
        for body in &mut tables {
            rows.push(next_frame(body).await);
        }
        assert!(rows.iter().all(|r| r.as_ptr() == rows[0].as_ptr()), "one Table line for every Table watcher");
        let row: Value = serde_json::from_slice(&rows[0]).unwrap();
        assert_eq!((row["type"].as_str(), row["object"]["kind"].as_str()), (Some("MODIFIED"), Some("Table")));
        assert!(row["object"]["rows"][0].get("object").is_none(), "includeObject=None is its own form");

        let partial = next_frame(&mut metadata).await;
        assert_eq!(partial, event_line("MODIFIED", &partial_metadata(&changed, reg.storage_version().into()).unwrap()));
    }

    #[tokio::test]
    async fn each_version_gets_its_own_lines_converted_once() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await.with_storage_version(Version::V1beta1);
        let rv = create(&reg, "a", "web").await.resource_version();
        let cfg = config();
        let in_version = |v: Version| {
            let query = Query { resource_version: Some(rv.to_string()), ..Default::default() };
            let req = WatchRequest {
                namespace: Some("ns".into()),
                labels: Selector::default(),
                fields: FieldSelector::default(),
                query,
                output: Output::Json,
                resource: &INFO,
                version: v.into(),
            };
            serve(&reg, &cfg, req)
        };
        let mut alpha = Vec::new();
        for _ in 0..3 {
            alpha.push(in_version(Version::V1alpha1).await.unwrap().into_body());
        }
        let mut beta = in_version(Version::V1beta1).await.unwrap().into_body();
        let changed = patch(&reg, "a", json!({"spec": {"minReadySeconds": 10}})).await;
        let mut lines = Vec::new();
        for body in &mut alpha {
            lines.push(next_frame(body).await);
        }
        assert!(lines.iter().all(|l| l.as_ptr() == lines[0].as_ptr()), "converted once for every v1alpha1 watcher");
        let ev: Value = serde_json::from_slice(&lines[0]).unwrap();
        assert_eq!(ev["object"]["apiVersion"], "demo.k8s.io/v1alpha1");
        assert_eq!(ev["object"]["metadata"]["annotations"]["demo.k8s.io/v1beta1-min-ready-seconds"], "10");
        assert_eq!(ev["object"]["spec"].get("minReadySeconds"), None);
        assert_eq!(
            next_frame(&mut beta).await,
            event_line("MODIFIED", changed.bytes()),
            "stored in v1beta1, sent as is"
        );
        // An object with nothing but its apiVersion to convert: the stored bytes behind v1alpha1's head.
        let plain = create(&reg, "b", "web").await;
        let line = next_frame(&mut alpha[0]).await;
        let rest = plain.bytes().strip_prefix(Version::V1beta1.json_head().as_bytes()).unwrap();
        assert_eq!(line, event_line("ADDED", &[Version::V1alpha1.json_head().as_bytes(), rest].concat()));
    }

    #[tokio::test]
    async fn a_selector_leaving_deleted_is_the_previous_state_restamped_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let before = create(&reg, "a", "web").await;
        let rv = before.resource_version();
        let mut leaving = Vec::new();
        for _ in 0..10 {
            leaving.push(watch(&reg, rv, Output::Json, IncludeObject::Metadata, "app=web").await);
        }
        let mut entering = watch(&reg, rv, Output::Json, IncludeObject::Metadata, "app=db").await;
        let after = patch(&reg, "a", json!({"metadata": {"labels": {"app": "db"}}})).await;

        // What each watcher was sent before the line was shared: the previous state stamped at the new revision.
        let restamped = before.restamped(after.resource_version()).unwrap();
        let want = event_line("DELETED", restamped.bytes());
        let mut lines = Vec::new();
        for body in &mut leaving {
            lines.push(next_frame(body).await);
        }
        assert_eq!(lines[0], want);
        let deleted: Value = serde_json::from_slice(&lines[0]).unwrap();
        assert_eq!(deleted["object"]["metadata"]["labels"]["app"], "web");
        assert_eq!(deleted["object"]["metadata"]["resourceVersion"], after.resource_version().to_string());
        assert!(lines.iter().all(|l| l.as_ptr() == lines[0].as_ptr()), "made once for all leaving watchers");
        assert_eq!(next_frame(&mut entering).await, event_line("ADDED", after.bytes()));
    }

    /// A JSON body of the metadata, ending in 10 s.
    fn test_body(
        events: BoxStream<'static, registry::Result<Notification>>,
        seen: Revision,
        shutdown: CancellationToken,
    ) -> WatchBody {
        let encoder = Encoder::new(Output::Json, IncludeObject::Metadata, &INFO, Version::V1alpha1.into());
        WatchBody::new(encoder, events, seen, Duration::from_secs(10), shutdown)
    }

    #[tokio::test(start_paused = true)]
    async fn the_body_reads_its_sources_only_after_they_woke_it() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, mut rx) = futures::channel::mpsc::unbounded::<registry::Result<Notification>>();
        let counted = polls.clone();
        let events = futures::stream::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::Relaxed);
            rx.poll_next_unpin(cx)
        });
        let shutdown = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let mut body = WatchBody {
            first: VecDeque::from([Bytes::from_static(b"a\n"), Bytes::from_static(b"b\n")]),
            ticker: Some(tokio::time::interval_at(start + Duration::from_secs(3), Duration::from_secs(3))),
            ..test_body(events.boxed(), 5, shutdown.clone())
        };
        let mut poll = || futures::FutureExt::now_or_never(body.next()).map(|l| l.map(Result::unwrap));
        assert_eq!(poll(), Some(Some(Bytes::from_static(b"a\nb\n"))), "the first lines, in one frame");
        assert_eq!(poll(), None);
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        assert_eq!(poll(), None);
        assert_eq!(polls.load(Ordering::Relaxed), 1, "nothing woke it: the events are not read again");

        tx.unbounded_send(Ok(Notification::Progress(9))).unwrap();
        assert_eq!(poll(), None, "a change the watcher does not see sends nothing");
        assert_eq!(polls.load(Ordering::Relaxed), 3);

        tokio::time::advance(Duration::from_secs(3)).await;
        let bookmark: Value = serde_json::from_slice(&poll().unwrap().unwrap()).unwrap();
        assert_eq!(bookmark["type"], "BOOKMARK");
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "9", "at the revision skipped to");
        assert_eq!(poll(), None);

        shutdown.cancel();
        assert_eq!(poll(), Some(None), "shutdown ends the watch");
    }

    #[tokio::test]
    async fn initial_events_are_encoded_a_frame_at_a_time_as_the_connection_takes_them() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        for i in 0..300 {
            create(&reg, &format!("p{i:03}"), "web").await;
        }
        let w = reg
            .watch(RegistryWatch {
                namespace: Some("ns".into()),
                labels: Selector::default(),
                fields: FieldSelector::default(),
                resource_version: None,
                send_initial_events: None,
            })
            .await
            .unwrap();
        assert_eq!(w.initial.len(), 300);
        let mut body =
            WatchBody { initial: w.initial.into_iter(), ..test_body(w.events, w.revision, CancellationToken::new()) };
        let frame = body.next().await.unwrap().unwrap();
        let lines = frame.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
        assert!(frame.len() < 2 * BATCH_BYTES, "one frame's worth: {} bytes", frame.len());
        assert_eq!(body.initial.len(), 300 - lines, "the rest is not encoded yet");
        assert!(body.initial.len() > 0);
        let mut names = Vec::new();
        let mut frame = frame;
        loop {
            for line in frame.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let ev: Value = serde_json::from_slice(line).unwrap();
                assert_eq!(ev["type"], "ADDED");
                names.push(ev["object"]["metadata"]["name"].as_str().unwrap().to_owned());
            }
            if names.len() == 300 {
                break;
            }
            frame = body.next().await.unwrap().unwrap();
        }
        assert_eq!(names, (0..300).map(|i| format!("p{i:03}")).collect::<Vec<_>>(), "every object, in order");
    }

    #[tokio::test(start_paused = true)]
    async fn events_the_watcher_does_not_see_are_read_a_share_per_poll() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, mut rx) = futures::channel::mpsc::unbounded::<registry::Result<Notification>>();
        for revision in 0..(2 * READS_PER_POLL + 10) as Revision {
            tx.unbounded_send(Ok(Notification::Progress(revision))).unwrap();
        }
        let counted = reads.clone();
        let events = futures::stream::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::Relaxed);
            rx.poll_next_unpin(cx)
        });
        let mut body = test_body(events.boxed(), 0, CancellationToken::new());
        let woken = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        for share in 1..=2 {
            assert!(body.poll_next_unpin(&mut cx).is_pending());
            assert_eq!(reads.load(Ordering::Relaxed), share * READS_PER_POLL, "one share per poll");
            assert_eq!(woken.0.load(Ordering::Relaxed), share, "and it asks to be polled again");
        }
        assert!(body.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(reads.load(Ordering::Relaxed), 2 * READS_PER_POLL + 11, "the rest, up to the end");
        assert_eq!(body.seen, (2 * READS_PER_POLL + 9) as Revision);
        assert_eq!(woken.0.load(Ordering::Relaxed), 2, "nothing left: no wake-up");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn the_body_ends_at_its_deadline_and_after_an_error() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<registry::Result<Notification>>();
        let mut body = test_body(rx.boxed(), 5, CancellationToken::new());
        assert!(futures::FutureExt::now_or_never(body.next()).is_none());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(matches!(futures::FutureExt::now_or_never(body.next()), Some(None)), "ends at its deadline");

        let expired = registry::Error::Expired { message: "too old".into(), continue_token: None };
        let mut body = test_body(futures::stream::iter([Err(expired)]).boxed(), 5, CancellationToken::new());
        let line: Value = serde_json::from_slice(&body.next().await.unwrap().unwrap()).unwrap();
        assert_eq!((line["type"].as_str(), line["object"]["code"].as_i64()), (Some("ERROR"), Some(410)));
        assert!(body.next().await.is_none());
        drop(tx);
    }

    #[tokio::test]
    async fn events_ready_together_go_in_one_frame() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let rv = create(&reg, "z", "web").await.resource_version();
        let mut body = watch(&reg, rv, Output::Json, IncludeObject::Metadata, "").await;
        let a = create(&reg, "a", "web").await;
        let b = create(&reg, "b", "web").await;
        let frame = next_frame(&mut body).await;
        assert_eq!(frame, [event_line("ADDED", a.bytes()), event_line("ADDED", b.bytes())].concat());
    }
}
