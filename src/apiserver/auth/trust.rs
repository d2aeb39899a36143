//! The trust anchors authentication judges certificates against: the front proxy's CA and names, and the cluster's
//! client CA. They come from flags or the cluster's ConfigMap (see `delegation`) and can change while serving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::apiserver::tls::ClientCa;

/// Front-proxy settings (`--requestheader-*` or the ConfigMap's `requestheader-*` keys).
#[derive(Clone)]
pub struct RequestHeader {
    pub ca: ClientCa,
    pub allowed_names: Vec<String>,
    /// Header names, lowercased once here: `http` keeps names lowercase, so each request compares as is.
    pub(crate) username_headers: Vec<String>,
    /// `--requestheader-uid-headers` (k8s.io/apiserver 1.32+): none unless configured, as upstream.
    pub(crate) uid_headers: Vec<String>,
    pub(crate) group_headers: Vec<String>,
    pub(crate) extra_headers_prefixes: Vec<String>,
}

impl RequestHeader {
    pub fn new(
        ca: ClientCa,
        allowed_names: Vec<String>,
        username_headers: &[String],
        group_headers: &[String],
        extra_headers_prefixes: &[String],
    ) -> Self {
        let lower = |names: &[String]| names.iter().map(|n| n.to_ascii_lowercase()).collect();
        Self {
            ca,
            allowed_names,
            username_headers: lower(username_headers),
            uid_headers: Vec::new(),
            group_headers: lower(group_headers),
            extra_headers_prefixes: lower(extra_headers_prefixes),
        }
    }

    /// The headers carrying the user's UID, first non-empty wins.
    pub fn with_uid_headers(mut self, uid_headers: &[String]) -> Self {
        self.uid_headers = uid_headers.iter().map(|n| n.to_ascii_lowercase()).collect();
        self
    }
}

/// The trust anchors in force.
#[derive(Clone, Default)]
pub struct Trust {
    pub request_header: Option<RequestHeader>,
    pub client_ca: Option<ClientCa>,
}

/// The current [`Trust`], replaceable while serving; the generation tells connections to judge their certificate
/// again. Both live under one lock so a reader never pairs a new generation with old anchors.
pub struct DynamicTrust {
    current: RwLock<(u64, Arc<Trust>)>,
    /// Every source the anchors come from has been read once (the `delegation` readiness check).
    loaded: AtomicBool,
}

impl Default for DynamicTrust {
    fn default() -> Self {
        Self::new(Trust::default())
    }
}

impl DynamicTrust {
    pub fn new(trust: Trust) -> Self {
        Self { current: RwLock::new((1, Arc::new(trust))), loaded: AtomicBool::new(false) }
    }

    /// Marks the anchors complete: the flags alone, or the cluster's ConfigMap read at least once.
    pub fn mark_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    pub fn set(&self, trust: Trust) {
        let mut current = self.current.write();
        *current = (current.0 + 1, Arc::new(trust));
    }

    pub fn get(&self) -> (u64, Arc<Trust>) {
        let current = self.current.read();
        (current.0, current.1.clone())
    }
}
