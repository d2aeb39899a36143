//! `--encryption-provider-config`: an `apiserver.config.k8s.io/v1` `EncryptionConfiguration`, read and checked as
//! kube-apiserver reads it (k8s.io/apiserver's `apis/apiserver/validation` and `encryptionconfig`): errors name the
//! field, every key is checked, and the providers of the first entry naming a resource (`podsets.demo.k8s.io`,
//! `*.demo.k8s.io` or `*.*`) serve it.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;

use crate::api::resource::ResourceInfo;
use crate::api::validation::FieldError;
use crate::cmd::config_file::{aggregate, decode_strict};
use crate::storage::value::{Cbc, Gcm, Provider, Providers, Secretbox, Transform, ValueError};

pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";
pub const KIND: &str = "EncryptionConfiguration";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct File {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    resources: Vec<ResourceConfiguration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ResourceConfiguration {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<ProviderConfiguration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ProviderConfiguration {
    aesgcm: Option<AesConfiguration>,
    aescbc: Option<AesConfiguration>,
    secretbox: Option<AesConfiguration>,
    identity: Option<serde_json::Value>,
    kms: Option<KmsConfiguration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct AesConfiguration {
    #[serde(default)]
    keys: Vec<Key>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Key {
    #[serde(default)]
    name: String,
    #[serde(default)]
    secret: String,
}

/// A `kms` provider as configured (`apiVersion` v2: the `k8s.io/kms` v2 gRPC API over a unix socket).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KmsConfiguration {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub name: String,
    pub cachesize: Option<i32>,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default, with = "go_duration")]
    pub timeout: Option<Duration>,
}

/// Why a configuration was refused, worded as kube-apiserver words it (the file, the field, what is wrong).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// One entry's providers, checked and ready to build.
#[derive(Debug, Clone)]
enum ProviderSpec {
    Identity,
    Aescbc(Vec<(String, Vec<u8>)>),
    Aesgcm(Vec<(String, Vec<u8>)>),
    Secretbox(Vec<(String, Vec<u8>)>),
    Kms(KmsConfiguration),
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct EncryptionConfig {
    entries: Vec<(Vec<String>, Vec<ProviderSpec>)>,
    /// The file's bytes, so a reload can tell a change.
    pub content: Vec<u8>,
}

/// Makes a provider's transformation from its key.
type MakeTransform = fn(&[u8]) -> Result<Box<dyn Transform>, ValueError>;

/// Builds a `kms` provider (the KMS client lives outside this module).
pub type KmsBuilder<'a> = &'a dyn Fn(&KmsConfiguration) -> Result<Provider, String>;

/// The kinds a configuration file may have: the current one, and the legacy one kube-apiserver still reads.
const KINDS: [(&str, &str); 2] = [(API_VERSION, KIND), ("v1", "EncryptionConfig")];

impl EncryptionConfig {
    /// Reads and checks `path` (YAML or JSON).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display();
        let content = std::fs::read(path).map_err(|e| {
            ConfigError(format!(
                "error while parsing file: error while loading file: error reading encryption provider \
                 configuration file \"{shown}\": {e}"
            ))
        })?;
        if content.is_empty() {
            return Err(ConfigError(format!(
                "error while parsing file: error while loading file: encryption provider configuration file \
                 \"{shown}\" is empty"
            )));
        }
        Self::parse(&shown.to_string(), content).map_err(ConfigError)
    }

    /// A configuration from the bytes of the file at `path`.
    pub fn parse(path: &str, content: Vec<u8>) -> Result<Self, String> {
        let decoding = |e: &dyn std::fmt::Display| {
            format!("error while parsing file: error decoding encryption provider configuration file \"{path}\": {e}")
        };
        let text = std::str::from_utf8(&content).map_err(|e| decoding(&e))?;
        let file: File = decode_strict(text).map_err(|e| decoding(&e))?;
        if file.kind.is_empty() {
            return Err(decoding(&"Object 'Kind' is missing"));
        }
        if !KINDS.contains(&(file.api_version.as_str(), file.kind.as_str())) {
            return Err(decoding(&format!(
                "no kind {:?} is registered for version {:?} (expected kind {KIND}, apiVersion {API_VERSION})",
                file.kind, file.api_version
            )));
        }
        let errors = validate(&file);
        if !errors.is_empty() {
            return Err(format!("error while parsing file: {}", aggregate(&errors)));
        }
        masked(&file).map_err(|e| format!("error while building transformers: {e}"))?;
        let entries =
            file.resources.into_iter().map(|r| (r.resources, r.providers.into_iter().map(spec).collect())).collect();
        Ok(Self { entries, content })
    }

    /// The providers that serve `resource.group`, built: those of the entries naming it exactly, else
    /// `*.<group>`, else `*.*` (entries naming the same string add up, in order). `None` when none does: stored
    /// plainly, as kube-apiserver stores a resource the configuration leaves out.
    pub fn providers_for(
        &self,
        resource: &str,
        group: &str,
        kms: KmsBuilder<'_>,
    ) -> Result<Option<Providers>, ConfigError> {
        Ok(self.build(&[(resource, group)], kms)?.pop().flatten())
    }

    /// [`Self::providers_for`] each of `resources`, in their order. The providers of one entry are built once and
    /// shared by every resource it serves, as kube-apiserver's are: a `kms` provider connects to its plugin once.
    pub fn providers_for_each(
        &self,
        resources: &[&ResourceInfo],
        kms: KmsBuilder<'_>,
    ) -> Result<Vec<Option<Providers>>, ConfigError> {
        let names: Vec<_> = resources.iter().map(|r| (r.plural, r.group)).collect();
        self.build(&names, kms)
    }

    /// The entries that serve `resource.group`, and the name they serve it by (`podsets.demo.k8s.io`,
    /// `configmaps` for the core group's): those naming it exactly, else `*.<group>`, else `*.*`.
    fn entries_for(&self, resource: &str, group: &str) -> (String, Vec<usize>) {
        let exact = if group.is_empty() { resource.to_owned() } else { format!("{resource}.{group}") };
        let names = [exact.clone(), format!("*.{group}"), "*.*".to_owned()];
        let named = |n: &String| -> Vec<usize> {
            self.entries.iter().enumerate().filter(|(_, (rs, _))| rs.contains(n)).map(|(i, _)| i).collect()
        };
        let entries = names.iter().map(named).find(|e| !e.is_empty()).unwrap_or_default();
        (exact, entries)
    }

    fn build(&self, resources: &[(&str, &str)], kms: KmsBuilder<'_>) -> Result<Vec<Option<Providers>>, ConfigError> {
        let mut built: Vec<Option<Vec<Provider>>> = vec![None; self.entries.len()];
        let mut out = Vec::with_capacity(resources.len());
        for (resource, group) in resources {
            let (name, entries) = self.entries_for(resource, group);
            if entries.is_empty() {
                out.push(None);
                continue;
            }
            let mut providers = Vec::new();
            for i in entries {
                let entry = match &mut built[i] {
                    Some(entry) => entry,
                    slot => slot.insert(build_entry(&self.entries[i].1, kms)?),
                };
                providers.extend(entry.iter().cloned());
            }
            out.push(Some(Providers::new(&name, providers)));
        }
        Ok(out)
    }

    /// The `kms` providers the configuration names, for every resource.
    pub fn kms_providers(&self) -> impl Iterator<Item = &KmsConfiguration> {
        self.entries.iter().flat_map(|(_, specs)| specs).filter_map(|s| match s {
            ProviderSpec::Kms(c) => Some(c),
            _ => None,
        })
    }
}

/// One entry's providers, built in its order.
fn build_entry(specs: &[ProviderSpec], kms: KmsBuilder<'_>) -> Result<Vec<Provider>, ConfigError> {
    let building = |e: String| ConfigError(format!("error while building transformers: {e}"));
    let mut providers = Vec::new();
    for spec in specs {
        let mut keyed = |keys: &[(String, Vec<u8>)], kind: &str, make: MakeTransform| {
            for (key, secret) in keys {
                let t = make(secret).map_err(|e| building(format!("{kind} key {key:?}: {e}")))?;
                providers.push(Provider::new(format!("k8s:enc:{kind}:v1:"), Some(format!("{key}:")), t));
            }
            Ok::<_, ConfigError>(())
        };
        match spec {
            ProviderSpec::Identity => providers.push(Provider::identity()),
            ProviderSpec::Aescbc(keys) => keyed(keys, "aescbc", |k| Ok(Box::new(Cbc::new(k)?)))?,
            ProviderSpec::Aesgcm(keys) => keyed(keys, "aesgcm", |k| Ok(Box::new(Gcm::new(k)?)))?,
            ProviderSpec::Secretbox(keys) => keyed(keys, "secretbox", |k| Ok(Box::new(Secretbox::new(k)?)))?,
            ProviderSpec::Kms(c) if c.api_version != "v2" => {
                return Err(building(
                    "KMSv1 is deprecated and will only receive security updates going forward. Use KMSv2 \
                     instead (apiVersion: v2); this server serves only KMS v2."
                        .into(),
                ))
            }
            ProviderSpec::Kms(c) => providers.push(kms(c).map_err(building)?),
        }
    }
    Ok(providers)
}

/// A configured name as a resource and its group (`secrets` is the core group's; `*.` every core resource).
fn group_resource(name: &str) -> (&str, &str) {
    name.split_once('.').unwrap_or((name, ""))
}

/// kube-apiserver's masking check: a wildcard of an earlier entry would hide a later entry's resource.
fn masked(file: &File) -> Result<(), String> {
    for (i, entry) in file.resources.iter().enumerate() {
        for name in &entry.resources {
            let g = group_resource(name).1;
            for earlier in file.resources[..i].iter().flat_map(|e| &e.resources) {
                let (wr, wg) = group_resource(earlier);
                if earlier != name && wr == "*" && (wg == "*" || wg == g) {
                    return Err(format!("resource {name:?} is masked by earlier rule {earlier:?}"));
                }
            }
        }
    }
    Ok(())
}

fn spec(p: ProviderConfiguration) -> ProviderSpec {
    let keys = |c: AesConfiguration| {
        c.keys
            .into_iter()
            .map(|k| (k.name, base64::engine::general_purpose::STANDARD.decode(k.secret.trim()).unwrap_or_default()))
            .collect()
    };
    match p {
        ProviderConfiguration { aescbc: Some(c), .. } => ProviderSpec::Aescbc(keys(c)),
        ProviderConfiguration { aesgcm: Some(c), .. } => ProviderSpec::Aesgcm(keys(c)),
        ProviderConfiguration { secretbox: Some(c), .. } => ProviderSpec::Secretbox(keys(c)),
        ProviderConfiguration { kms: Some(c), .. } => ProviderSpec::Kms(c),
        _ => ProviderSpec::Identity,
    }
}

/// A value shown as it is (not quoted as a string is).
struct Shown(String);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const MORE_THAN_ONE: &str =
    "more than one provider specified in a single element, should split into different list elements";

/// kube's `ValidateEncryptionConfiguration`.
fn validate(file: &File) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if file.resources.is_empty() {
        errors.push(FieldError::required("resources", "at least one resources is required"));
    }
    let mut kms_names = std::collections::HashSet::new();
    for (i, entry) in file.resources.iter().enumerate() {
        let path = format!("resources[{i}]");
        if entry.resources.is_empty() {
            errors.push(FieldError::required(
                format!("{path}.resources"),
                format!("at least one {path}.resources is required"),
            ));
        }
        validate_resources(&format!("{path}.resources"), &entry.resources, &mut errors);
        if entry.providers.is_empty() {
            errors.push(FieldError::required(
                format!("{path}.providers"),
                format!("at least one {path}.providers is required"),
            ));
        }
        for (j, p) in entry.providers.iter().enumerate() {
            let at = format!("{path}.providers[{j}]");
            let set = [
                ("aesgcm", p.aesgcm.is_some()),
                ("aescbc", p.aescbc.is_some()),
                ("secretbox", p.secretbox.is_some()),
                ("identity", p.identity.is_some()),
                ("kms", p.kms.is_some()),
            ];
            let named: Vec<&str> = set.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect();
            match named.len() {
                0 => errors.push(FieldError::invalid(
                    at.clone(),
                    Shown("{}".into()),
                    "provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity",
                )),
                1 => {}
                _ => errors.push(FieldError::invalid(
                    at.clone(),
                    Shown(format!("{{{}}}", named.join(","))),
                    MORE_THAN_ONE,
                )),
            }
            for (kind, conf, sizes) in [
                ("aesgcm", &p.aesgcm, &[16, 24, 32][..]),
                ("aescbc", &p.aescbc, &[16, 24, 32][..]),
                ("secretbox", &p.secretbox, &[32][..]),
            ] {
                if let Some(c) = conf {
                    validate_keys(&format!("{at}.{kind}.keys"), &c.keys, sizes, &mut errors);
                }
            }
            if let Some(kms) = &p.kms {
                validate_kms(&format!("{at}.kms"), kms, &mut kms_names, &mut errors);
            }
        }
    }
    errors
}

