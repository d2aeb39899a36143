//! The cluster's word on whom to trust: `kube-system/extension-apiserver-authentication`, which kube-apiserver
//! keeps filled with its client CA and front-proxy settings. Read at start and watched, so a CA rotation or a new
//! allowed name needs no restart. Flags, where given, win over it (as in k8s.io/apiserver).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::trust::{DynamicTrust, RequestHeader, Trust};
use crate::apiserver::tls::ClientCa;

pub const CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

fn string_list(data: &BTreeMap<String, String>, key: &str) -> Result<Vec<String>, String> {
    match data.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|e| format!("{key}: {e}")),
    }
}

fn origin(key: &str) -> std::path::PathBuf {
    Path::new("configmap").join(CONFIGMAP_NAMESPACE).join(CONFIGMAP_NAME).join(key)
}

fn request_header_from(data: &BTreeMap<String, String>, pem: &str) -> Result<RequestHeader, String> {
    let ca = ClientCa::from_pem(pem.as_bytes(), &origin("requestheader-client-ca-file")).map_err(|e| e.to_string())?;
    Ok(RequestHeader::new(
        ca,
        string_list(data, "requestheader-allowed-names")?,
        &string_list(data, "requestheader-username-headers")?,
        &string_list(data, "requestheader-group-headers")?,
        &string_list(data, "requestheader-extra-headers-prefix")?,
    )
    // Written by kube-apiserver 1.32+ (`[]` unless it runs with --requestheader-uid-headers); absent before.
    .with_uid_headers(&string_list(data, "requestheader-uid-headers")?))
}

/// The trust a ConfigMap's data describes. A key that does not parse keeps what `previous` had for it.
pub fn trust_from_configmap(data: &BTreeMap<String, String>, previous: &Trust) -> (Trust, Vec<String>) {
    let mut errors = Vec::new();
    let client_ca = match data.get("client-ca-file").filter(|s| !s.trim().is_empty()) {
        None => None,
        Some(pem) => match ClientCa::from_pem(pem.as_bytes(), &origin("client-ca-file")) {
            Ok(ca) => Some(ca),
            Err(e) => {
                errors.push(e.to_string());
                previous.client_ca.clone()
            }
        },
    };
    let request_header = match data.get("requestheader-client-ca-file").filter(|s| !s.trim().is_empty()) {
        None => None,
        Some(pem) => match request_header_from(data, pem) {
            Ok(rh) => Some(rh),
            Err(e) => {
                errors.push(e);
                previous.request_header.clone()
            }
        },
    };
    (Trust { request_header, client_ca }, errors)
}

/// The trust in force, combined from its sources: what flags name (which wins) and the cluster's ConfigMap.
pub struct TrustSources {
    trust: Arc<DynamicTrust>,
    /// (from flags, from the ConfigMap)
    parts: Mutex<(Trust, Trust)>,
}

impl TrustSources {
    pub fn new(trust: Arc<DynamicTrust>, flags: Trust) -> Arc<Self> {
        let sources = Arc::new(Self { trust, parts: Mutex::new((flags, Trust::default())) });
        sources.publish(&sources.parts.lock());
        sources
    }

    fn publish(&self, (flags, cluster): &(Trust, Trust)) {
        self.trust.set(Trust {
            request_header: flags.request_header.clone().or_else(|| cluster.request_header.clone()),
            client_ca: flags.client_ca.clone().or_else(|| cluster.client_ca.clone()),
        });
    }

    fn set_cluster(&self, data: Option<&BTreeMap<String, String>>) {
        let empty = BTreeMap::new();
        let mut parts = self.parts.lock();
        let (from_cluster, errors) = trust_from_configmap(data.unwrap_or(&empty), &parts.1);
        for e in &errors {
            tracing::error!(error = %e, "ignoring an unusable entry of {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}");
        }
        tracing::info!(
            front_proxy = from_cluster.request_header.is_some(),
            allowed_names = ?from_cluster.request_header.as_ref().map(|r| r.allowed_names.clone()).unwrap_or_default(),
            client_ca = from_cluster.client_ca.is_some(),
            "authentication trust read from {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}"
        );
        parts.1 = from_cluster;
        self.publish(&parts);
        self.trust.mark_loaded();
    }

