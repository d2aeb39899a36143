//! Values at rest, as k8s.io/apiserver's `storage/value` transforms them: between an object's JSON and the bytes
//! its backend keeps, the providers an `EncryptionConfiguration` (`--encryption-provider-config`) gives the
//! object's resource (a [`ProviderTable`], by the key it is stored at). The first provider writes; every provider
//! reads what carries its prefix (`k8s:enc:aescbc:v1:<key name>:` ...), identity what carries none. sled
//! and etcd store the same bytes for the same object and key.

mod aes;
pub mod kmsv2;
pub(crate) mod metrics;
mod secretbox;

use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;

use super::{Result as StoreResult, StorageError};

pub use aes::{Cbc, Gcm};
pub use secretbox::Secretbox;

/// Why a value could not be transformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValueError {
    message: String,
    /// The metrics' `status`: a gRPC code's name for a KMS call that failed, else `unknown-non-grpc`.
    status: &'static str,
}

impl ValueError {
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), status: UNKNOWN_NON_GRPC }
    }

    /// A failure a KMS plugin answered with `code` (a gRPC code's name).
    pub fn grpc(message: impl Into<String>, code: &'static str) -> Self {
        Self { message: message.into(), status: code }
    }

    pub fn status(&self) -> &'static str {
        self.status
    }
}

/// One provider's transformation of a value's bytes (after its prefix). `context` is the key the value is stored
/// under: authenticated by `aesgcm` (and KMS v2), so a value copied to another key does not read.
pub trait Transform: Send + Sync {
    fn transform_from_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError>;
    fn transform_to_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError>;
    /// The plain bytes and, for a provider whose key changes under one prefix (KMS), the key they were written
    /// with ...
    fn read(&self, data: &[u8], context: &[u8]) -> Result<(Vec<u8>, Option<String>), ValueError> {
        self.transform_from_storage(data, context).map(|plain| (plain, None))
    }
    /// ... and the one it writes with now, so a value of an older key is stale.
    fn current_key(&self) -> Option<String> {
        None
    }
    /// A probe of what the provider depends on (a KMS plugin), for `/healthz/kms-providers`.
    fn healthz(&self) -> Option<futures::future::BoxFuture<'static, Result<(), String>>> {
        None
    }
    /// Whether it can read and write yet (a KMS provider: once its plugin has answered).
    fn ready(&self) -> bool {
        true
    }
}

/// What every encrypted value starts with; identity refuses to read such a value as plain JSON.
pub const ENCRYPTED: &[u8] = b"k8s:enc:";

/// One configured provider with one key: what its values start with, and what it does. A clone shares the
/// transformation (one KMS plugin's client serves every resource its configuration entry names).
#[derive(Clone)]
pub struct Provider {
    /// `k8s:enc:aescbc:v1:`, `k8s:enc:kms:v2:<name>:`; empty for identity.
    outer: Arc<str>,
    /// `<key name>:` for providers with keys.
    inner: Option<Arc<str>>,
    /// The whole prefix, which objects record as the provider that read them.
    label: Arc<str>,
    transform: Option<Arc<dyn Transform>>,
}

impl Provider {
    pub fn identity() -> Self {
        Self { outer: "".into(), inner: None, label: IDENTITY.into(), transform: None }
    }

    /// A provider whose values start with `outer` then `inner` (`<key name>:`, if any).
    pub fn new(outer: String, inner: Option<String>, transform: Box<dyn Transform>) -> Self {
        let label = format!("{outer}{}", inner.as_deref().unwrap_or_default()).into();
        Self { outer: outer.into(), inner: inner.map(Into::into), label, transform: Some(transform.into()) }
    }

    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    /// What an object records as having read it: the prefix, and for a KMS provider the key under it.
    fn keyed_label(&self, key: Option<String>) -> Arc<str> {
        match key {
            None => self.label.clone(),
            Some(k) => format!("{}{k}", self.label).into(),
        }
    }

