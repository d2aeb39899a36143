//! The distributed backend: etcd, laid out as kube-apiserver's etcd3 store. One backend holds one API group's
//! resources: keys are `<prefix>/<group>/<plural>/<namespace>/<name>`, values the object's JSON without
//! `resourceVersion` (it is the key's `mod_revision`, stamped on read), creates and compare-and-swap writes are
//! transactions on the key's revisions, and the cache above is fed by one watch with `prev_kv` from the revision it
//! listed at. Several servers may share the store: each one's cache follows every write. Every write also touches
//! one marker key beside the group's range, in the same transaction, so a consistent read needs only the marker's
//! revision to know what the cache must have applied — not etcd's progress notifications, which etcd before 3.4.31
//! may send ahead of events.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity, KvClient,
    ResponseHeader, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchClient, WatchOptions,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::Instrument;

use super::value::{Read, Transformer};
use super::{
    Backend, Change, ChangeStream, EventType, HistoryLimits, Object, Result, Revision, Snapshot, StorageError, Write,
};

/// The key compactors of one etcd agree on (kube-apiserver's own), so however many servers share the etcd, one
/// compacts per interval.
const COMPACT_REV_KEY: &str = "compact_rev_key";
/// Beside (not inside) the watched range `<root>/`: its mod_revision is the revision of the last write of ours.
const LAST_WRITE: &str = "#last-write";
/// Objects read per range request when loading.
const LOAD_PAGE: i64 = 500;
/// Largest response read, as etcd's Go client (kube-apiserver's) allows. tonic's default of 4 MiB would fail a load
/// page of large objects, or a watch response holding a range delete with every previous value, again and again.
const MAX_RESPONSE: usize = i32::MAX as usize;

fn kv_client(client: &Client) -> KvClient {
    client.kv_client().max_decoding_message_size(MAX_RESPONSE)
}

fn watch_client(client: &Client) -> WatchClient {
    client.watch_client().max_decoding_message_size(MAX_RESPONSE)
}

/// The revision a response was served at; etcd always sends it, and taking 0 instead would go back in time.
fn header_revision(header: Option<&ResponseHeader>) -> Result<i64> {
    header.map(|h| h.revision()).ok_or_else(|| StorageError::Backend("etcd sent a response without a header".into()))
}

/// How to reach etcd, with kube-apiserver's flag names, and which API group's keys the backend holds.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub servers: Vec<String>,
    /// Prefix of every key (`--etcd-prefix`).
    pub prefix: String,
    /// The API group whose resources the backend holds, under `<prefix>/<group>` as kube-apiserver keys a group's
    /// (none by default: `connect` refuses to guess).
    pub group: String,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// How often old revisions are compacted; zero leaves compaction to someone else.
    pub compaction_interval: Duration,
    /// Longest wait for one request before it fails.
    pub request_timeout: Duration,
    /// How values are encrypted at rest.
    pub values: Transformer,
}

impl EtcdOptions {
    /// `<prefix>/<group>`: the storage key `/<plural>/<namespace>/<name>` of an object lives at this plus the key.
    pub fn root(&self) -> String {
        format!("{}/{}", self.prefix.trim_end_matches('/'), self.group)
    }

    /// The etcd key of the object at storage key `key`.
    pub fn key(&self, key: &str) -> String {
        key_under(&self.root(), key)
    }

    /// The marker every write touches, beside (not inside) the group's range: `<root>#last-write`.
    pub fn marker(&self) -> String {
        marker_of(&self.root())
    }
}

fn key_under(root: &str, key: &str) -> String {
    format!("{root}{key}")
}

fn marker_of(root: &str) -> String {
    format!("{root}{LAST_WRITE}")
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            prefix: "/registry".into(),
            group: String::new(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            compaction_interval: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            values: Transformer::plain(),
        }
    }
}

pub struct EtcdBackend {
    client: Client,
    /// `<prefix>/<group>` (`EtcdOptions::root`): a storage key `/<plural>/ns/name` lives at this plus the key.
    root: String,
    timeout: Duration,
    compactor: Option<tokio::task::JoinHandle<()>>,
    reads: RevisionReads,
    values: Transformer,
}

type SharedRead = Shared<BoxFuture<'static, Result<Revision>>>;

/// Consistent reads that arrive together share one linearizable read of the marker, one read at a time. A caller
/// joins the next read to start, never one already in flight: that one may have started before the caller's
/// request did, and so miss a write acknowledged before it.
#[derive(Default)]
struct RevisionReads {
    /// The read that has not started yet, which arriving callers join.
    next: Arc<parking_lot::Mutex<Option<SharedRead>>>,
    /// Held by the read in flight.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        if let Some(c) = self.compactor.take() {
            c.abort();
        }
    }
}