/// The resource names of one entry (kube-apiserver 1.27+'s rules for names and wildcards).
fn validate_resources(path: &str, names: &[String], errors: &mut Vec<FieldError>) {
    let list = || Shown(serde_json::to_string(names).unwrap_or_default());
    for (j, name) in names.iter().enumerate() {
        let at = format!("{path}[{j}]");
        let (r, g) = group_resource(name);
        let problem = if name.chars().any(|c| c.is_ascii_uppercase()) {
            Some("resource name should not contain capital letters")
        } else if name == "*" {
            Some("use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources")
        } else if g == "*" && r != "*" {
            Some("encrypting the same resource across groups is not supported")
        } else if g == "events.k8s.io" {
            Some("'*.events.k8s.io' objects are stored using the 'events' API group in etcd. Use 'events' instead in the config file")
        } else if g == "extensions" {
            Some("'extensions' group has been removed and cannot be used for encryption")
        } else {
            None
        };
        if let Some(problem) = problem {
            errors.push(FieldError::invalid(at, name, problem));
        }
    }
    let mut seen = std::collections::HashSet::new();
    if !names.iter().all(|n| seen.insert(n)) {
        errors.push(FieldError::invalid(path, list(), "the same resource cannot be specified multiple times"));
    }
    let overlapping = names.iter().any(|w| {
        let (wr, wg) = group_resource(w);
        wr == "*" && names.iter().any(|n| n != w && (wg == "*" || group_resource(n).1 == wg))
    });
    if overlapping {
        errors.push(FieldError::invalid(
            path,
            list(),
            "using overlapping resources such as 'secrets' and '*.' in the same resource list is not allowed as they \
             will be masked",
        ));
    }
}