    /// The label of what this provider writes now.
    fn writer_label(&self) -> Arc<str> {
        self.keyed_label(self.transform.as_ref().and_then(|t| t.current_key()))
    }

    /// The probe of what it depends on, if anything.
    pub fn healthz(&self) -> Option<futures::future::BoxFuture<'static, Result<(), String>>> {
        self.transform.as_ref().and_then(|t| t.healthz())
    }
}

/// A resource's providers, in the configuration's order: the first writes, all read.
pub struct Providers {
    list: Vec<Provider>,
    /// `<resource>.<group>`, for the metrics.
    resource: Arc<str>,
}

impl Providers {
    pub fn new(resource: &str, list: Vec<Provider>) -> Self {
        assert!(!list.is_empty(), "a resource has at least one provider");
        Self { list, resource: resource.into() }
    }

    pub fn writer(&self) -> &Provider {
        &self.list[0]
    }

    /// `<resource>.<group>`, as the metrics name it.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Every provider, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Provider> {
        self.list.iter()
    }

    /// k8s.io/apiserver's `prefixTransformers`: each provider whose prefix the value has is tried in order (an
    /// identity that meets encrypted data steps aside); the first that reads it wins.
    fn read(&self, stored: &[u8], context: &[u8]) -> Result<(Vec<u8>, Arc<str>), ValueError> {
        let mut errors = Vec::new();
        for p in &self.list {
            let Some(t) = &p.transform else {
                if stored.starts_with(ENCRYPTED) {
                    continue;
                }
                self.record(FROM_STORAGE, IDENTITY, Instant::now(), "OK");
                return Ok((stored.to_vec(), p.label.clone()));
            };
            if !stored.starts_with(p.label.as_bytes()) {
                continue;
            }
            let started = Instant::now();
            let data = &stored[p.label.len()..];
            let read = t.read(data, context);
            self.record_provider(FROM_STORAGE, p, started, read.as_ref().err());
            match read {
                Ok((plain, key)) => return Ok((plain, p.keyed_label(key))),
                Err(e) => errors.push(e),
            }
        }
        self.record(FROM_STORAGE, "unknown", Instant::now(), UNKNOWN_NON_GRPC);
        Err(match errors.len() {
            0 => ValueError::new(format!("no matching prefix found (the value starts {})", shown_prefix(stored))),
            1 => errors.remove(0),
            _ => {
                ValueError::new(format!("[{}]", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")))
            }
        })
    }

    fn write(&self, plain: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let p = self.writer();
        let started = Instant::now();
        let written = match &p.transform {
            None => Ok(plain.to_vec()),
            Some(t) => t.transform_to_storage(plain, context).map(|sealed| [p.label.as_bytes(), &sealed].concat()),
        };
        self.record_provider(TO_STORAGE, p, started, written.as_ref().err());
        written
    }

    /// Counted at both levels a provider with keys has, as k8s.io/apiserver's nested prefix transformers count.
    fn record_provider(&self, direction: &str, p: &Provider, started: Instant, error: Option<&ValueError>) {
        let status = error.map_or("OK", |e| e.status);
        if let Some(inner) = &p.inner {
            self.record(direction, inner, started, status);
        }
        self.record(direction, &p.outer, started, status);
    }

    fn record(&self, direction: &str, prefix: &str, started: Instant, status: &str) {
        let metrics = &metrics::metrics().transformation;
        metrics.observe(&self.resource, direction, prefix, started.elapsed(), status);
    }
}

const FROM_STORAGE: &str = "from_storage";
/// The label of the provider that stores values as they are.
const IDENTITY: &str = "identity";
/// The metrics' status of a failure that is not a KMS plugin's gRPC answer.
const UNKNOWN_NON_GRPC: &str = "unknown-non-grpc";
const TO_STORAGE: &str = "to_storage";

/// The prefix of a stored value, up to its key name, for errors: `"k8s:enc:aescbc:v1:key1:"`.
fn shown_prefix(stored: &[u8]) -> String {
    if !stored.starts_with(ENCRYPTED) {
        return "without a known prefix".into();
    }
    // k8s:enc:<provider>:<version>:<name>:
    let mut colons = 0;
    let end = stored.iter().position(|&b| {
        colons += usize::from(b == b':');
        colons == 5
    });
    let head = &stored[..end.map_or(stored.len(), |e| e + 1).min(80)];
    format!("{:?}", String::from_utf8_lossy(head))
}

/// What a plain store (no configuration, or none for this resource) does with a value: passes it through, unless it
/// is encrypted, as k8s.io/apiserver's encrypt-check identity.
fn check_plain(stored: &[u8]) -> Result<(), ValueError> {
    match stored.starts_with(ENCRYPTED) {
        true => Err(ValueError::new(format!(
            "identity transformer tried to read encrypted data (the value starts {}; is --encryption-provider-config missing a key?)",
            shown_prefix(stored)
        ))),
        false => Ok(()),
    }
}

/// Which providers serve which resource of a store, by the root its objects are kept under (a resource's
/// `key_root`, `/podsets/`): the storage key of a value picks its resource's providers, as kube-apiserver's
/// `EncryptionConfiguration` serves each resource its own. A resource the table leaves out is stored plainly.
#[derive(Default)]
pub struct ProviderTable {
    by_root: Vec<(String, Providers)>,
}

impl ProviderTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The table, with `providers` serving the objects under `key_root`.
    pub fn with(mut self, key_root: impl Into<String>, providers: Providers) -> Self {
        self.insert(key_root, providers);
        self
    }

    /// `providers` serve the objects under `key_root` (a root holds one resource: a second one is a bug).
    pub fn insert(&mut self, key_root: impl Into<String>, providers: Providers) {
        let key_root = key_root.into();
        assert!(self.by_root.iter().all(|(r, _)| *r != key_root), "two resources under {key_root}");
        self.by_root.push((key_root, providers));
    }

    /// The providers of the resource `key` belongs to.
    pub fn get(&self, key: &str) -> Option<&Providers> {
        self.by_root.iter().find(|(root, _)| key.starts_with(root.as_str())).map(|(_, p)| p)
    }

    pub fn is_empty(&self) -> bool {
        self.by_root.is_empty()
    }

    /// Every resource's root and providers, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Providers)> {
        self.by_root.iter().map(|(root, p)| (root.as_str(), p))
    }

    fn providers(&self) -> impl Iterator<Item = &Provider> {
        self.by_root.iter().flat_map(|(_, p)| p.list.iter())
    }
}

