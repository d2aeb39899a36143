//! Admission configuration from files (`staticManifestsDir`, KEP-5793), read as k8s.io/apiserver's
//! `admission/plugin/manifest` reads it: the directory's direct children ending in `.yaml`, `.yml` or `.json`, in
//! name order, empty files skipped, YAML split into documents, a `v1` `List` (or a typed list) into its items;
//! each object decoded strictly. The plugin checks what it gets ([`crate::admission::policy::manifests`],
//! [`crate::admission::webhook::manifests`]) and keeps the last good set when a reload fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// The suffix every manifest object's name ends with, so it can never collide with an API object.
pub const STATIC_SUFFIX: &str = ".static.k8s.io";

/// The audit annotations naming the manifest policies evaluated for a request and the manifest webhooks called
/// for it, comma-separated: an audit reader sees which of a request's decisions no API object explains.
pub const MANIFEST_POLICIES_ANNOTATION: &str = "source.admission.k8s.io/manifest-policies";
pub const MANIFEST_WEBHOOKS_ANNOTATION: &str = "source.admission.k8s.io/manifest-webhooks";

/// Adds `name` to the list of `annotation` in `out`, once.
pub(crate) fn record_source(out: &mut super::Outcome, annotation: &str, name: &str) {
    let list = out.audit_annotations.entry(annotation.to_owned()).or_default();
    if !list.split(',').any(|n| n == name) {
        if !list.is_empty() {
            list.push(',');
        }
        list.push_str(name);
    }
}

/// How often a directory is read again for changes (kube watches with fsnotify and polls every minute; a poll
/// alone also follows a ConfigMap volume's symlink swap).
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// One object of a manifest file: its file, and the document as read.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: PathBuf,
    pub api_version: String,
    pub kind: String,
    pub value: serde_yaml::Value,
}

/// A directory's objects, and the hash of its files' contents (`sha256:<hex>`, as kube's
/// `last_config_info` shows it).
#[derive(Debug, Clone)]
pub struct Read {
    pub documents: Vec<Document>,
    pub hash: String,
}

/// `staticManifestsDir`'s checks (`manifest.ValidateStaticManifestsDir`), worded as kube's field errors.
pub fn validate_dir(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    if !dir.is_absolute() {
        return Err(format!("staticManifestsDir: Invalid value: {shown:?}: must be an absolute file path"));
    }
    match std::fs::metadata(dir) {
        Err(e) => Err(format!("staticManifestsDir: Invalid value: {shown:?}: unable to read: {e}")),
        Ok(m) if !m.is_dir() => Err(format!("staticManifestsDir: Invalid value: {shown:?}: must be a directory")),
        Ok(_) => Ok(()),
    }
}

/// The files a directory's objects come from, in name order.
fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("failed to read manifest directory {:?}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("failed to read manifest directory {:?}: {e}", dir.display()))?;
        let path = entry.path();
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        // Symlinks are followed (a ConfigMap volume's files are links); directories are not descended into.
        if matches!(ext.as_deref(), Some("yaml" | "yml" | "json")) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads every object of `dir`.
pub fn read(dir: &Path) -> Result<Read, String> {
    let mut hasher = Sha256::new();
    let mut any = false;
    let mut documents = Vec::new();
    for file in files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| format!("failed to read file {:?}: {e}", file.display()))?;
        if bytes.is_empty() {
            continue;
        }
        hasher.update(&bytes);
        hasher.update([0u8]);
        any = true;
        let text = String::from_utf8(bytes).map_err(|e| format!("error loading {}: {e}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde::Deserialize::deserialize(doc).map_err(|e: serde_yaml::Error| {
                format!("failed to split YAML documents in file {:?}: {e}", file.display())
            })?;
            push(&file, value, &mut documents, false)?;
        }
    }
    let hash = if any { format!("sha256:{:x}", hasher.finalize()) } else { String::new() };
    Ok(Read { documents, hash })
}

fn field(v: &serde_yaml::Value, name: &str) -> String {
    v.get(name).and_then(serde_yaml::Value::as_str).unwrap_or_default().to_owned()
}

