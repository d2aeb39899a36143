//! PodSet's strategy, as kube's ReplicaSet strategy: a create clears status, the main resource never writes status
//! and `/status` writes nothing else, `generation` follows the spec; its versions convert through the hub.

use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use super::defaults::default_podset;
use super::schema::{component_schemas, podset_definition};
use super::{conversion, validation, PodSet, Version, INFO};
use crate::api::resource::ResourceInfo;
use crate::api::validation::FieldError;
use crate::registry::fieldmanager::{FieldManager, ResetFields};
use crate::registry::strategy::Strategy;
use crate::registry::{MigrationMetrics, ScaleAccessor};

/// What each subresource never writes: the main resource status, `/status` all else, `/scale` all but
/// `spec.replicas` (kube's ReplicaSet reset fields).
pub static RESET_FIELDS: ResetFields = ResetFields {
    main: &[&["status"]],
    status: &[&["metadata"], &["spec"]],
    scale: &[&["metadata"], &["status"], &["spec", "selector"], &["spec", "template"]],
};

pub struct PodSetStrategy;

impl Strategy for PodSetStrategy {
    type Object = PodSet;
    type Version = Version;

    const INFO: &'static ResourceInfo = &INFO;
    const STORAGE_VERSION: Version = Version::STORAGE;

    fn meta(o: &PodSet) -> &ObjectMeta {
        &o.metadata
    }

    fn meta_mut(o: &mut PodSet) -> &mut ObjectMeta {
        &mut o.metadata
    }

    fn type_fields(o: &mut PodSet) -> (&mut String, &mut String) {
        (&mut o.api_version, &mut o.kind)
    }

    fn to_hub(o: &mut PodSet, from: Version) {
        conversion::to_hub(o, from);
    }

    fn from_hub(o: &mut PodSet, to: Version) {
        conversion::from_hub(o, to);
    }

    /// `v1alpha1` has no `spec.minReadySeconds` (only its annotation), which the hub would take.
    fn absent_fields(version: Version, body: &mut Value) -> Vec<String> {
        let spec = body.get_mut("spec").and_then(Value::as_object_mut).filter(|_| version == Version::V1alpha1);
        match spec.and_then(|s| s.remove("minReadySeconds")) {
            Some(_) => vec!["spec.minReadySeconds".to_owned()],
            None => Vec::new(),
        }
    }

    fn decodes_directly(version: Version, body: &[u8]) -> bool {
        version != Version::V1alpha1 || conversion::version_neutral(body)
    }

    fn convert_fields(fields: &mut Value, from: Version, to: Version) {
        conversion::convert_fields(fields, from, to);
    }

    /// Merged by the schema the server publishes for `version`.
    fn field_manager(version: Version) -> &'static FieldManager {
        static FM: [OnceLock<FieldManager>; Version::ALL.len()] = [const { OnceLock::new() }; Version::ALL.len()];
        FM[version.index()].get_or_init(|| {
            // The parts of a PodSet that, like a Deployment's non-pointer structs, always exist: writes compared
            // against them never own them as nodes of their own.
            let skeleton = json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": null}}},
                                  "status": {}});
            let (schemas, root) = (component_schemas(version), podset_definition(version));
            FieldManager::new(&schemas, &root, version.api_version(), skeleton, &RESET_FIELDS)
        })
    }

    fn scale() -> Option<&'static dyn ScaleAccessor<PodSet>> {
        Some(&Replicas)
    }

    fn migration_metrics() -> Option<&'static dyn MigrationMetrics> {
        Some(super::metrics::metrics())
    }

    fn prepare_for_create(o: &mut PodSet) {
        o.status = None;
    }

    fn default(o: &mut PodSet, version: Version) {
        default_podset(o, version);
    }

    fn validate(o: &PodSet, _version: Version) -> Vec<FieldError> {
        validation::validate(o)
    }

    fn prepare_for_update(new: &mut PodSet, old: &PodSet) {
        new.status = old.status.clone();
    }

    fn validate_update(new: &PodSet, old: &PodSet, _version: Version) -> Vec<FieldError> {
        validation::validate_update(new, old)
    }

    fn prepare_for_status_update(new: &mut PodSet, old: &PodSet) {
        let status = new.status.take();
        *new = PodSet { status, ..old.clone() };
    }

    fn validate_status_update(new: &PodSet, _old: &PodSet) -> Vec<FieldError> {
        validation::validate_status_update(new)
    }

    fn spec_changed(new: &PodSet, old: &PodSet) -> bool {
        new.spec != old.spec
    }
}

/// `/scale` reads and writes `spec.replicas`, `status.replicas` and the selector, as a ReplicaSet's.
struct Replicas;

impl ScaleAccessor<PodSet> for Replicas {
    fn spec_replicas(&self, o: &PodSet) -> Option<i32> {
        o.spec.replicas
    }

    fn set_spec_replicas(&self, o: &mut PodSet, replicas: i32) {
        o.spec.replicas = Some(replicas);
    }

    fn status_replicas(&self, o: &PodSet) -> i32 {
        o.status.as_ref().map(|s| s.replicas).unwrap_or(0)
    }

    fn selector(&self, o: &PodSet) -> Option<String> {
        o.selector().map(|s| s.to_string())
    }
}
