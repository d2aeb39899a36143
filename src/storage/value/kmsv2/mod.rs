//! KMS v2 envelope encryption, as kube-apiserver's `envelope/kmsv2` does it: a seed of 32 random bytes, encrypted
//! once by the plugin (its key ID and annotations kept beside it), gives every value its own AES-256-GCM key by
//! HKDF-SHA256 over 32 random bytes stored with the value; so a write costs no call to the plugin, and a read only
//! when its seed is not cached yet. The seed changes when the plugin's key ID does (seen by a `Status` poll, every
//! minute, every 10 s while failing); writes stop once the plugin has not been healthy for the write TTL (3 min).

pub mod api;
mod client;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use hkdf::Hkdf;
use parking_lot::{Mutex, RwLock};
use prost::Message;
use rand::RngCore;
use sha2::{Digest, Sha256};

use self::api::{EncryptedDekSourceType, EncryptedObject};
pub use self::client::socket_path;
use self::client::Client;
use super::aes::Gcm;
use super::metrics::metrics;
use super::{Transform, ValueError};

/// Limits kube-apiserver puts on what a plugin hands back.
const KEY_ID_MAX: usize = 1024;
const DEK_SOURCE_MAX: usize = 1024;
const ANNOTATIONS_MAX: usize = 32 * 1024;
const INFO: usize = 32;
const NONCE: usize = 12;

/// How the provider paces itself; kube-apiserver's constants by default.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Between `Status` polls while healthy (1 min).
    pub poll: Duration,
    /// Between polls while failing (10 s).
    pub poll_failing: Duration,
    /// How long after the last healthy `Status` writes go on (3 min).
    pub write_ttl: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(60),
            poll_failing: Duration::from_secs(10),
            write_ttl: Duration::from_secs(180),
        }
    }
}

/// The seed writes use now.
struct WriteState {
    key_id: String,
    /// `hash(key_id)`, as the metrics label it.
    key_id_hash: String,
    seed: Arc<[u8; 32]>,
    encrypted_seed: Vec<u8>,
    annotations: std::collections::BTreeMap<String, Vec<u8>>,
    expires: SystemTime,
}

struct Shared {
    name: String,
    client: Client,
    timing: Timing,
    apiserver_id_hash: String,
    state: RwLock<Option<WriteState>>,
    /// Plain seeds (or keys) by the hash of what identifies their encrypted form.
    sources: Mutex<HashMap<[u8; 32], Arc<[u8; 32]>>>,
    /// The last health probe, reused for 20 s if it passed and 3 s if not.
    probed: Mutex<Option<(Instant, Result<(), String>)>>,
}

/// A `kms` provider (`apiVersion: v2`).
pub struct KmsV2(Arc<Shared>);

/// `sha256:<hex>`, as kube-apiserver hashes key IDs for logs and metrics.
fn hash(s: &str) -> String {
    if s.is_empty() {
        return String::new();
    }
    format!("sha256:{}", Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect::<String>())
}

impl KmsV2 {
    /// Connects to the plugin and asks it once for its key (a plugin that does not answer yet is retried in the
    /// background; until it has answered once, reads and writes of this provider fail).
    pub fn new(
        name: &str,
        endpoint: &str,
        timeout: Duration,
        timing: Timing,
        apiserver_id_hash: &str,
    ) -> Result<Self, String> {
        let client = Client::new(name, endpoint, timeout)?;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            client,
            timing,
            apiserver_id_hash: apiserver_id_hash.to_owned(),
            state: RwLock::new(None),
            sources: Mutex::new(HashMap::new()),
            probed: Mutex::new(None),
        });
        let primed = {
            let s = shared.clone();
            shared.client.block(async move { s.refresh().await })
        };
        if let Err(e) = &primed {
            tracing::warn!(provider = name, error = %e, "KMS v2 plugin not ready yet; retrying every {:?}", timing.poll_failing);
        }
        let poller = Arc::downgrade(&shared);
        shared.client.runtime().spawn(poll(poller, primed.is_ok()));
        Ok(Self(shared))
    }

    /// `/healthz/kms-providers`' probe of this plugin: a `Status` call, answered from the last one for a while.
    pub fn healthz(&self) -> BoxFuture<'static, Result<(), String>> {
        let shared = self.0.clone();
        Box::pin(async move {
            if let Some((at, result)) = shared.probed.lock().clone() {
                let ttl = if result.is_ok() { Duration::from_secs(20) } else { Duration::from_secs(3) };
                if at.elapsed() < ttl {
                    return result;
                }
            }
            let s = shared.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            shared.client.runtime().spawn(async move {
                let _ = tx.send(s.check_status().await);
            });
            let result = rx.await.unwrap_or_else(|_| Err("the KMS client stopped".into()));
            *shared.probed.lock() = Some((Instant::now(), result.clone()));
            result
        })
    }
}