/// One document, or a list's items.
fn push(file: &Path, value: serde_yaml::Value, out: &mut Vec<Document>, item: bool) -> Result<(), String> {
    if value.is_null() {
        return Ok(());
    }
    let (api_version, kind) = (field(&value, "apiVersion"), field(&value, "kind"));
    let is_list = (api_version == "v1" && kind == "List") || kind.ends_with("List");
    if is_list {
        let items = value.get("items").and_then(serde_yaml::Value::as_sequence).cloned().unwrap_or_default();
        for i in items {
            push(file, i, out, true).map_err(|e| if item { e } else { format!("failed to decode list item: {e}") })?;
        }
        return Ok(());
    }
    out.push(Document { file: file.to_owned(), api_version, kind, value });
    Ok(())
}

/// Checks a manifest object's name: present, ending in [`STATIC_SUFFIX`], not seen before in `seen`.
pub fn check_name(name: &str, file: &Path, seen: &mut Vec<(String, PathBuf)>) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("resource in file {:?} must have a name", file.display()));
    }
    if !name.ends_with(STATIC_SUFFIX) {
        return Err(format!("{name:?} in file {:?} must have a name ending with {STATIC_SUFFIX:?}", file.display()));
    }
    if let Some((_, first)) = seen.iter().find(|(n, _)| n == name) {
        return Err(format!(
            "duplicate name {name:?} found in file {:?} (previously seen in {:?})",
            file.display(),
            first.display()
        ));
    }
    seen.push((name.to_owned(), file.to_owned()));
    Ok(())
}

/// What a plugin makes of its directory: the objects to put in force, their hash, and how many there are.
pub struct Loaded<T> {
    pub value: T,
    pub hash: String,
    pub count: usize,
}

/// Loads `dir` for `plugin` now (an error stops the start) and puts it in force with `apply`, then reads it again
/// every [`RELOAD_INTERVAL`] until `stop`: a changed directory is loaded again, a bad one logged and counted
/// while the last good set stays, with kube's reload metrics.
pub fn start<T: Send + 'static>(
    dir: PathBuf,
    plugin: &'static str,
    apiserver_id_hash: String,
    stop: CancellationToken,
    load: fn(&Path) -> Result<Loaded<T>, String>,
    apply: impl Fn(T) + Send + 'static,
) -> Result<(), String> {
    validate_dir(&dir)?;
    let what = if plugin.ends_with("Webhook") { "webhook" } else { "policy" };
    let first =
        load(&dir).map_err(|e| format!("failed to load static {what} manifests from {:?}: {e}", dir.display()))?;
    let metrics = crate::admission::metrics::metrics();
    tracing::info!(plugin, count = first.count, dir = %dir.display(), "Loaded manifest-based admission configuration");
    metrics.manifest_reloaded(plugin, &apiserver_id_hash, true);
    metrics.manifest_loaded(plugin, &apiserver_id_hash, &first.hash);
    let mut last = first.hash;
    apply(first.value);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let d = dir.clone();
            // Reading is cheap; only a changed directory is decoded and compiled again.
            let hash = tokio::task::spawn_blocking(move || read(&d).map(|r| r.hash))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            if hash.as_ref().is_ok_and(|h| *h == last) {
                continue;
            }
            let d = dir.clone();
            match tokio::task::spawn_blocking(move || load(&d)).await.unwrap_or_else(|e| Err(e.to_string())) {
                Ok(loaded) => {
                    tracing::info!(plugin, count = loaded.count, "Reloaded manifest-based admission configuration");
                    metrics.manifest_reloaded(plugin, &apiserver_id_hash, true);
                    metrics.manifest_loaded(plugin, &apiserver_id_hash, &loaded.hash);
                    last = loaded.hash;
                    apply(loaded.value);
                }
                Err(e) => {
                    tracing::error!(plugin, error = %e, "reloading static manifests; keeping the last good set");
                    metrics.manifest_reloaded(plugin, &apiserver_id_hash, false);
                    // Not reported again until the directory changes.
                    if let Ok(h) = hash {
                        last = h;
                    }
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_listed_once_each_in_order() {
        let mut out = crate::admission::Outcome::default();
        for name in ["b.static.k8s.io", "a.static.k8s.io", "b.static.k8s.io"] {
            record_source(&mut out, MANIFEST_WEBHOOKS_ANNOTATION, name);
        }
        assert_eq!(out.audit_annotations[MANIFEST_WEBHOOKS_ANNOTATION], "b.static.k8s.io,a.static.k8s.io");
        assert!(!out.audit_annotations.contains_key(MANIFEST_POLICIES_ANNOTATION));
    }
}