/// How a store transforms its values: plain (no `--encryption-provider-config`, nothing transformed or counted),
/// or by its resources' providers, whose whole table a reload of the configuration replaces while the store runs.
#[derive(Clone, Default)]
pub struct Transformer(Option<Arc<RwLock<Arc<ProviderTable>>>>);

impl std::fmt::Debug for Transformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(table) = self.table() else { return f.write_str("Transformer(plain)") };
        let writers = table.iter().map(|(root, p)| format!("{root} with {}", p.writer().label));
        write!(f, "Transformer(writes {})", writers.collect::<Vec<_>>().join(", "))
    }
}

/// A value read from storage: its plain bytes and the provider that read them (`None` when stored plainly).
#[derive(Debug)]
pub struct Plain {
    pub bytes: Vec<u8>,
    pub provider: Option<Arc<str>>,
}

/// How a backend takes a stored value.
pub enum Read<'a> {
    /// As it is stored: a plain store or resource (the backend may share the buffer rather than copy it).
    AsStored(&'a [u8]),
    /// The plain bytes the providers gave.
    Plain(Plain),
}

impl Transformer {
    /// Values stored as they are: the default, with no encryption configuration.
    pub const fn plain() -> Self {
        Self(None)
    }

    pub fn new(table: ProviderTable) -> Self {
        Self(Some(Arc::new(RwLock::new(Arc::new(table)))))
    }

    pub fn is_plain(&self) -> bool {
        self.0.is_none()
    }