fn read_pem(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| StorageError::Backend(format!("reading the etcd {what} {}: {e}", path.display())))
}

/// How an etcd client error reads: unreachable, too slow, or something else.
fn etcd_error(e: etcd_client::Error) -> StorageError {
    match &e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            tonic::Code::Unavailable => StorageError::Unavailable(s.message().to_owned()),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => StorageError::Timeout(s.message().to_owned()),
            // tonic's word for a connection that broke under the request.
            tonic::Code::Unknown if s.message().contains("transport error") => {
                StorageError::Unavailable(s.message().to_owned())
            }
            _ => StorageError::Backend(format!("etcd: {}", s.message())),
        },
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            StorageError::Unavailable(e.to_string())
        }
        _ => StorageError::Backend(format!("etcd: {e}")),
    }
}

/// A write's failure: only a connection that could not be made leaves the write surely undone.
fn write_error(e: etcd_client::Error) -> StorageError {
    if matches!(e, etcd_client::Error::TransportError(_)) {
        return etcd_error(e);
    }
    match etcd_error(e) {
        StorageError::Unavailable(m) => StorageError::Timeout(format!("{m}; the write may have been applied")),
        other => other,
    }
}

/// The object a value etcd holds at `etcd_key` stands for: its JSON (without resourceVersion) once the configured
/// providers have read it, stamped with `rev`. A value none reads becomes an unreadable object.
fn read_value(values: &Transformer, key: &str, etcd_key: &[u8], value: &[u8], rev: Revision) -> Result<Object> {
    match values.read(key, value, etcd_key) {
        Ok(Read::AsStored(json)) => Object::from_unstamped_json(key, json, rev),
        Ok(Read::Plain(p)) => Ok(Object::from_unstamped_json(key, &p.bytes, rev)?.stored_with(p.provider)),
        Err(e) => Ok(Object::unreadable(key, rev, &e)),
    }
}

fn revision(r: i64) -> Revision {
    r.max(0) as Revision
}

impl EtcdBackend {
    /// Connects (lazily: an etcd that is down now is retried by every request) and starts the compactor.
    pub async fn connect(options: EtcdOptions) -> Result<Self> {
        if options.servers.is_empty() {
            return Err(StorageError::Backend("no etcd servers given (--etcd-servers)".into()));
        }
        if options.group.is_empty() || options.group.contains('/') {
            return Err(StorageError::Backend(format!("no API group to keep in etcd (got {:?})", options.group)));
        }
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if options.ca_file.is_some() || options.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &options.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read_pem(ca, "CA file")?));
            }
            match (&options.cert_file, &options.key_file) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(Identity::from_pem(read_pem(cert, "cert file")?, read_pem(key, "key file")?))
                }
                (None, None) => {}
                _ => return Err(StorageError::Backend("--etcd-certfile and --etcd-keyfile go together".into())),
            }
            connect = connect.with_tls(tls);
        }
        let client = Client::connect(&options.servers, Some(connect)).await.map_err(etcd_error)?;
        let root = options.root();
        let compactor = (!options.compaction_interval.is_zero())
            .then(|| tokio::spawn(compactor(client.clone(), options.compaction_interval, options.request_timeout)));
        let (timeout, reads, values) = (options.request_timeout, RevisionReads::default(), options.values);
        Ok(Self { client, root, timeout, compactor, reads, values })
    }

    /// A linearizable read of the marker every write of ours touches (0 before the first); see `RevisionReads`.
    fn marker_read(&self) -> impl std::future::Future<Output = Result<Revision>> + Send + 'static {
        let (mut kv, key, timeout) = (kv_client(&self.client), marker_of(&self.root), self.timeout);
        let (next, turn) = (self.reads.next.clone(), self.reads.turn.clone());
        async move {
            // The wait is bounded: the read in flight has its own timeout.
            let _turn = turn.lock().await;
            // Starting now: whoever arrives from here on waits for the next read.
            next.lock().take();
            let resp = match tokio::time::timeout(timeout, kv.get(key, None)).await {
                Ok(r) => r.map_err(etcd_error)?,
                Err(_) => {
                    return Err(StorageError::Timeout(format!("etcd revision read took longer than {timeout:?}")))
                }
            };
            Ok(resp.kvs().first().map(|kv| revision(kv.mod_revision())).unwrap_or(0))
        }
    }

    fn etcd_key(&self, key: &str) -> Vec<u8> {
        key_under(&self.root, key).into_bytes()
    }

    /// Put in every write's transaction: see `last_write_revision`.
    fn touch(&self) -> TxnOp {
        TxnOp::put(marker_of(&self.root), "", None)
    }

    /// Every key under our root: `[root/, root0)`.
    fn range(&self) -> (Vec<u8>, Vec<u8>) {
        (format!("{}/", self.root).into_bytes(), format!("{}0", self.root).into_bytes())
    }

    /// The storage key of an etcd key under our root.
    fn storage_key<'k>(&self, etcd_key: &'k [u8]) -> Result<&'k str> {
        std::str::from_utf8(etcd_key).ok().and_then(|k| k.strip_prefix(self.root.as_str())).ok_or_else(|| {
            StorageError::Corrupt(format!("etcd key {:?} is not ours", String::from_utf8_lossy(etcd_key)))
        })
    }

    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(etcd_error),
            Err(_) => Err(StorageError::Timeout(format!("etcd {what} took longer than {:?}", self.timeout))),
        }
    }

    /// A write's transaction. Once the request may have reached etcd, a failure may hide an applied write: it is
    /// a timeout (504, "may have been applied"), never "unavailable" (503), which clients retry as a write that
    /// failed (kube-rs does, by default) and then see their own write as a conflict or a 404.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        let mut kv = kv_client(&self.client);
        let span = tracing::info_span!("etcd3.txn", otel.name = "Txn etcd3", otel.kind = "client");
        match tokio::time::timeout(self.timeout, kv.txn(txn)).instrument(span).await {
            Ok(r) => r.map_err(write_error),
            Err(_) => Err(StorageError::Timeout(format!("etcd transaction took longer than {:?}", self.timeout))),
        }
    }
}

