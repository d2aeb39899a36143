//! Values transformed at rest and the encryption configuration, as k8s.io/apiserver's `storage/value`,
//! `envelope/metrics` and encryption configuration controller count them.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::metrics::{registered, Families, HistogramFamily};
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransformationLabels {
    /// `from_storage` or `to_storage`.
    pub transformation_type: String,
    pub transformer_prefix: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransformationStatusLabels {
    pub resource: String,
    pub transformation_type: String,
    pub transformer_prefix: String,
    /// `OK`, a KMS plugin's gRPC code's name, or `unknown-non-grpc`, as k8s.io/apiserver reports it.
    pub status: String,
}

/// Values transformed at rest (encryption), as k8s.io/apiserver's `storage/value` counts them.
#[derive(Debug)]
pub(crate) struct Transformations {
    pub operations: Family<TransformationStatusLabels, Counter>,
    pub duration: HistogramFamily<TransformationLabels>,
}

impl Transformations {
    fn new() -> Self {
        // k8s.io/apiserver's buckets: in-process ciphers take microseconds, a KMS milliseconds or more.
        let buckets: fn() -> Histogram = || Histogram::new(exponential_buckets(5e-6, 2., 25));
        Self { operations: Family::default(), duration: Family::new_with_constructor(buckets) }
    }

    /// One transformation; its duration counts only when it succeeded, as upstream's.
    pub fn observe(&self, resource: &str, direction: &str, prefix: &str, took: Duration, status: &str) {
        let (transformation_type, transformer_prefix) = (direction.to_owned(), prefix.to_owned());
        let labels = TransformationLabels { transformation_type, transformer_prefix };
        if status == "OK" {
            self.duration.get_or_create(&labels).observe(took.as_secs_f64());
        }
        let TransformationLabels { transformation_type, transformer_prefix } = labels;
        let (resource, status) = (resource.to_owned(), status.to_owned());
        let labels = TransformationStatusLabels { resource, transformation_type, transformer_prefix, status };
        self.operations.get_or_create(&labels).inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReloadLabels {
    /// `success` or `failure`.
    pub status: String,
    pub apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ConfigInfoLabels {
    pub apiserver_id_hash: String,
    /// `sha256:<hex>` of the file's bytes.
    pub hash: String,
}

/// k8s.io/apiserver's encryption configuration controller metrics.
#[derive(Debug, Default)]
pub(crate) struct EncryptionConfigMetrics {
    pub reloads: Family<ReloadLabels, Counter>,
    pub reload_last_timestamp: Family<ReloadLabels, TimestampGauge>,
    pub last_config_info: Family<ConfigInfoLabels, Gauge>,
}

impl EncryptionConfigMetrics {
    pub fn reloaded(&self, apiserver_id_hash: &str, ok: bool) {
        let status = if ok { "success" } else { "failure" }.to_owned();
        let labels = ReloadLabels { status, apiserver_id_hash: apiserver_id_hash.to_owned() };
        self.reloads.get_or_create(&labels).inc();
        self.reload_last_timestamp.get_or_create(&labels).set(unix_now());
    }

    /// The configuration now in use: its series alone is 1.
    pub fn loaded(&self, apiserver_id_hash: &str, hash: &str) {
        self.last_config_info.clear();
        let labels = ConfigInfoLabels { apiserver_id_hash: apiserver_id_hash.to_owned(), hash: hash.to_owned() };
        self.last_config_info.get_or_create(&labels).set(1);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KmsOperationLabels {
    pub provider_name: String,
    /// The full gRPC method, `/v2.KeyManagementService/Encrypt`.
    pub method_name: String,
    pub grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyIdLabels {
    pub transformation_type: String,
    pub provider_name: String,
    pub key_id_hash: String,
    pub apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusKeyIdLabels {
    pub provider_name: String,
    pub key_id_hash: String,
    pub apiserver_id_hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InvalidKeyIdLabels {
    pub provider_name: String,
    /// `empty` or `too_long`.
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProviderLabel {
    pub provider_name: String,
}

type TimestampGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// KMS v2 envelope encryption, as k8s.io/apiserver's `envelope/metrics` and `storage/value` count it.
#[derive(Debug)]
pub(crate) struct EnvelopeMetrics {
    pub kms_operations_latency: HistogramFamily<KmsOperationLabels>,
    pub key_id_hash: Family<KeyIdLabels, Counter>,
    pub key_id_hash_last_timestamp: Family<KeyIdLabels, TimestampGauge>,
    pub key_id_hash_status_last_timestamp: Family<StatusKeyIdLabels, TimestampGauge>,
    pub invalid_key_id_from_status: Family<InvalidKeyIdLabels, Counter>,
    pub dek_source_cache_size: Family<ProviderLabel, Gauge>,
    pub cache_misses: Counter,
    pub data_key_generation_duration: Histogram,
    pub data_key_generation_failures: Counter,
}

impl EnvelopeMetrics {
    fn new() -> Self {
        let latency: fn() -> Histogram = || Histogram::new(exponential_buckets(0.0001, 2., 20));
        Self {
            kms_operations_latency: Family::new_with_constructor(latency),
            key_id_hash: Family::default(),
            key_id_hash_last_timestamp: Family::default(),
            key_id_hash_status_last_timestamp: Family::default(),
            invalid_key_id_from_status: Family::default(),
            dek_source_cache_size: Family::default(),
            cache_misses: Counter::default(),
            data_key_generation_duration: Histogram::new(exponential_buckets(5e-6, 2., 14)),
            data_key_generation_failures: Counter::default(),
        }
    }

    pub fn kms_operation(&self, provider: &str, method: &str, code: &str, took: Duration) {
        let labels = KmsOperationLabels {
            provider_name: provider.to_owned(),
            method_name: method.to_owned(),
            grpc_status_code: code.to_owned(),
        };
        self.kms_operations_latency.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn key_id_used(&self, direction: &str, provider: &str, key_id_hash: &str, apiserver_id_hash: &str) {
        let labels = KeyIdLabels {
            transformation_type: direction.to_owned(),
            provider_name: provider.to_owned(),
            key_id_hash: key_id_hash.to_owned(),
            apiserver_id_hash: apiserver_id_hash.to_owned(),
        };
        self.key_id_hash.get_or_create(&labels).inc();
        self.key_id_hash_last_timestamp.get_or_create(&labels).set(unix_now());
    }

    pub fn status_key_id(&self, provider: &str, key_id_hash: &str, apiserver_id_hash: &str) {
        let labels = StatusKeyIdLabels {
            provider_name: provider.to_owned(),
            key_id_hash: key_id_hash.to_owned(),
            apiserver_id_hash: apiserver_id_hash.to_owned(),
        };
        self.key_id_hash_status_last_timestamp.get_or_create(&labels).set(unix_now());
    }

    pub fn invalid_key_id(&self, provider: &str, error: &str) {
        let labels = InvalidKeyIdLabels { provider_name: provider.to_owned(), error: error.to_owned() };
        self.invalid_key_id_from_status.get_or_create(&labels).inc();
    }

    pub fn dek_source_cache_size(&self, provider: &str, size: usize) {
        self.dek_source_cache_size
            .get_or_create(&ProviderLabel { provider_name: provider.to_owned() })
            .set(size as i64);
    }

    pub fn cache_miss(&self) {
        self.cache_misses.inc();
    }

    pub fn data_key_generation(&self, took: Duration, ok: bool) {
        match ok {
            true => self.data_key_generation_duration.observe(took.as_secs_f64()),
            false => drop(self.data_key_generation_failures.inc()),
        }
    }
}

#[derive(Debug)]
pub(crate) struct EncryptionMetrics {
    pub transformation: Transformations,
    pub config: EncryptionConfigMetrics,
    pub envelope: EnvelopeMetrics,
}

static METRICS: LazyLock<EncryptionMetrics> = LazyLock::new(|| {
    registered(EncryptionMetrics {
        transformation: Transformations::new(),
        config: EncryptionConfigMetrics::default(),
        envelope: EnvelopeMetrics::new(),
    })
});

pub(crate) fn metrics() -> &'static EncryptionMetrics {
    &METRICS
}

impl Families for EncryptionMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "apiserver_storage_transformation_operations",
            "Total number of transformations.",
            self.transformation.operations.clone(),
        );
        r.register(
            "apiserver_storage_transformation_duration_seconds",
            "Latencies in seconds of value transformation operations.",
            self.transformation.duration.clone(),
        );
        let envelope = &self.envelope;
        r.register(
            "apiserver_envelope_encryption_kms_operations_latency_seconds",
            "KMS operation duration with gRPC error code status total.",
            envelope.kms_operations_latency.clone(),
        );
        r.register(
            "apiserver_envelope_encryption_key_id_hash",
            "Number of times a keyID is used split by transformation type, provider, and apiserver identity.",
            envelope.key_id_hash.clone(),
        );
        r.register(
            "apiserver_envelope_encryption_key_id_hash_last_timestamp_seconds",
            "The last time in seconds when a keyID was used.",
            envelope.key_id_hash_last_timestamp.clone(),
        );
        r.register(
            "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds",
            "The last time in seconds when a keyID was returned by the Status RPC call.",
            envelope.key_id_hash_status_last_timestamp.clone(),
        );
        r.register(
            "apiserver_envelope_encryption_invalid_key_id_from_status",
            "Number of times an invalid keyID is returned by the Status RPC call split by error.",
            envelope.invalid_key_id_from_status.clone(),
        );
        r.register(
            "apiserver_envelope_encryption_dek_source_cache_size",
            "Number of records in data encryption key (DEK) source cache.",
            envelope.dek_source_cache_size.clone(),
        );
        r.register(
            "apiserver_storage_envelope_transformation_cache_misses",
            "Total number of cache misses while accessing key decryption key(KEK).",
            envelope.cache_misses.clone(),
        );
        r.register(
            "apiserver_storage_data_key_generation_duration_seconds",
            "Latencies in seconds of data encryption key(DEK) generation operations.",
            envelope.data_key_generation_duration.clone(),
        );
        r.register(
            "apiserver_storage_data_key_generation_failures",
            "Total number of failed data encryption key(DEK) generation operations.",
            envelope.data_key_generation_failures.clone(),
        );
        r.register(
            "apiserver_encryption_config_controller_automatic_reloads",
            "Total number of reload successes and failures of encryption configuration split by apiserver identity.",
            self.config.reloads.clone(),
        );
        r.register(
            "apiserver_encryption_config_controller_automatic_reload_last_timestamp_seconds",
            "Timestamp of the last successful or failed automatic reload of encryption configuration split by \
             apiserver identity.",
            self.config.reload_last_timestamp.clone(),
        );
        r.register(
            "apiserver_encryption_config_controller_last_config_info",
            "Information about the last applied encryption configuration with hash as label, split by apiserver \
             identity.",
            self.config.last_config_info.clone(),
        );
    }
}