    fn set_flag_ca(&self, which: FlagCa, ca: ClientCa) {
        let mut parts = self.parts.lock();
        match which {
            FlagCa::RequestHeader => {
                if let Some(rh) = parts.0.request_header.as_mut() {
                    rh.ca = ca;
                }
            }
            FlagCa::Client => parts.0.client_ca = Some(ca),
        }
        self.publish(&parts);
    }
}

#[derive(Debug, Clone, Copy)]
enum FlagCa {
    RequestHeader,
    Client,
}

/// Re-reads the CA files named by `--requestheader-client-ca-file` and `--client-ca-file` every `interval`, so a
/// rotated Secret or ConfigMap volume is picked up without a restart. A file that does not parse keeps the old CA.
pub fn follow_flag_files(
    sources: Arc<TrustSources>,
    request_header_ca: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    interval: Duration,
    stop: CancellationToken,
) {
    let files: Vec<(FlagCa, PathBuf)> = [(FlagCa::RequestHeader, request_header_ca), (FlagCa::Client, client_ca)]
        .into_iter()
        .filter_map(|(which, path)| path.map(|p| (which, p)))
        .collect();
    if files.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut last: Vec<Option<Vec<u8>>> = files.iter().map(|(_, p)| std::fs::read(p).ok()).collect();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            for ((which, path), seen) in files.iter().zip(last.iter_mut()) {
                let Ok(now) = tokio::fs::read(path).await else { continue };
                if seen.as_deref() == Some(now.as_slice()) {
                    continue;
                }
                *seen = Some(now.clone());
                match ClientCa::from_pem(&now, path) {
                    Ok(ca) => {
                        tracing::info!(file = %path.display(), "CA file changed: trusting its new contents");
                        sources.set_flag_ca(*which, ca);
                    }
                    Err(e) => tracing::error!(error = %e, "CA file changed but is unusable; keeping the previous CA"),
                }
            }
        }
    });
}