/// Why an update or delete was refused, from the key's state the transaction read back instead.
fn refused(key: String, expected: Option<Revision>, resp: &etcd_client::TxnResponse) -> StorageError {
    let current = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| revision(kv.mod_revision())),
        _ => None,
    });
    match (current, expected) {
        (Some(actual), Some(expected)) => StorageError::Conflict { key, expected, actual },
        _ => StorageError::NotFound { key },
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn load(&self, _keep: &HistoryLimits) -> Result<Snapshot> {
        // Page through the range, every page at the first page's revision: one consistent snapshot.
        let (mut from, end) = self.range();
        let mut at = 0i64;
        let mut objects = Vec::new();
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(LOAD_PAGE);
            if at > 0 {
                opts = opts.with_revision(at);
            }
            let mut kv = kv_client(&self.client);
            let mut resp = self.timed("list", kv.get(from.clone(), Some(opts))).await?;
            if at == 0 {
                at = header_revision(resp.header())?;
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            for kv in &kvs {
                let key = self.storage_key(kv.key())?;
                let rev = revision(kv.mod_revision());
                objects.push(Arc::new(read_value(&self.values, key, kv.key(), kv.value(), rev)?));
            }
            match kvs.last() {
                Some(last) if more => from = [last.key(), b"\0"].concat(),
                _ => break,
            }
        }
        let at = revision(at);
        // etcd holds history, but the cache starts its own from here, as kube-apiserver's watch cache does.
        Ok(Snapshot { revision: at, objects, compacted: at, events: Vec::new() })
    }

    async fn write(&self, write: Write) -> Result<Arc<Object>> {
        match write {
            Write::Create { key, object } => {
                let k = self.etcd_key(&key);
                // The JSON etcd keeps: the object without `metadata.resourceVersion`.
                let json = object.into_unstamped();
                let (value, provider) = self.values.seal(&key, &json, &k)?;
                let txn = Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k, value, None), self.touch()]);
                let resp = self.txn(txn).await?;
                if !resp.succeeded() {
                    return Err(StorageError::AlreadyExists { key });
                }
                let rev = revision(header_revision(resp.header())?);
                Ok(Arc::new(Object::from_unstamped_json(&key, &json, rev)?.stored_with(provider)))
            }
            Write::Update { key, object, expected } => {
                let k = self.etcd_key(&key);
                let json = object.into_unstamped();
                let (value, provider) = self.values.seal(&key, &json, &k)?;
                let cmp = match expected {
                    Some(e) => Compare::mod_revision(k.clone(), CompareOp::Equal, e as i64),
                    None => Compare::create_revision(k.clone(), CompareOp::Greater, 0),
                };
                let txn = Txn::new()
                    .when([cmp])
                    .and_then([TxnOp::put(k.clone(), value, None), self.touch()])
                    .or_else([TxnOp::get(k, None)]);
                let resp = self.txn(txn).await?;
                if !resp.succeeded() {
                    return Err(refused(key, expected, &resp));
                }
                let rev = revision(header_revision(resp.header())?);
                Ok(Arc::new(Object::from_unstamped_json(&key, &json, rev)?.stored_with(provider)))
            }
            Write::Delete { key, expected } => {
                let k = self.etcd_key(&key);
                let cmp = match expected {
                    Some(e) => Compare::mod_revision(k.clone(), CompareOp::Equal, e as i64),
                    None => Compare::create_revision(k.clone(), CompareOp::Greater, 0),
                };
                let txn = Txn::new()
                    .when([cmp])
                    .and_then([TxnOp::delete(k.clone(), Some(DeleteOptions::new().with_prev_key())), self.touch()])
                    .or_else([TxnOp::get(k.clone(), None)]);
                let resp = self.txn(txn).await?;
                if !resp.succeeded() {
                    return Err(refused(key, expected, &resp));
                }
                let rev = revision(header_revision(resp.header())?);
                let prev = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| kv.value().to_vec()),
                    _ => None,
                });
                let prev =
                    prev.ok_or_else(|| StorageError::Backend(format!("etcd deleted {key:?} without its value")))?;
                // A deletion reports the last state, stamped with the deletion's revision.
                Ok(Arc::new(read_value(&self.values, &key, &k, &prev, rev)?))
            }
        }
    }

    fn watch(&self, after: Revision) -> Result<ChangeStream> {
        let (tx, rx) = mpsc::unbounded_channel();
        let follower = Follower {
            client: self.client.clone(),
            root: self.root.clone(),
            range: self.range(),
            values: self.values.clone(),
        };
        tokio::spawn(async move {
            let closed = tx.clone();
            tokio::select! {
                _ = follower.run(after, &tx) => {}
                _ = closed.closed() => {}
            }
        });
        Ok(Box::pin(UnboundedReceiverStream::new(rx)))
    }

    async fn last_write_revision(&self) -> Result<Option<Revision>> {
        let read = {
            let mut next = self.reads.next.lock();
            next.get_or_insert_with(|| self.marker_read().boxed().shared()).clone()
        };
        read.await.map(Some)
    }

    fn values(&self) -> &Transformer {
        &self.values
    }

    /// etcd's history is compacted by time (the compactor), not by what the cache keeps.
    fn compact(&self, _revision: Revision) {}

    async fn check(&self) -> Result<()> {
        self.last_write_revision().await.map(|_| ())
    }
}

