//! The cluster's word on whom to trust: `kube-system/extension-apiserver-authentication`, which kube-apiserver
//! keeps filled with its client CA and front-proxy settings. Read at start and watched, so a CA rotation or a new
//! allowed name needs no restart. Flags, where given, win over it (as in k8s.io/apiserver).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio_util::sync::CancellationToken;

use super::authn::{DynamicTrust, RequestHeader, Trust};
use super::tls::ClientCa;

pub const CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// Creates a review (TokenReview, SubjectAccessReview) and returns the answer: three tries, each within `timeout`,
/// retrying what may pass (no answer, 429, 5xx); the error says why for the log and the Status.
pub async fn review<K>(api: &kube::Api<K>, review: &K, timeout: Duration) -> Result<K, String>
where
    K: kube::Resource + Clone + Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= 3;
        match tokio::time::timeout(timeout, api.create(&PostParams::default(), review)).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(kube::Error::Api(e))) if (e.code < 500 && e.code != 429) || last => {
                return Err(format!("refused ({}): {}", e.code, e.message))
            }
            Ok(Err(e)) if last => return Err(e.to_string()),
            Err(_) if last => return Err("the main API server did not answer".into()),
            _ => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}

/// What flags fixed; the rest comes from the ConfigMap.
#[derive(Clone, Default)]
pub struct TrustOverrides {
    pub request_header: Option<RequestHeader>,
    pub client_ca: Option<ClientCa>,
}

impl TrustOverrides {
    pub fn fixes_everything(&self) -> bool {
        self.request_header.is_some() && self.client_ca.is_some()
    }
}

fn string_list(data: &BTreeMap<String, String>, key: &str) -> Result<Vec<String>, String> {
    match data.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|e| format!("{key}: {e}")),
    }
}

fn origin(key: &str) -> std::path::PathBuf {
    Path::new("configmap").join(CONFIGMAP_NAMESPACE).join(CONFIGMAP_NAME).join(key)
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
        Some(pem) => {
            let parsed = (|| -> Result<RequestHeader, String> {
                let ca = ClientCa::from_pem(pem.as_bytes(), &origin("requestheader-client-ca-file"))
                    .map_err(|e| e.to_string())?;
                Ok(RequestHeader {
                    ca,
                    allowed_names: string_list(data, "requestheader-allowed-names")?,
                    username_headers: string_list(data, "requestheader-username-headers")?,
                    group_headers: string_list(data, "requestheader-group-headers")?,
                    extra_headers_prefixes: string_list(data, "requestheader-extra-headers-prefix")?,
                })
            })();
            match parsed {
                Ok(rh) => Some(rh),
                Err(e) => {
                    errors.push(e);
                    previous.request_header.clone()
                }
            }
        }
    };
    (Trust { request_header, client_ca }, errors)
}

fn apply(trust: &DynamicTrust, overrides: &TrustOverrides, data: Option<&BTreeMap<String, String>>) {
    let empty = BTreeMap::new();
    let (_, previous) = trust.get();
    let (from_cluster, errors) = trust_from_configmap(data.unwrap_or(&empty), &previous);
    for e in &errors {
        tracing::error!(error = %e, "ignoring an unusable entry of {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}");
    }
    let next = Trust {
        request_header: overrides.request_header.clone().or(from_cluster.request_header),
        client_ca: overrides.client_ca.clone().or(from_cluster.client_ca),
    };
    tracing::info!(
        front_proxy = next.request_header.is_some(),
        allowed_names = ?next.request_header.as_ref().map(|r| r.allowed_names.clone()).unwrap_or_default(),
        client_ca = next.client_ca.is_some(),
        "authentication trust updated from {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}"
    );
    trust.set(next);
}

/// Reads the ConfigMap once, then follows it until `stop`. The first read's error is returned for the caller to
/// judge; the following goes on either way, so a ConfigMap that becomes readable later is picked up.
pub async fn follow_cluster_trust(
    client: kube::Client,
    trust: Arc<DynamicTrust>,
    overrides: TrustOverrides,
    stop: CancellationToken,
) -> Result<(), kube::Error> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, CONFIGMAP_NAMESPACE);
    let first = api.get_opt(CONFIGMAP_NAME).await;
    match &first {
        Ok(Some(cm)) => apply(&trust, &overrides, cm.data.as_ref()),
        Ok(None) => {
            tracing::warn!("{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} does not exist (yet): no front proxy or client CA from the cluster");
            apply(&trust, &overrides, None);
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
                    apply(&trust, &overrides, cm.data.as_ref());
                }
                Some(Ok(Event::InitDone)) if !listed_any => apply(&trust, &overrides, None),
                Some(Ok(Event::InitDone)) => {}
                Some(Ok(Event::Apply(cm))) => apply(&trust, &overrides, cm.data.as_ref()),
                Some(Ok(Event::Delete(_))) => apply(&trust, &overrides, None),
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
        ]);
        let (t, errors) = trust_from_configmap(&good, &Trust::default());
        assert!(errors.is_empty(), "{errors:?}");
        let rh = t.request_header.as_ref().unwrap();
        assert_eq!(rh.allowed_names, vec!["front-proxy-client"]);
        assert_eq!(rh.username_headers, vec!["X-Remote-User"]);
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
