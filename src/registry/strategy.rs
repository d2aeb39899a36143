//! What the server owns in every object (uid, timestamps, generation, the namespace, generated names) around a
//! resource's [`Strategy`], as k8s.io/apiserver's `rest.BeforeCreate`/`BeforeUpdate` around a `RESTCreateStrategy`
//! and `RESTUpdateStrategy`: defaulting and validation on create and update, the main resource's and `/status`'s
//! PrepareForUpdate.

use std::fmt::Debug;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::error::{Error, Result};
use super::fieldmanager::FieldManager;
use super::key::ObjectKey;
use super::migrate::MigrationMetrics;
use super::scale::ScaleAccessor;
use crate::api::resource::{ResourceInfo, ServedVersion, VersionIndex};
use crate::api::validation::FieldError;
use crate::api::Subresource;

/// A resource's own rules, as k8s.io/apiserver's create and update strategies: its object type and versions, how
/// they convert, what a create clears, what the main resource and `/status` may each change, defaults, validation
/// and field management. The registry does the rest the same for every resource.
pub trait Strategy: Send + Sync + 'static {
    /// The hub (kube's internal version): every served version's fields.
    type Object: Clone + Default + PartialEq + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// A served version.
    type Version: ServedVersion;

    const INFO: &'static ResourceInfo;
    /// What objects are stored in unless the server is told otherwise.
    const STORAGE_VERSION: Self::Version;

    fn meta(o: &Self::Object) -> &ObjectMeta;
    fn meta_mut(o: &mut Self::Object) -> &mut ObjectMeta;
    /// The object's `apiVersion` and `kind` fields.
    fn type_fields(o: &mut Self::Object) -> (&mut String, &mut String);

    /// `o`, read in `from`, as the hub holds it (with no `apiVersion`: the hub is no version clients see).
    fn to_hub(o: &mut Self::Object, _from: Self::Version) {
        Self::type_fields(o).0.clear();
    }
    /// The hub object `o` in `to`, its `apiVersion` set.
    fn from_hub(o: &mut Self::Object, to: Self::Version) {
        *Self::type_fields(o).0 = Self::INFO.version(to.to_index()).api_version.into();
    }
    /// Fields the hub has that `version` lacks: taken out of a body sent in it, and named (`spec.x`) to be
    /// reported as unknown, as a typed decode into that version would report them.
    fn absent_fields(_version: Self::Version, _body: &mut Value) -> Vec<String> {
        Vec::new()
    }
    /// Whether a JSON body sent in `version` may be read straight into the hub: not when it may hold one of
    /// [`Strategy::absent_fields`].
    fn decodes_directly(_version: Self::Version, _body: &[u8]) -> bool {
        true
    }
    /// A managedFields entry's field set (FieldsV1), recorded in `from`, as `to` names the same fields.
    fn convert_fields(_fields: &mut Value, _from: Self::Version, _to: Self::Version) {}

    /// Field management of objects in `version`: their schema, and the fields each subresource resets.
    fn field_manager(version: Self::Version) -> &'static FieldManager;

    /// PrepareForCreate's part the resource owns: what a client may not set on a new object (its status).
    fn prepare_for_create(o: &mut Self::Object);
    /// Defaults, as `version` (the one the object was sent in) defaults.
    fn default(o: &mut Self::Object, version: Self::Version);
    fn validate(o: &Self::Object, version: Self::Version) -> Vec<FieldError>;
    /// PrepareForUpdate of the main resource: `new` keeps what only `/status` writes.
    fn prepare_for_update(new: &mut Self::Object, old: &Self::Object);
    fn validate_update(new: &Self::Object, old: &Self::Object, version: Self::Version) -> Vec<FieldError>;
    /// PrepareForUpdate of `/status`: `new` becomes `old` with `new`'s status.
    fn prepare_for_status_update(new: &mut Self::Object, old: &Self::Object);
    fn validate_status_update(new: &Self::Object, old: &Self::Object) -> Vec<FieldError>;
    /// Whether `metadata.generation` moves: the desired state changed.
    fn spec_changed(new: &Self::Object, old: &Self::Object) -> bool;

    /// Where a resource with a `/scale` subresource keeps replicas and selector.
    fn scale() -> Option<&'static dyn ScaleAccessor<Self::Object>> {
        None
    }

    /// Where the storage migration reports its progress, for a resource that publishes it.
    fn migration_metrics() -> Option<&'static dyn MigrationMetrics> {
        None
    }
}