/// One watch on etcd, feeding the cache.
struct Follower {
    client: Client,
    root: String,
    range: (Vec<u8>, Vec<u8>),
    values: Transformer,
}

type Sender = mpsc::UnboundedSender<Result<Vec<Change>>>;

impl Follower {
    async fn run(self, after: Revision, tx: &Sender) {
        if let Err(e) = self.follow(after, tx).await {
            let _ = tx.send(Err(e));
        }
    }

    async fn follow(&self, after: Revision, tx: &Sender) -> Result<()> {
        // From `after`, not after it: etcd before 3.4.34 and 3.5.15 drops a deletion at the compacted revision from
        // a watch that starts there (etcd#18089). One revision earlier, compaction there is refused as compacted
        // (a reload) instead, and the revision we hold already is skipped below.
        let opts = WatchOptions::new()
            .with_range(self.range.1.clone())
            .with_start_revision(after.max(1) as i64)
            .with_prev_key();
        let mut watch = watch_client(&self.client);
        let (_requests, mut responses) =
            watch.watch(self.range.0.clone(), Some(opts)).await.map_err(etcd_error)?.split();
        loop {
            let Some(resp) = responses.message().await.map_err(etcd_error)? else {
                return Err(StorageError::Unavailable("etcd ended the watch".into()));
            };
            if resp.canceled() {
                let compacted = revision(resp.compact_revision());
                if compacted > 0 {
                    return Err(StorageError::Expired { requested: after, oldest: compacted });
                }
                return Err(StorageError::Backend(format!("etcd cancelled the watch: {}", resp.cancel_reason())));
            }
            if resp.events().is_empty() {
                continue; // the response to the create request
            }
            let mut changes = Vec::with_capacity(resp.events().len());
            for ev in resp.events() {
                if ev.kv().is_some_and(|kv| revision(kv.mod_revision()) <= after) {
                    continue;
                }
                changes.push(self.change(ev)?);
            }
            if changes.is_empty() {
                continue;
            }
            if tx.send(Ok(changes)).is_err() {
                return Ok(());
            }
        }
    }

