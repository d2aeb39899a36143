//! What admission reviews of a write: the object itself ([`ObjectView`]), or a view of it (`/scale`'s Scale,
//! [`super::scale::ScaleView`]), as apiextensions-apiserver's `ScaleREST` shows its subresource to admission. The
//! write path asks the write's view; it names no subresource.

use std::marker::PhantomData;

use kube::core::{GroupVersionKind, GroupVersionResource};
use serde::Deserialize as _;
use serde_json::Value;

use super::decode::decode_object;
use super::error::Result;
use super::key::ObjectKey;
use super::options::FieldValidation;
use super::strategy::{typed, Strategy};
use crate::admission::{ApplyConfigurationError, Attributes, BoxError, ObjectInterfaces, RequestOptions};
use crate::api::resource::{ServedVersion, VersionInfo};
use crate::api::{Operation, Subresource, UserInfo};

/// How admission sees the object of a write, and how what a mutating webhook made of it comes back.
pub(crate) trait View<S: Strategy>: ObjectInterfaces {
    /// The kind of the objects admission reviews, for a request in `version`.
    fn kind(&self, version: S::Version) -> GroupVersionKind;

    /// The object admission reviews for `o`; `None` when that is the object itself, which the caller may have as
    /// JSON already.
    fn review(&self, o: &S::Object) -> Result<Option<Value>>;

    /// `proposed` with what mutating admission made of its review (an object in `version`).
    fn admitted(&self, proposed: S::Object, object: Value, key: &ObjectKey, version: S::Version) -> Result<S::Object>;
}

/// A create's or update's body as an audit event records it (kube's `LogRequestObject`): decoded and defaulted in
/// the version it was sent in, as the write's view reads it (`/scale`'s Scale, else the object). `None` if it does
/// not decode; the write then fails on its own.
pub fn request_object<S: Strategy>(mut body: Value, sub: Subresource) -> Option<Value> {
    view_of::<S>(sub).decode_and_default(&mut body).ok()?;
    Some(body)
}

/// How admission sees a write to `sub`.
fn view_of<S: Strategy>(sub: Subresource) -> &'static dyn View<S> {
    match sub {
        Subresource::Scale => super::scale::ScaleView::<S>::NEW,
        _ => ObjectView::<S>::NEW,
    }
}

/// The object itself.
pub(crate) struct ObjectView<S>(PhantomData<S>);

impl<S: Strategy> ObjectView<S> {
    pub const NEW: &'static ObjectView<S> = &ObjectView(PhantomData);
}

impl<S> std::fmt::Debug for ObjectView<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectView")
    }
}

/// `o`, decoded from `object`, defaulted in its version and written back into `object`.
fn defaulted<S: Strategy>(mut o: S::Object, object: &mut Value) -> std::result::Result<(), BoxError> {
    let version = typed::<S>(S::INFO.version_of_value(object));
    S::to_hub(&mut o, version);
    S::default(&mut o, version);
    S::from_hub(&mut o, version);
    *object = serde_json::to_value(o)?;
    Ok(())
}

impl<S: Strategy> ObjectInterfaces for ObjectView<S> {
    fn decode_and_default(&self, object: &mut Value) -> std::result::Result<(), BoxError> {
        // Read in place, not from a copy: the object is replaced by its defaulted self after.
        let o = S::Object::deserialize(&*object)?;
        defaulted::<S>(o, object)
    }

    fn decode_and_default_strict(&self, object: &mut Value) -> std::result::Result<(), BoxError> {
        let o: S::Object = crate::api::strict::decode_strict_json(object)?;
        defaulted::<S>(o, object)
    }

    fn versions(&self) -> &'static [VersionInfo] {
        S::INFO.versions
    }

    fn convert(&self, object: &mut Value, version: &str) -> std::result::Result<(), BoxError> {
        let from = S::INFO.version_of_value(object);
        let to = S::INFO
            .versions
            .iter()
            .position(|v| v.name == version)
            .ok_or_else(|| format!("{version:?} is not a version of {}", S::INFO.group))?;
        S::INFO.convert_value(object, from, crate::api::resource::VersionIndex(to as u8));
        Ok(())
    }

    /// Merged by the schema the server publishes for the object's version, as kube's type converter reads it
    /// from the OpenAPI of that group version.
    fn apply_configuration(
        &self,
        object: &Value,
        patch: &Value,
    ) -> std::result::Result<Value, ApplyConfigurationError> {
        let schema = S::field_manager(typed::<S>(S::INFO.version_of_value(object))).schema();
        super::fieldmanager::apply_configuration(schema, object, patch).map_err(ApplyConfigurationError::Patch)
    }
}

impl<S: Strategy> View<S> for ObjectView<S> {
    fn kind(&self, version: S::Version) -> GroupVersionKind {
        GroupVersionKind::gvk(S::INFO.group, S::INFO.version(version.to_index()).name, S::INFO.kind)
    }

    fn review(&self, _o: &S::Object) -> Result<Option<Value>> {
        Ok(None)
    }

