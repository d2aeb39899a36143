//! What admission reviews of a write: the PodSet itself ([`PODSET`]), or a view of it (`/scale`'s Scale,
//! [`super::scale::SCALE`]), as apiextensions-apiserver's `ScaleREST` shows its subresource to admission. The
//! write path asks the write's view; it names no subresource.

use kube::core::{GroupVersionKind, GroupVersionResource};
use serde_json::Value;

use super::decode::decode_podset;
use super::error::Result;
use super::key::ObjectKey;
use super::options::FieldValidation;
use crate::admission::{Attributes, BoxError, ObjectInterfaces, RequestOptions};
use crate::api::{conversion, Operation, PodSet, Subresource, UserInfo, Version, GROUP, KIND, PLURAL};

/// How admission sees the object of a write, and how what a mutating webhook made of it comes back.
pub(crate) trait View: ObjectInterfaces {
    /// The kind of the objects admission reviews, for a request in `version`.
    fn kind(&self, version: Version) -> GroupVersionKind;

    /// The object admission reviews for `ps`; `None` when that is the PodSet itself, which the caller may have as
    /// JSON already.
    fn review(&self, ps: &PodSet) -> Result<Option<Value>>;

    /// `proposed` with what mutating admission made of its review (a PodSet in `version`).
    fn admitted(&self, proposed: PodSet, object: Value, key: &ObjectKey, version: Version) -> Result<PodSet>;
}

/// A create's or update's body as an audit event records it (kube's `LogRequestObject`): decoded and defaulted in
/// the version it was sent in, as the write's view reads it (`/scale`'s Scale, else the PodSet). `None` if it does
/// not decode; the write then fails on its own.
pub fn request_object(mut body: Value, sub: Subresource) -> Option<Value> {
    let view: &dyn ObjectInterfaces = if sub == Subresource::Scale { &super::scale::SCALE } else { &PODSET };
    view.decode_and_default(&mut body).ok()?;
    Some(body)
}

/// The PodSet itself.
#[derive(Debug)]
pub(crate) struct PodSetView;

pub(crate) static PODSET: PodSetView = PodSetView;

impl ObjectInterfaces for PodSetView {
    fn decode_and_default(&self, object: &mut Value) -> std::result::Result<(), BoxError> {
        let version = conversion::version_of(object).unwrap_or(Version::V1alpha1);
        let mut ps: PodSet = serde_json::from_value(object.clone())?;
        conversion::to_hub(&mut ps, version);
        crate::api::defaults::default_podset(&mut ps, version);
        conversion::from_hub(&mut ps, version);
        *object = serde_json::to_value(ps)?;
        Ok(())
    }

    fn versions(&self) -> &'static [&'static str] {
        &Version::NAMES
    }

    fn convert(&self, object: &mut Value, version: &str) -> std::result::Result<(), BoxError> {
        let from = conversion::version_of(object).unwrap_or(Version::V1alpha1);
        conversion::convert_value(object, from, version.parse()?);
        Ok(())
    }
}

impl View for PodSetView {
    fn kind(&self, version: Version) -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, version.as_str(), KIND)
    }

    fn review(&self, _ps: &PodSet) -> Result<Option<Value>> {
        Ok(None)
    }

    /// Decoded again (unknown fields dropped, as a typed object would drop them); defaults and validation follow.
    fn admitted(&self, _proposed: PodSet, object: Value, _key: &ObjectKey, version: Version) -> Result<PodSet> {
        let (ps, _, _) = decode_podset(object, FieldValidation::Ignore, Some(version))?;
        Ok(ps)
    }
}

/// A write to a PodSet (`sub` of it, seen through `view`) as admission is told of it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attributes(
    view: &'static dyn View,
    version: Version,
    operation: Operation,
    subresource: Subresource,
    namespace: &str,
    name: &str,
    user: UserInfo,
    dry_run: bool,
    options: RequestOptions,
) -> Attributes {
    Attributes {
        operation,
        subresource,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        user,
        dry_run,
        kind: view.kind(version),
        resource: GroupVersionResource::gvr(GROUP, version.as_str(), PLURAL),
        interfaces: view,
        options,
    }
}

/// A write to a PodSet or its `status` or `scale` in `v1alpha1`, as this server describes it to admission: for
/// callers that drive an admission chain themselves (tests comparing it with kube-apiserver's).
pub fn admission_attributes(
    operation: Operation,
    subresource: Subresource,
    namespace: &str,
    name: &str,
    user: UserInfo,
    options: RequestOptions,
) -> Attributes {
    let view: &'static dyn View = match subresource {
        Subresource::Scale => &super::scale::SCALE,
        _ => &PODSET,
    };
    let dry_run = match &options {
        RequestOptions::Write(o) => o.dry_run.is_some(),
        RequestOptions::Delete(o) => o.dry_run.is_some(),
    };
    attributes(view, Version::V1alpha1, operation, subresource, namespace, name, user, dry_run, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patched_podset_or_scale_is_decoded_and_defaulted_again() {
        let mut ps = serde_json::json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "web"}, "spec": {}});
        PODSET.decode_and_default(&mut ps).unwrap();
        assert_eq!(ps["spec"]["replicas"], 1);
        let mut bad = serde_json::json!({"metadata": {"name": "web"}, "spec": {"replicas": "many"}});
        assert!(PODSET.decode_and_default(&mut bad).is_err());
        let mut scale = serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 2}, "extra": 1});
        super::super::scale::SCALE.decode_and_default(&mut scale).unwrap();
        assert_eq!(
            scale,
            serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 2}})
        );
    }
}