fn validate_keys(path: &str, keys: &[Key], sizes: &[usize], errors: &mut Vec<FieldError>) {
    if keys.is_empty() {
        errors.push(FieldError::required(path, "at least one keys is required"));
    }
    for (k, key) in keys.iter().enumerate() {
        let at = format!("{path}[{k}]");
        if key.name.is_empty() {
            errors.push(FieldError::required(format!("{at}.name"), "name is a mandatory field for a key"));
        }
        if key.secret.is_empty() {
            errors.push(FieldError::required(format!("{at}.secret"), "secret is a mandatory field for a key"));
            continue;
        }
        match base64::engine::general_purpose::STANDARD.decode(key.secret.trim()) {
            Err(_) => {
                errors.push(FieldError::invalid(format!("{at}.secret"), "REDACTED", "secrets must be base64 encoded"))
            }
            Ok(secret) if !sizes.contains(&secret.len()) => errors.push(FieldError::invalid(
                format!("{at}.secret"),
                "REDACTED",
                format!(
                    "secret is not of the expected length, got {}, expected one of {}",
                    secret.len(),
                    format!("{sizes:?}").replace(',', "")
                ),
            )),
            Ok(_) => {}
        }
    }
}

fn validate_kms<'a>(
    path: &str,
    kms: &'a KmsConfiguration,
    names: &mut std::collections::HashSet<&'a str>,
    errors: &mut Vec<FieldError>,
) {
    if kms.name.is_empty() {
        errors.push(FieldError::required(format!("{path}.name"), "name is a mandatory field for a provider"));
    } else if kms.name.contains(':') && kms.api_version == "v2" {
        errors.push(FieldError::invalid(
            format!("{path}.name"),
            &kms.name,
            format!("invalid KMS provider name {}, must not contain ':'", kms.name),
        ));
    } else if !names.insert(&kms.name) {
        errors.push(FieldError::invalid(
            format!("{path}.name"),
            &kms.name,
            format!("duplicate KMS provider name {}, names must be unique", kms.name),
        ));
    }
    // (kube's message names the field where it meant the value.)
    if !["", "v1", "v2"].contains(&kms.api_version.as_str()) {
        errors.push(FieldError::invalid(
            format!("{path}.apiVersion"),
            &kms.api_version,
            "unsupported apiVersion apiVersion for KMS provider, only v1 and v2 are supported",
        ));
    }
    if let (Some(size), "v2") = (kms.cachesize, kms.api_version.as_str()) {
        errors.push(FieldError::invalid(
            format!("{path}.cachesize"),
            Shown(size.to_string()),
            "cachesize is not supported in v2",
        ));
    }
    if kms.timeout.is_some_and(|t| t.is_zero()) {
        errors.push(FieldError::invalid(
            format!("{path}.timeout"),
            Shown("0s".into()),
            "timeout should be a positive value",
        ));
    }
    if kms.endpoint.is_empty() {
        errors.push(FieldError::invalid(format!("{path}.endpoint"), "", "endpoint is a mandatory field for a kms"));
    } else if !kms.endpoint.starts_with("unix://") {
        let scheme = kms.endpoint.split_once("://").map_or("", |(s, _)| s);
        errors.push(FieldError::invalid(
            format!("{path}.endpoint"),
            &kms.endpoint,
            format!("unsupported scheme {scheme:?} for KMS provider, only unix is supported"),
        ));
    }
}

/// A `metav1.Duration` as Go writes it (`3s`, `1m30s`, `500ms`).
mod go_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else { return Ok(None) };
        crate::api::duration::parse(&text).map(Some).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