/// The version an `apiVersion` of `S` names.
pub(crate) fn version_of<S: Strategy>(api_version: &str) -> Option<S::Version> {
    S::INFO.version_of(api_version).map(S::Version::from_index)
}

/// `S`'s typed version of a served one.
pub(crate) fn typed<S: Strategy>(v: VersionIndex) -> S::Version {
    S::Version::from_index(v)
}

/// Timestamps as Kubernetes keeps them: whole seconds.
pub(crate) fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub(crate) fn now_text() -> String {
    now().0.to_string()
}

/// PrepareForCreate: sets what the server owns on a new object in `namespace` (empty for a cluster-scoped one) and
/// clears what a client may not set. Returns the `generateName` prefix when the server is to pick the name.
pub(crate) fn prepare_for_create<S: Strategy>(o: &mut S::Object, namespace: &str) -> Result<Option<String>> {
    S::prepare_for_create(o);
    *S::type_fields(o).1 = S::INFO.kind.into();
    let meta = S::meta_mut(o);
    // kube's EnsureObjectNamespaceMatchesRequestNamespace: a cluster-scoped object's namespace is cleared.
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() && !namespace.is_empty() && ns != namespace => {
            return Err(Error::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => meta.namespace = (!namespace.is_empty()).then(|| namespace.to_owned()),
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
    Ok(generate)
}

/// A name from `generateName`: the prefix (cut to fit) and five random characters.
pub(crate) fn generated_name(prefix: &str) -> String {
    format!("{}{}", truncate_generate_name(prefix), random_suffix())
}

/// Defaults (as `version`, the one it was sent in, defaults) and validates an object about to be created.
pub(crate) fn validate_create<S: Strategy>(o: &mut S::Object, version: S::Version) -> Result<()> {
    S::default(o, version);
    let errors = S::validate(o, version);
    if !errors.is_empty() {
        return Err(Error::invalid(S::INFO, S::meta(o).name.as_deref().unwrap_or_default(), errors));
    }
    Ok(())
}

/// PrepareForUpdate and ValidateUpdate (after the write path checked preconditions): carries the server-owned
/// fields over from `old`, keeps the part the write may not change (status on the main resource, everything but
/// status on `/status`), bumps `generation` on a spec change, defaults and validates.
pub(crate) fn prepare_for_update<S: Strategy>(
    mut new: S::Object,
    old: &S::Object,
    sub: Subresource,
    key: &ObjectKey,
    version: S::Version,
) -> Result<S::Object> {
    let name = key.name.as_str();
    match sub {
        Subresource::Status => {
            // What field management decided (it never takes a status write's own managedFields).
            let managed_fields = S::meta_mut(&mut new).managed_fields.take();
            S::prepare_for_status_update(&mut new, old);
            S::meta_mut(&mut new).managed_fields = managed_fields;
            let errors = S::validate_status_update(&new, old);
            if !errors.is_empty() {
                return Err(Error::invalid(S::INFO, name, errors));
            }
        }
        // `/scale` proposes the whole object with only its replicas changed.
        Subresource::Main | Subresource::Scale => {
            let (o, m) = (S::meta(old), S::meta_mut(&mut new));
            m.name = Some(key.name.clone());
            m.namespace = (!key.namespace.is_empty()).then(|| key.namespace.clone());
            m.uid = o.uid.clone();
            m.creation_timestamp = o.creation_timestamp.clone();
            m.deletion_timestamp = o.deletion_timestamp.clone();
            m.deletion_grace_period_seconds = o.deletion_grace_period_seconds;
            m.generate_name = m.generate_name.take().or_else(|| o.generate_name.clone());
            m.self_link = None;
            S::prepare_for_update(&mut new, old);
            S::default(&mut new, version);
            let errors = S::validate_update(&new, old, version);
            if !errors.is_empty() {
                return Err(Error::invalid(S::INFO, name, errors));
            }
            let generation = S::meta(old).generation.unwrap_or(1);
            let changed = S::spec_changed(&new, old);
            S::meta_mut(&mut new).generation = Some(if changed { generation + 1 } else { generation });
        }
    }
    let (api_version, kind) = S::type_fields(&mut new);
    api_version.clear();
    *kind = S::INFO.kind.into();
    S::meta_mut(&mut new).resource_version = S::meta(old).resource_version.clone();
    Ok(new)
}

/// A body's name and namespace, when set, must be the ones on the URL.
pub(crate) fn check_identity(meta: &ObjectMeta, key: &ObjectKey) -> Result<()> {
    if let Some(n) = meta.name.as_deref().filter(|n| *n != key.name) {
        return Err(Error::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({})",
            key.name
        )));
    }
    if meta.namespace.as_deref().is_some_and(|ns| !ns.is_empty() && !key.namespace.is_empty() && ns != key.namespace) {
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

    use crate::api::defaults::default_podset;
    use crate::api::{PodSet, Version};
    use crate::resources::podset::PodSetStrategy;

    fn prepare_for_update(
        new: PodSet,
        old: &PodSet,
        sub: Subresource,
        key: &ObjectKey,
        version: Version,
    ) -> Result<PodSet> {
        super::prepare_for_update::<PodSetStrategy>(new, old, sub, key, version)
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

    /// A cluster-scoped kind: its objects have no namespace, whatever the body says (kube's
    /// `EnsureObjectNamespaceMatchesRequestNamespace`), and the strategy's rules apply as PodSet's do.
    #[test]
    fn a_cluster_scoped_kind_is_prepared_without_a_namespace() {
        use crate::registry::testkind::{Widget, WidgetStrategy, V1};
        let mut w: Widget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "blue", "namespace": "stray"}, "spec": {"size": 2}, "status": {"seen": 1}
        }))
        .unwrap();
        assert_eq!(super::prepare_for_create::<WidgetStrategy>(&mut w, "").unwrap(), None);
        assert_eq!((w.metadata.namespace.as_deref(), w.status.as_ref(), w.kind.as_str()), (None, None, "Widget"));
        assert_eq!(w.metadata.generation, Some(1));
        super::validate_create::<WidgetStrategy>(&mut w, V1).unwrap();
        w.metadata.resource_version = Some("3".into());

        let key = ObjectKey::new("", "blue");
        let mut new = w.clone();
        new.spec = serde_json::json!({"size": 3});
        new.status = Some(serde_json::json!({"seen": 9}));
        let updated = super::prepare_for_update::<WidgetStrategy>(new.clone(), &w, Subresource::Main, &key, V1);
        let updated = updated.unwrap();
        assert_eq!((updated.metadata.generation, updated.status.as_ref()), (Some(2), None));
        assert_eq!(updated.metadata.namespace, None);
        let status = super::prepare_for_update::<WidgetStrategy>(new.clone(), &w, Subresource::Status, &key, V1);
        let status = status.unwrap();
        assert_eq!((status.spec["size"].as_i64(), status.status), (Some(2), Some(serde_json::json!({"seen": 9}))));
        new.spec = serde_json::json!({"size": -1});
        let e = super::prepare_for_update::<WidgetStrategy>(new, &w, Subresource::Main, &key, V1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Widget.test.podset.example \"blue\" is invalid: spec.size: Invalid value: -1: must be greater than or equal to 0"
        );
    }
}