/// Reads the ConfigMap once, then follows it until `stop`. The first read's error is returned for the caller to
/// judge; the following goes on either way, so a ConfigMap that becomes readable later is picked up.
pub async fn follow_cluster_trust(
    client: kube::Client,
    sources: Arc<TrustSources>,
    stop: CancellationToken,
) -> Result<(), kube::Error> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, CONFIGMAP_NAMESPACE);
    let first = api.get_opt(CONFIGMAP_NAME).await;
    match &first {
        Ok(Some(cm)) => sources.set_cluster(cm.data.as_ref()),
        Ok(None) => {
            tracing::warn!("{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} does not exist (yet): no front proxy or client CA from the cluster");
            sources.set_cluster(None);
        }
        Err(_) => {}
    }
    let cfg = watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP_NAME}"));
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, cfg).default_backoff().boxed();
        // A re-list that finds nothing means the ConfigMap was deleted while the watch was down.
        let mut listed_any = false;
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.next() => e,
            };
            match event {
                None => return,
                Some(Ok(Event::Init)) => listed_any = false,
                Some(Ok(Event::InitApply(cm))) => {
                    listed_any = true;
                    sources.set_cluster(cm.data.as_ref());
                }
                Some(Ok(Event::InitDone)) if !listed_any => sources.set_cluster(None),
                Some(Ok(Event::InitDone)) => {}
                Some(Ok(Event::Apply(cm))) => sources.set_cluster(cm.data.as_ref()),
                Some(Ok(Event::Delete(_))) => sources.set_cluster(None),
                Some(Err(e)) => tracing::warn!(error = %e, "watching {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}"),
            }
        }
    });
    first.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::tls::make_ca;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[tokio::test]
    async fn a_rewritten_ca_file_is_trusted_without_a_restart() {
        use crate::apiserver::auth::RequestHeader;
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("front-proxy-ca.crt");
        let (old_pem, old_key, old_params) = make_ca("old").unwrap();
        let (new_pem, new_key, new_params) = make_ca("new").unwrap();
        std::fs::write(&path, &old_pem).unwrap();
        let rh = RequestHeader::new(ClientCa::from_file(&path).unwrap(), vec![], &["X-Remote-User".into()], &[], &[]);
        let trust = Arc::new(DynamicTrust::default());
        let sources = TrustSources::new(trust.clone(), Trust { request_header: Some(rh), client_ca: None });
        let stop = CancellationToken::new();
        follow_flag_files(sources, Some(path.clone()), None, Duration::from_millis(20), stop.clone());

        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, "front-proxy-client");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let old_leaf = p.signed_by(&KeyPair::generate().unwrap(), &Issuer::new(old_params, &old_key)).unwrap();
        let old_chain = [old_leaf.der().clone()];
        let leaf = p.signed_by(&KeyPair::generate().unwrap(), &Issuer::new(new_params, &new_key)).unwrap();
        let chain = [leaf.der().clone()];
        let verifies = || trust.get().1.request_header.as_ref().unwrap().ca.verify(&chain).is_some();
        let verifies_old = || trust.get().1.request_header.as_ref().unwrap().ca.verify(&old_chain).is_some();
        assert!(!verifies());
        std::fs::write(&path, "garbage").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(verifies_old() && !verifies(), "an unusable file kept the previous CA, and only it");
        std::fs::write(&path, format!("{old_pem}{new_pem}")).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !verifies() {
            assert!(std::time::Instant::now() < deadline, "the new CA was never picked up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
    }

    #[test]
    fn trust_counts_as_loaded_once_the_configmap_was_read() {
        let trust = Arc::new(DynamicTrust::default());
        let sources = TrustSources::new(trust.clone(), Trust::default());
        assert!(!trust.is_loaded(), "flags that leave anchors to the cluster are not enough");
        sources.set_cluster(None);
        assert!(trust.is_loaded(), "a ConfigMap that does not exist was read too: nothing to trust from it");
    }

    #[test]
    fn reads_kube_apiserver_keys_and_keeps_the_previous_value_of_a_broken_one() {
        let (ca, _, _) = make_ca("front-proxy-ca").unwrap();
        let (cluster, _, _) = make_ca("cluster-ca").unwrap();
        let good = data(&[
            ("client-ca-file", &cluster),
            ("requestheader-client-ca-file", &ca),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
        ]);
        let (t, errors) = trust_from_configmap(&good, &Trust::default());
        assert!(errors.is_empty(), "{errors:?}");
        let rh = t.request_header.as_ref().unwrap();
        assert_eq!(rh.allowed_names, vec!["front-proxy-client"]);
        assert_eq!(rh.username_headers, vec!["x-remote-user"], "header names are kept lowercase");
        assert_eq!(rh.uid_headers, vec!["x-remote-uid"]);
        let mut older = good.clone();
        older.remove("requestheader-uid-headers");
        let (t0, errors) = trust_from_configmap(&older, &Trust::default());
        assert!(errors.is_empty() && t0.request_header.unwrap().uid_headers.is_empty(), "kube-apiserver before 1.32");
        assert!(t.client_ca.is_some());

        let mut broken = good.clone();
        broken.insert("requestheader-allowed-names".into(), "not json".into());
        broken.insert("client-ca-file".into(), "no pem here".into());
        let (t2, errors) = trust_from_configmap(&broken, &t);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(t2.request_header.unwrap().allowed_names, vec!["front-proxy-client"]);
        assert!(t2.client_ca.is_some());

        let (t3, errors) = trust_from_configmap(&BTreeMap::new(), &t);
        assert!(errors.is_empty() && t3.request_header.is_none() && t3.client_ca.is_none());
    }
}