/// Polls `Status` while the provider lives: every `poll`, or `poll_failing` while it fails.
async fn poll(shared: Weak<Shared>, mut healthy: bool) {
    loop {
        let pause = match shared.upgrade() {
            Some(s) if healthy => s.timing.poll,
            Some(s) => s.timing.poll_failing,
            None => return,
        };
        tokio::time::sleep(pause).await;
        let Some(s) = shared.upgrade() else { return };
        healthy = match s.refresh().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(provider = %s.name, error = %e, "KMS v2 plugin is not healthy");
                false
            }
        };
    }
}

impl Shared {
    /// A `Status` call, checked as kube-apiserver checks it; the key ID it names.
    async fn check_status(&self) -> Result<(), String> {
        self.status().await.map(drop)
    }

    async fn status(&self) -> Result<String, String> {
        let name = &self.name;
        let status = client::status(&self.client).await.map_err(|e| {
            format!("failed to perform status section of the healthz check for KMS Provider {name}, error: {e}")
        })?;
        let mut errors = Vec::new();
        if status.healthz != "ok" {
            errors.push(format!("got unexpected healthz status: {}", status.healthz));
        }
        if status.version != "v2" && status.version != "v2beta1" {
            errors.push(format!("expected KMSv2 API version v2, got {}", status.version));
        }
        let invalid = match status.key_id.len() {
            0 => Some(("empty", "keyID is empty".to_owned())),
            n if n > KEY_ID_MAX => {
                Some(("too_long", format!("keyID is {n} bytes, which exceeds the max size of {KEY_ID_MAX}")))
            }
            _ => None,
        };
        if let Some((label, why)) = invalid {
            metrics().envelope.invalid_key_id(name, label);
            errors.push(format!("got invalid KMSv2 KeyID hash {:?}: {why}", hash(&status.key_id)));
        }
        if !errors.is_empty() {
            return Err(format!("kmsv2 Provider {name} is not healthy, error: {}", errors.join(", ")));
        }
        metrics().envelope.status_key_id(name, &hash(&status.key_id), &self.apiserver_id_hash);
        Ok(status.key_id)
    }

    /// After a healthy `Status`: a new seed if the key ID changed (or there is none yet), else the current one
    /// valid for another write TTL.
    async fn refresh(&self) -> Result<(), String> {
        let key_id = self.status().await?;
        let expires = SystemTime::now() + self.timing.write_ttl;
        if let Some(state) = self.state.write().as_mut().filter(|s| s.key_id == key_id) {
            state.expires = expires;
            return Ok(());
        }
        let started = Instant::now();
        let mut seed = [0u8; 32];
        rand::rng().fill_bytes(&mut seed);
        let uid = uuid::Uuid::new_v4().to_string();
        let request = api::EncryptRequest { plaintext: seed.to_vec(), uid: uid.clone() };
        let envelope = &metrics().envelope;
        let response: api::EncryptResponse = match self.client.call(api::ENCRYPT, request).await {
            Ok(r) => r,
            Err(e) => {
                envelope.data_key_generation(started.elapsed(), false);
                return Err(format!(
                    "failed to rotate DEK uid={uid:?}, useSeed=true, errGen={e}, statusKeyIDHash={:?}",
                    hash(&key_id)
                ));
            }
        };
        envelope.data_key_generation(started.elapsed(), true);
        if response.key_id != key_id {
            return Err(format!(
                "failed to rotate DEK uid={uid:?}, useSeed=true, statusKeyIDHash={:?}, encryptKeyIDHash={:?}: the \
                 key ID of Encrypt differs from Status'",
                hash(&key_id),
                hash(&response.key_id)
            ));
        }
        let object = EncryptedObject {
            encrypted_data: vec![0],
            key_id: key_id.clone(),
            encrypted_dek_source: response.ciphertext.clone(),
            annotations: response.annotations.clone(),
            encrypted_dek_source_type: EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32,
        };
        validate(&object).map_err(|e| format!("the plugin's answer to Encrypt: {e}"))?;
        let seed = Arc::new(seed);
        self.remember(&object, seed.clone());
        tracing::info!(provider = %self.name, key_id_hash = %hash(&key_id), "KMS v2: new seed for the plugin's key");
        *self.state.write() = Some(WriteState {
            key_id_hash: hash(&key_id),
            key_id,
            seed,
            encrypted_seed: response.ciphertext,
            annotations: response.annotations,
            expires,
        });
        Ok(())
    }

    fn remember(&self, object: &EncryptedObject, plain: Arc<[u8; 32]>) {
        let mut sources = self.sources.lock();
        sources.insert(source_key(object), plain);
        metrics().envelope.dek_source_cache_size(&self.name, sources.len());
    }

