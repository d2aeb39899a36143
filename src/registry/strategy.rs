//! The PodSet strategy, as sample-apiserver's `strategy.go`: what the server owns in an object (uid, timestamps,
//! generation, status vs the rest), defaulting and validation on create and update.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use rand::Rng;

use super::error::{Error, Result};
use super::key::ObjectKey;
use crate::api::defaults::default_podset;
use crate::api::{PodSet, Subresource, Version, KIND};
use crate::resources::podset::validation;
use crate::resources::podset::INFO;

/// Timestamps as Kubernetes keeps them: whole seconds.
pub(crate) fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub(crate) fn now_text() -> String {
    now().0.to_string()
}

/// PrepareForCreate: sets what the server owns on a new PodSet in `namespace` and clears what a client may not
/// set. Returns the `generateName` prefix when the server is to pick the name.
pub(crate) fn prepare_for_create(ps: &mut PodSet, namespace: &str) -> Result<Option<String>> {
    let meta = &mut ps.metadata;
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() && ns != namespace => {
            return Err(Error::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => meta.namespace = Some(namespace.to_owned()),
    }
    if meta.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
        return Err(Error::bad_request("resourceVersion should not be set on objects to be created"));
    }
    let generate = meta.name.as_deref().is_none_or(str::is_empty).then(|| meta.generate_name.clone()).flatten();
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.creation_timestamp = Some(now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.self_link = None;
    ps.status = None;
    ps.kind = KIND.into();
    Ok(generate)
}

/// A name from `generateName`: the prefix (cut to fit) and five random characters.
pub(crate) fn generated_name(prefix: &str) -> String {
    format!("{}{}", truncate_generate_name(prefix), random_suffix())
}

/// Defaults (as `version`, the one it was sent in, defaults) and validates a PodSet about to be created.
pub(crate) fn validate_create(ps: &mut PodSet, version: Version) -> Result<()> {
    default_podset(ps, version);
    let errors = validation::validate(ps);
    if !errors.is_empty() {
        return Err(Error::invalid(&INFO, ps.metadata.name.as_deref().unwrap_or_default(), errors));
    }
    Ok(())
}

/// PrepareForUpdate and ValidateUpdate (after the write path checked preconditions): carries the server-owned fields over from `old`, keeps the part the write
/// may not change (status on the main resource, everything but status on `/status`), bumps `generation` on a
/// spec change, defaults and validates.
pub(crate) fn prepare_for_update(
    mut new: PodSet,
    old: &PodSet,
    sub: Subresource,
    key: &ObjectKey,
    version: Version,
) -> Result<PodSet> {
    let name = key.name.as_str();
    let mut next = match sub {
        Subresource::Status => {
            let mut next = old.clone();
            next.status = new.status.take();
            // What field management decided (it never takes a status write's own managedFields).
            next.metadata.managed_fields = new.metadata.managed_fields.take();
            let errors = validation::validate_status_update(&next);
            if !errors.is_empty() {
                return Err(Error::invalid(&INFO, name, errors));
            }
            next
        }
        // `/scale` proposes the whole object with only spec.replicas changed.
        Subresource::Main | Subresource::Scale => {
            let m = &mut new.metadata;
            let o = &old.metadata;
            m.name = Some(key.name.clone());
            m.namespace = Some(key.namespace.clone());
            m.uid = o.uid.clone();
            m.creation_timestamp = o.creation_timestamp.clone();
            m.deletion_timestamp = o.deletion_timestamp.clone();
            m.deletion_grace_period_seconds = o.deletion_grace_period_seconds;
            m.generate_name = m.generate_name.take().or_else(|| o.generate_name.clone());
            m.self_link = None;
            new.status = old.status.clone();
            default_podset(&mut new, version);
            let errors = validation::validate_update(&new, old);
            if !errors.is_empty() {
                return Err(Error::invalid(&INFO, name, errors));
            }
            let generation = old.metadata.generation.unwrap_or(1);
            new.metadata.generation = Some(if new.spec != old.spec { generation + 1 } else { generation });
            new
        }
    };
    next.api_version.clear();
    next.kind = KIND.into();
    next.metadata.resource_version = old.metadata.resource_version.clone();
    Ok(next)
}

/// A body's name and namespace, when set, must be the ones on the URL.
pub(crate) fn check_identity(meta: &ObjectMeta, key: &ObjectKey) -> Result<()> {
    if let Some(n) = meta.name.as_deref().filter(|n| *n != key.name) {
        return Err(Error::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({})",
            key.name
        )));
    }
    if meta.namespace.as_deref().is_some_and(|ns| !ns.is_empty() && ns != key.namespace) {
        return Err(Error::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// kube-apiserver keeps generated names within 63 characters: at most 58 of the prefix.
fn truncate_generate_name(prefix: &str) -> &str {
    let max = 58;
    if prefix.len() <= max {
        return prefix;
    }
    let mut end = max;
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    &prefix[..end]
}

/// Five characters from the alphabet kube-apiserver uses (no vowels, no confusable digits).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_have_five_random_characters() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
        assert_eq!(truncate_generate_name(&"a".repeat(80)).len(), 58);
        assert_eq!(generated_name(&"é".repeat(40)).len(), 58 + 5, "cut on a character boundary");
    }

    #[test]
    fn updates_keep_server_fields_and_bump_generation_on_spec_changes_only() {
        let key = ObjectKey::new("ns", "web");
        let mut old: PodSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "generation": 3, "resourceVersion": "7"},
            "spec": {"replicas": 1}, "status": {"replicas": 1}
        }))
        .unwrap();
        default_podset(&mut old, Version::V1alpha1);
        let mut new = old.clone();
        new.metadata.uid = None;
        new.status = None;
        let same = prepare_for_update(new.clone(), &old, Subresource::Main, &key, Version::V1alpha1).unwrap();
        assert_eq!(same.metadata.generation, Some(3));
        assert_eq!(same.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(same.status, old.status, "the main resource does not write status");
        new.spec.replicas = Some(2);
        assert_eq!(
            prepare_for_update(new.clone(), &old, Subresource::Main, &key, Version::V1alpha1)
                .unwrap()
                .metadata
                .generation,
            Some(4)
        );
        let status_only = prepare_for_update(new.clone(), &old, Subresource::Status, &key, Version::V1alpha1).unwrap();
        assert_eq!(status_only.spec.replicas, Some(1), "/status does not write spec");
        assert_eq!(status_only.status, None);
    }
}