    /// Takes `table` for every value read and written from now on: every resource's providers change at once.
    pub fn replace(&self, table: ProviderTable) {
        if let Some(current) = &self.0 {
            *current.write() = Arc::new(table);
        }
    }

    /// Whether every provider of every resource can read and write yet: a store loaded before would hold what a
    /// KMS plugin not yet answering wrote as unreadable.
    pub fn ready(&self) -> bool {
        self.table().is_none_or(|t| t.providers().all(|p| p.transform.as_ref().is_none_or(|t| t.ready())))
    }

    /// The probes of the KMS plugins every resource's providers depend on, named `kms-provider-<n>` in the table's
    /// order; a plugin that serves several resources is probed once.
    pub fn kms_probes(&self) -> Vec<(String, futures::future::BoxFuture<'static, Result<(), String>>)> {
        let Some(table) = self.table() else { return Vec::new() };
        let mut seen = Vec::new();
        let first = |p: &&Provider| {
            p.transform.as_ref().is_some_and(|t| {
                let at = Arc::as_ptr(t).cast::<()>();
                let new = !seen.contains(&at);
                seen.push(at);
                new
            })
        };
        table
            .providers()
            .filter(first)
            .filter_map(Provider::healthz)
            .enumerate()
            .map(|(i, f)| (format!("kms-provider-{i}"), f))
            .collect()
    }

    fn table(&self) -> Option<Arc<ProviderTable>> {
        self.0.as_ref().map(|t| t.read().clone())
    }

    /// The value stored at `key` (under `context`, the key the backend keeps it at), as a backend takes it: as
    /// stored when its resource is stored plainly (an encrypted value is refused), else as its providers read it.
    pub fn read<'a>(&self, key: &str, stored: &'a [u8], context: &[u8]) -> Result<Read<'a>, ValueError> {
        let table = self.table();
        match table.as_deref().and_then(|t| t.get(key)) {
            None => check_plain(stored).map(|()| Read::AsStored(stored)),
            Some(p) => {
                p.read(stored, context).map(|(bytes, label)| Read::Plain(Plain { bytes, provider: Some(label) }))
            }
        }
    }

    /// The plain bytes of the value stored at `key` under `context`.
    pub fn from_storage(&self, key: &str, stored: &[u8], context: &[u8]) -> Result<Plain, ValueError> {
        Ok(match self.read(key, stored, context)? {
            Read::AsStored(bytes) => Plain { bytes: bytes.to_vec(), provider: None },
            Read::Plain(plain) => plain,
        })
    }

    /// The bytes to store for `plain` at `key` under `context`, and the provider that wrote them.
    pub fn to_storage(
        &self,
        key: &str,
        plain: &[u8],
        context: &[u8],
    ) -> Result<(Vec<u8>, Option<Arc<str>>), ValueError> {
        let table = self.table();
        match table.as_deref().and_then(|t| t.get(key)) {
            None => Ok((plain.to_vec(), None)),
            Some(p) => p.write(plain, context).map(|stored| (stored, Some(p.writer().writer_label()))),
        }
    }

    /// [`Self::to_storage`] for the object at `key`, as a backend writes it: a value that cannot be encrypted is a
    /// write refused.
    pub(in crate::storage) fn seal(
        &self,
        key: &str,
        plain: &[u8],
        context: &[u8],
    ) -> StoreResult<(Vec<u8>, Option<Arc<str>>)> {
        self.to_storage(key, plain, context)
            .map_err(|e| StorageError::Unwritable { key: key.to_owned(), reason: e.to_string() })
    }

    /// Whether the value at `key` that `provider` read should be written again: another provider than its
    /// resource's writer read it. A resource a reload left out is written plainly: what any provider but identity
    /// wrote of it is stale.
    pub fn is_stale(&self, key: &str, provider: Option<&Arc<str>>) -> bool {
        let (Some(table), Some(read_by)) = (self.table(), provider) else { return false };
        match table.get(key) {
            Some(p) => *read_by != p.writer().writer_label(),
            None => &**read_by != IDENTITY,
        }
    }
}

#[cfg(test)]
mod tests;
