//! PodSet's strategy, as kube's ReplicaSet strategy: a create clears status, the main resource never writes status
//! and `/status` writes nothing else, `generation` follows the spec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::defaults::default_podset;
use super::{validation, PodSet, Version, INFO};
use crate::api::resource::ResourceInfo;
use crate::api::validation::FieldError;
use crate::registry::strategy::Strategy;

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