    /// The plain seed (or key) of a stored value: cached, or asked of the plugin.
    async fn source(&self, object: &EncryptedObject) -> Result<Arc<[u8; 32]>, ValueError> {
        if let Some(plain) = self.sources.lock().get(&source_key(object)) {
            return Ok(plain.clone());
        }
        metrics().envelope.cache_miss();
        let request = api::DecryptRequest {
            ciphertext: object.encrypted_dek_source.clone(),
            uid: uuid::Uuid::new_v4().to_string(),
            key_id: object.key_id.clone(),
            annotations: object.annotations.clone(),
        };
        let response: api::DecryptResponse = self
            .client
            .call(api::DECRYPT, request)
            .await
            .map_err(|e| ValueError::grpc(format!("failed to decrypt DEK, error: {e}"), e.status()))?;
        let plain: [u8; 32] = response.plaintext.as_slice().try_into().map_err(|_| {
            ValueError::new(format!("the plugin decrypted a DEK source to {} bytes, not 32", response.plaintext.len()))
        })?;
        let plain = Arc::new(plain);
        self.remember(object, plain.clone());
        Ok(plain)
    }
}

/// What identifies an encrypted seed or key: kube-apiserver's cache key (type, source, key ID, annotations).
fn source_key(object: &EncryptedObject) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((object.encrypted_dek_source_type as u32).to_be_bytes());
    for part in [&object.encrypted_dek_source[..], object.key_id.as_bytes()] {
        h.update((part.len() as u16).to_be_bytes());
        h.update(part);
    }
    if !object.annotations.is_empty() {
        h.update((object.annotations.len() as u32).to_be_bytes());
        for (k, v) in &object.annotations {
            h.update((k.len() as u16).to_be_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u16).to_be_bytes());
            h.update(v);
        }
    }
    h.finalize().into()
}

/// kube-apiserver's `ValidateEncryptedObject`.
fn validate(object: &EncryptedObject) -> Result<(), String> {
    if EncryptedDekSourceType::try_from(object.encrypted_dek_source_type).is_err() {
        return Err(format!("unknown encryptedDEKSourceType: {}", object.encrypted_dek_source_type));
    }
    if object.encrypted_data.is_empty() {
        return Err("encrypted data is empty".into());
    }
    // kube's messages: "failed to validate <what>: <field> is empty" or "... is N bytes, which exceeds ...".
    let bounded = |what: &str, field: &str, len: usize, max: usize| match len {
        0 => Err(format!("failed to validate {what}: {field} is empty")),
        n if n > max => {
            Err(format!("failed to validate {what}: {field} is {n} bytes, which exceeds the max size of {max}"))
        }
        _ => Ok(()),
    };
    bounded("encrypted DEK source", "encrypted DEK source", object.encrypted_dek_source.len(), DEK_SOURCE_MAX)?;
    bounded("key id", "keyID", object.key_id.len(), KEY_ID_MAX)?;
    let size: usize = object.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > ANNOTATIONS_MAX {
        return Err(format!(
            "failed to validate annotations: total size of annotations is {size}, which exceeds the max size of {ANNOTATIONS_MAX}"
        ));
    }
    Ok(())
}

/// The AES-256-GCM key of one value: HKDF-SHA256 expanded from the seed with the value's `info` (no extract step).
fn derive(seed: &[u8; 32], info: &[u8]) -> Result<Gcm, ValueError> {
    let hk = Hkdf::<Sha256>::from_prk(seed).map_err(|_| ValueError::new("invalid seed"))?;
    let mut key = [0u8; 32];
    hk.expand(info, &mut key).map_err(|_| ValueError::new("failed to derive read key from KDF"))?;
    Gcm::new(&key)
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map(|t| t.to_string()).unwrap_or_default()
}