    /// Decoded again (unknown fields dropped, as a typed object would drop them); defaults and validation follow.
    fn admitted(
        &self,
        _proposed: S::Object,
        object: Value,
        _key: &ObjectKey,
        version: S::Version,
    ) -> Result<S::Object> {
        let (o, _, _) = decode_object::<S>(object, FieldValidation::Ignore, Some(version))?;
        Ok(o)
    }
}

/// A write to an object of `S` (`sub` of it, seen through `view`) as admission is told of it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attributes<S: Strategy>(
    view: &'static dyn View<S>,
    version: S::Version,
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
        resource: GroupVersionResource::gvr(S::INFO.group, S::INFO.version(version.to_index()).name, S::INFO.plural),
        interfaces: view,
        options,
    }
}

/// A write to an object of `S` or its `status` or `scale` in `version`, as this server describes it to admission:
/// for callers that drive an admission chain themselves (tests comparing it with kube-apiserver's).
pub fn admission_attributes<S: Strategy>(
    version: S::Version,
    operation: Operation,
    subresource: Subresource,
    namespace: &str,
    name: &str,
    user: UserInfo,
    options: RequestOptions,
) -> Attributes {
    let view = view_of::<S>(subresource);
    let dry_run = match &options {
        RequestOptions::Write(o) => o.dry_run.is_some(),
        RequestOptions::Delete(o) => o.dry_run.is_some(),
    };
    attributes(view, version, operation, subresource, namespace, name, user, dry_run, options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::podset::PodSetStrategy;

    #[test]
    fn a_patched_podset_or_scale_is_decoded_and_defaulted_again() {
        let mut ps = serde_json::json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": "web"}, "spec": {}});
        ObjectView::<PodSetStrategy>::NEW.decode_and_default(&mut ps).unwrap();
        assert_eq!(ps["spec"]["replicas"], 1);
        let mut bad = serde_json::json!({"metadata": {"name": "web"}, "spec": {"replicas": "many"}});
        assert!(ObjectView::<PodSetStrategy>::NEW.decode_and_default(&mut bad).is_err());
        let mut scale = serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 2}, "extra": 1});
        super::super::scale::ScaleView::<PodSetStrategy>::NEW.decode_and_default(&mut scale).unwrap();
        assert_eq!(
            scale,
            serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 2}})
        );
    }

    fn podset(version: &str) -> Value {
        let mut ps = serde_json::json!({"apiVersion": format!("demo.k8s.io/{version}"), "kind": "PodSet",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "main", "image": "nginx"}]}}}});
        ObjectView::<PodSetStrategy>::NEW.decode_and_default(&mut ps).unwrap();
        ps
    }

    #[test]
    fn a_podset_merges_an_apply_configuration_by_the_schema_of_its_version() {
        use crate::admission::mutation::apply_configuration;
        let view = ObjectView::<PodSetStrategy>::NEW;
        let live = podset("v1alpha1");
        let patch = serde_json::json!({"metadata": {"labels": {"team": "a"}}, "spec": {"replicas": 3}});
        let mut merged = apply_configuration(view, &live, &patch).unwrap();
        view.decode_and_default(&mut merged).unwrap();
        assert_eq!(merged["metadata"]["labels"], serde_json::json!({"app": "web", "team": "a"}));
        assert_eq!(merged["spec"]["replicas"], 3);
        assert_eq!(merged["spec"]["template"], live["spec"]["template"]);
        // v1alpha1 keeps minReadySeconds in an annotation; v1beta1 has the field.
        let min_ready = serde_json::json!({"spec": {"minReadySeconds": 5}});
        assert_eq!(
            apply_configuration(view, &live, &min_ready).unwrap_err().to_string(),
            "error applying patch: failed to convert patch object to typed object: .spec.minReadySeconds: field not \
             declared in schema"
        );
        let beta = apply_configuration(view, &podset("v1beta1"), &min_ready).unwrap();
        assert_eq!(beta["spec"]["minReadySeconds"], 5);
        assert_eq!(
            apply_configuration(view, &live, &serde_json::json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}))
                .unwrap_err()
                .to_string(),
            "error applying patch: invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: .spec.selector"
        );
        // A scalar of the wrong kind merges, and the decode that follows every merge refuses it.
        let mut many = apply_configuration(view, &live, &serde_json::json!({"spec": {"replicas": "many"}})).unwrap();
        assert!(view.decode_and_default(&mut many).is_err());
    }

    #[test]
    fn a_scale_takes_no_apply_configuration_as_in_kube_apiserver() {
        let scale = serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"},
                                       "spec": {"replicas": 2}});
        let e = crate::admission::mutation::apply_configuration(
            super::super::scale::ScaleView::<PodSetStrategy>::NEW,
            &scale,
            &serde_json::json!({"spec": {"replicas": 3}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "error applying patch: failed to convert patch object to typed object: no corresponding type for \
             autoscaling/v1, Kind=Scale"
        );
    }
}