    fn change(&self, ev: &etcd_client::Event) -> Result<Change> {
        let kv = ev.kv().ok_or_else(|| StorageError::Corrupt("etcd event without a key".into()))?;
        let key = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| k.strip_prefix(self.root.as_str()))
            .ok_or_else(|| StorageError::Corrupt("etcd event for a key that is not ours".into()))?;
        let rev = revision(kv.mod_revision());
        let (kind, value) = match ev.event_type() {
            etcd_client::EventType::Put if kv.create_revision() == kv.mod_revision() => (EventType::Added, kv.value()),
            etcd_client::EventType::Put => (EventType::Modified, kv.value()),
            etcd_client::EventType::Delete => {
                // The last state comes from prev_kv; without it (compacted already) the deletion cannot be told.
                let prev = ev
                    .prev_kv()
                    .ok_or_else(|| StorageError::Expired { requested: rev.saturating_sub(1), oldest: rev })?;
                (EventType::Deleted, prev.value())
            }
        };
        let object = Arc::new(read_value(&self.values, key, kv.key(), value, rev)?);
        Ok(Change { revision: rev, kind, object })
    }
}

/// kube-apiserver's compactor: every interval, the server that wins a compare-and-swap on `compact_rev_key`
/// compacts etcd to the revision it saw one interval earlier, so at least one interval of history is kept.
async fn compactor(client: Client, interval: Duration, timeout: Duration) {
    let (mut version, mut rev) = (0i64, 0i64);
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        match tokio::time::timeout(timeout, compact_once(&client, version, rev)).await {
            Ok(Ok((v, r))) => (version, rev) = (v, r),
            Ok(Err(e)) => tracing::warn!(error = %e, "etcd compaction failed; trying again next interval"),
            Err(_) => tracing::warn!(?timeout, "etcd compaction timed out; trying again next interval"),
        }
    }
}

/// One round: returns the key's version and the revision to compact to next time.
async fn compact_once(client: &Client, version: i64, rev: i64) -> Result<(i64, i64)> {
    let mut kv = kv_client(client);
    let txn = Txn::new()
        .when([Compare::version(COMPACT_REV_KEY, CompareOp::Equal, version)])
        .and_then([TxnOp::put(COMPACT_REV_KEY, rev.to_string(), None)])
        .or_else([TxnOp::get(COMPACT_REV_KEY, None)]);
    let resp = kv.txn(txn).await.map_err(etcd_error)?;
    let current = header_revision(resp.header())?;
    if !resp.succeeded() {
        // Another server compacted this round; follow its count.
        let theirs = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version()),
            _ => None,
        });
        return Ok((theirs.unwrap_or(version), current));
    }
    if rev > 0 {
        kv.compact(rev, None).await.map_err(etcd_error)?;
        tracing::info!(revision = rev, "compacted etcd");
    }
    Ok((version + 1, current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_keys_and_marker_are_where_kube_apiserver_and_earlier_builds_put_them() {
        let options = |prefix: &str, group: &str| EtcdOptions {
            prefix: prefix.into(),
            group: group.into(),
            ..Default::default()
        };
        for prefix in ["/registry", "/registry/"] {
            let podsets = options(prefix, "demo.k8s.io");
            assert_eq!(podsets.root(), "/registry/demo.k8s.io");
            assert_eq!(podsets.key("/podsets/ns/name"), "/registry/demo.k8s.io/podsets/ns/name");
            assert_eq!(podsets.marker(), "/registry/demo.k8s.io#last-write");
        }
        let widgets = options("/kube", "test.podset.example");
        assert_eq!(widgets.key("/widgets/gear"), "/kube/test.podset.example/widgets/gear");
        assert_eq!(widgets.marker(), "/kube/test.podset.example#last-write");
    }

    #[tokio::test]
    async fn a_backend_needs_its_group() {
        let servers = vec!["http://127.0.0.1:1".to_owned()];
        for group in ["", "a/b"] {
            let options = EtcdOptions { servers: servers.clone(), group: group.into(), ..Default::default() };
            let err = EtcdBackend::connect(options).await.err().expect("refused").to_string();
            assert!(err.contains("no API group to keep in etcd"), "{err}");
        }
    }

    #[test]
    fn a_write_cut_off_in_flight_may_have_been_applied() {
        let cut = etcd_client::Error::GRpcStatus(tonic::Status::unknown("transport error"));
        assert!(matches!(write_error(cut), StorageError::Timeout(_)));
        let stopped = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: server stopped"));
        assert!(matches!(write_error(stopped), StorageError::Timeout(_)));
        // A read that failed the same way is only unavailable: nothing changed.
        let stopped = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: server stopped"));
        assert!(matches!(etcd_error(stopped), StorageError::Unavailable(_)));
    }
}