impl Transform for KmsV2 {
    fn transform_to_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let state = self.0.state.read();
        let Some(state) = state.as_ref() else {
            return Err(ValueError::new(format!(
                "got unexpected nil transformer: KMS v2 provider {} has not had a healthy answer from its plugin yet",
                self.0.name
            )));
        };
        let now = SystemTime::now();
        if now > state.expires {
            return Err(ValueError::new(format!(
                "encryptedDEKSource with keyID hash {:?} expired at {} (current time is {})",
                hash(&state.key_id),
                rfc3339(state.expires),
                rfc3339(now)
            )));
        }
        let mut head = [0u8; INFO + NONCE];
        rand::rng().fill_bytes(&mut head);
        let (info, nonce) = head.split_at(INFO);
        let sealed = derive(&state.seed, info)?.seal(nonce, data, context)?;
        let object = EncryptedObject {
            encrypted_data: [&head[..], &sealed].concat(),
            key_id: state.key_id.clone(),
            encrypted_dek_source: state.encrypted_seed.clone(),
            annotations: state.annotations.clone(),
            encrypted_dek_source_type: EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32,
        };
        let envelope = &metrics().envelope;
        envelope.key_id_used("to_storage", &self.0.name, &state.key_id_hash, &self.0.apiserver_id_hash);
        Ok(object.encode_to_vec())
    }

    fn transform_from_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        self.read(data, context).map(|(plain, _)| plain)
    }

    /// The key a value was written with is its key ID and kind of seed: a value of another key ID, or with a plain
    /// key rather than a seed, is stale, and rewriting it moves it to the current key.
    fn read(&self, data: &[u8], context: &[u8]) -> Result<(Vec<u8>, Option<String>), ValueError> {
        let object = EncryptedObject::decode(data)
            .map_err(|e| ValueError::new(format!("failed to unmarshal encrypted object: {e}")))?;
        validate(&object).map_err(ValueError::new)?;
        let cached = self.0.sources.lock().get(&source_key(&object)).cloned();
        let plain = match cached {
            Some(p) => p,
            None => {
                // A seed not seen yet (after a restart, or another replica's): asked of the plugin.
                let (shared, object) = (self.0.clone(), object.clone());
                self.0.client.block(async move { shared.source(&object).await })?
            }
        };
        let data = &object.encrypted_data;
        let opened = match EncryptedDekSourceType::try_from(object.encrypted_dek_source_type) {
            Ok(EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed) => {
                if data.len() < INFO + NONCE + 16 {
                    return Err(ValueError::new("the stored data was shorter than the required size"));
                }
                derive(&plain, &data[..INFO])?.open(&data[INFO..INFO + NONCE], &data[INFO + NONCE..], context)?
            }
            _ => Gcm::new(&plain[..])?.transform_from_storage(data, context)?,
        };
        let key_id_hash = match self.0.state.read().as_ref().filter(|s| s.key_id == object.key_id) {
            Some(s) => s.key_id_hash.clone(),
            None => hash(&object.key_id),
        };
        let envelope = &metrics().envelope;
        envelope.key_id_used("from_storage", &self.0.name, &key_id_hash, &self.0.apiserver_id_hash);
        Ok((opened, Some(format!("{}/{}", object.key_id, object.encrypted_dek_source_type))))
    }

    fn current_key(&self) -> Option<String> {
        let state = self.0.state.read();
        let key_id = state.as_ref().map_or("", |s| s.key_id.as_str());
        Some(format!("{key_id}/{}", EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32))
    }

    fn healthz(&self) -> Option<BoxFuture<'static, Result<(), String>>> {
        Some(KmsV2::healthz(self))
    }

    fn ready(&self) -> bool {
        self.0.state.read().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_the_seed_reads_back_only_under_its_key() {
        let seed = [7u8; 32];
        let (info, nonce) = ([1u8; INFO], [2u8; NONCE]);
        let sealed = derive(&seed, &info).unwrap().seal(&nonce, b"{}", b"/widgets/a/b").unwrap();
        assert_eq!(derive(&seed, &info).unwrap().open(&nonce, &sealed, b"/widgets/a/b").unwrap(), b"{}");
        assert!(derive(&seed, &[3u8; INFO]).unwrap().open(&nonce, &sealed, b"/widgets/a/b").is_err());
        assert!(derive(&seed, &info).unwrap().open(&nonce, &sealed, b"/widgets/a/c").is_err());
    }

    #[test]
    fn encrypted_objects_are_checked_as_kube_checks_them() {
        let ok = EncryptedObject {
            encrypted_data: vec![1],
            key_id: "1".into(),
            encrypted_dek_source: vec![2],
            annotations: Default::default(),
            encrypted_dek_source_type: 1,
        };
        assert_eq!(validate(&ok), Ok(()));
        let bad = |f: fn(&mut EncryptedObject)| {
            let mut o = ok.clone();
            f(&mut o);
            validate(&o).unwrap_err()
        };
        assert_eq!(bad(|o| o.key_id.clear()), "failed to validate key id: keyID is empty");
        assert_eq!(bad(|o| o.encrypted_dek_source_type = 7), "unknown encryptedDEKSourceType: 7");
        assert!(bad(|o| o.encrypted_dek_source = vec![0; 1025]).ends_with("exceeds the max size of 1024"));
        assert_ne!(source_key(&ok), source_key(&EncryptedObject { key_id: "2".into(), ..ok.clone() }));
    }

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(socket_path("unix:///run/kms.sock").unwrap(), "/run/kms.sock");
        assert_eq!(socket_path("unix:///@kms").unwrap(), "\0kms");
        assert!(socket_path("tcp://1.2.3.4:5").unwrap_err().contains("unsupported scheme \"tcp\""));
    }
}
