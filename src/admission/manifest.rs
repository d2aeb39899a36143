//! Admission configuration from files (`staticManifestsDir`, KEP-5793), read as k8s.io/apiserver's
//! `admission/plugin/manifest` reads it: the directory's direct children ending in `.yaml`, `.yml` or `.json`, in
//! name order, empty files skipped, YAML split into documents, a `v1` `List` (or a typed list) into its items;
//! each object decoded strictly. The plugin checks what it gets ([`crate::admission::policy::manifests`],
//! [`crate::admission::webhook::manifests`]) and keeps the last good set when a reload fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The suffix every manifest object's name ends with, so it can never collide with an API object.
pub const STATIC_SUFFIX: &str = ".static.k8s.io";

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
