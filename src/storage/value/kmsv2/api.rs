//! The messages of the `k8s.io/kms` v2 plugin API (`apis/v2/api.proto`, package `v2`) and of the envelope
//! kube-apiserver stores (`envelope/kmsv2/v2/api.proto`), field for field.

use std::collections::BTreeMap;

/// The gRPC service's methods.
pub const STATUS: &str = "/v2.KeyManagementService/Status";
pub const DECRYPT: &str = "/v2.KeyManagementService/Decrypt";
pub const ENCRYPT: &str = "/v2.KeyManagementService/Encrypt";
pub const SERVICE: &str = "v2.KeyManagementService";

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    /// `v2` (or `v2beta1` from older plugins).
    #[prost(string, tag = "1")]
    pub version: String,
    /// `ok` when healthy.
    #[prost(string, tag = "2")]
    pub healthz: String,
    /// The key the plugin encrypts with now.
    #[prost(string, tag = "3")]
    pub key_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DecryptRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub ciphertext: Vec<u8>,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub key_id: String,
    #[prost(btree_map = "string, bytes", tag = "4")]
    pub annotations: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DecryptResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub plaintext: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EncryptRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub plaintext: Vec<u8>,
    #[prost(string, tag = "2")]
    pub uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EncryptResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub ciphertext: Vec<u8>,
    #[prost(string, tag = "2")]
    pub key_id: String,
    #[prost(btree_map = "string, bytes", tag = "3")]
    pub annotations: BTreeMap<String, Vec<u8>>,
}

/// How a stored value's data key is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum EncryptedDekSourceType {
    /// The plugin encrypted the AES-GCM key itself (kube-apiserver 1.27, or with KMSv2KDF off).
    AesGcmKey = 0,
    /// The plugin encrypted a seed; each value's key is derived from it with HKDF-SHA256 (1.29+'s default).
    HkdfSha256XnonceAesGcmSeed = 1,
}

/// What follows `k8s:enc:kms:v2:<name>:` in a stored value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EncryptedObject {
    #[prost(bytes = "vec", tag = "1")]
    pub encrypted_data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub key_id: String,
    #[prost(bytes = "vec", tag = "3")]
    pub encrypted_dek_source: Vec<u8>,
    #[prost(btree_map = "string, bytes", tag = "4")]
    pub annotations: BTreeMap<String, Vec<u8>>,
    #[prost(enumeration = "EncryptedDekSourceType", tag = "5")]
    pub encrypted_dek_source_type: i32,
}
