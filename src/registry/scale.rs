//! The `/scale` subresource, a view over the object (apiextensions-apiserver's `ScaleREST`): an object seen as an
//! `autoscaling/v1` Scale through its resource's [`ScaleAccessor`], so `kubectl scale` and autoscalers work. A
//! Scale write becomes a change of the object ([`scaled`]) before the generic write, and admission reviews Scales
//! ([`ScaleView`]).

use std::marker::PhantomData;

use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec, ScaleStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::decode::{apply_patch, check_type};
use super::error::{Error, Result};
use super::key::ObjectKey;
use super::options::{ScaleChange, WriteOptions};
use super::strategy::{check_identity, Strategy};
use super::view::View;
use super::write::{Change, Write};
use super::{Registry, Revision, Written};
use crate::admission::{ApplyConfigurationError, BoxError, ObjectInterfaces, WriteKind};
use crate::api::resource::VersionInfo;
use crate::api::validation::FieldError;
use crate::api::{Operation, Subresource};

/// Where a resource with `/scale` keeps its replicas and selector (a CRD's `specReplicasPath`,
/// `statusReplicasPath` and `labelSelectorPath`).
pub trait ScaleAccessor<O>: Send + Sync + 'static {
    fn spec_replicas(&self, o: &O) -> Option<i32>;
    fn set_spec_replicas(&self, o: &mut O, replicas: i32);
    fn status_replicas(&self, o: &O) -> i32;
    /// The label selector of what it scales, as a string (`status.selector`).
    fn selector(&self, o: &O) -> Option<String>;
}

fn accessor<S: Strategy>() -> Result<&'static dyn ScaleAccessor<S::Object>> {
    S::scale().ok_or_else(|| Error::bad_request(format!("{} has no scale subresource", S::INFO)))
}

impl<S: Strategy> Registry<S> {
    /// GET of `/scale`.
    pub async fn get_scale(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Scale> {
        let scale = accessor::<S>()?;
        Ok(scale_of::<S>(scale, &self.get(key, resource_version).await?.decode::<S>()?))
    }

    /// PUT or PATCH of `/scale`: only `spec.replicas` changes. Returns the Scale as written.
    pub async fn update_scale(&self, key: &ObjectKey, change: ScaleChange<'_>, opts: &WriteOptions) -> Result<Scale> {
        let scale = accessor::<S>()?;
        let options = match change {
            ScaleChange::Replace(_) => WriteKind::Update,
            ScaleChange::Patch(..) => WriteKind::Patch,
        };
        let version = self.write_version(opts);
        let view = ScaleView::<S>::NEW;
        let w = Write { op: Operation::Update, sub: Subresource::Scale, key, opts, options, view, version };
        let written = self
            .write(&w, |current| {
                let Some((old, _)) = current else { return Err(Error::not_found(S::INFO, &key.name)) };
                Ok(Change::update(scaled::<S>(scale, old, &change, key)?, Vec::new()))
            })
            .await
            .map(Written::from)?;
        Ok(scale_of::<S>(scale, &written.object.decode::<S>()?))
    }
}

pub(crate) fn scale_of<S: Strategy>(scale: &dyn ScaleAccessor<S::Object>, o: &S::Object) -> Scale {
    let m = S::meta(o);
    Scale {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            creation_timestamp: m.creation_timestamp.clone(),
            ..Default::default()
        },
        spec: Some(ScaleSpec { replicas: scale.spec_replicas(o) }),
        status: Some(ScaleStatus { replicas: scale.status_replicas(o), selector: scale.selector(o) }),
    }
}

/// The `/scale` view of `o` as JSON, as admission and a Scale patch see it.
fn scale_value<S: Strategy>(scale: &dyn ScaleAccessor<S::Object>, o: &S::Object) -> Result<serde_json::Value> {
    to_value(&scale_of::<S>(scale, o))
}

/// The object a `/scale` write makes of `old`: only `spec.replicas` changes; a resourceVersion in the Scale is a
/// precondition.
fn scaled<S: Strategy>(
    scale: &dyn ScaleAccessor<S::Object>,
    old: &S::Object,
    change: &ScaleChange<'_>,
    key: &ObjectKey,
) -> Result<S::Object> {
    let scale_value = match change {
        ScaleChange::Replace(body) => body.clone(),
        ScaleChange::Patch(patch, patch_type) => {
            let mut doc = scale_value::<S>(scale, old)?;
            apply_patch(&mut doc, patch, *patch_type)?;
            doc
        }
    };
    check_type(&scale_value, "autoscaling/v1", "Scale")?;
    let sent: Scale = serde_json::from_value(scale_value)
        .map_err(|e| Error::bad_request(format!("Scale in version \"v1\" cannot be handled as a Scale: {e}")))?;
    check_identity(&sent.metadata, key)?;
    let replicas = sent.spec.and_then(|s| s.replicas).unwrap_or(0);
    if replicas < 0 {
        return Err(Error::invalid_kind(
            "Scale.autoscaling",
            &key.name,
            vec![FieldError::invalid("spec.replicas", replicas, "must be greater than or equal to 0")],
        ));
    }
    let mut new = old.clone();
    scale.set_spec_replicas(&mut new, replicas);
    let meta = S::meta_mut(&mut new);
    meta.resource_version = sent.metadata.resource_version;
    meta.managed_fields = None;
    Ok(new)
}

/// Admission's view of a `/scale` write: Scales.
pub(crate) struct ScaleView<S>(PhantomData<S>);

impl<S: Strategy> ScaleView<S> {
    pub const NEW: &'static ScaleView<S> = &ScaleView(PhantomData);
}

impl<S> std::fmt::Debug for ScaleView<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScaleView")
    }
}

impl<S: Strategy> ObjectInterfaces for ScaleView<S> {
    fn decode_and_default(&self, object: &mut serde_json::Value) -> std::result::Result<(), BoxError> {
        let scale: Scale = serde_json::from_value(object.clone())?;
        let mut v = serde_json::to_value(scale)?;
        // k8s-openapi's Scale leaves out apiVersion and kind; keep the ones the object had.
        for k in ["apiVersion", "kind"] {
            if let (Some(m), Some(t)) = (v.as_object_mut(), object.get(k)) {
                m.insert(k.into(), t.clone());
            }
        }
        *object = v;
        Ok(())
    }

    fn versions(&self) -> &'static [VersionInfo] {
        S::INFO.versions
    }

    /// Refused as kube-apiserver refuses it: its policies read a kind's schema from the OpenAPI of the kind's own
    /// group version, and `autoscaling/v1`'s (HorizontalPodAutoscalers) has no Scale, which only the documents of
    /// the groups serving `/scale` carry. A JSON patch mutation works on a Scale.
    fn apply_configuration(
        &self,
        _object: &serde_json::Value,
        _patch: &serde_json::Value,
    ) -> std::result::Result<serde_json::Value, ApplyConfigurationError> {
        Err(ApplyConfigurationError::Patch(
            "failed to convert patch object to typed object: no corresponding type for autoscaling/v1, Kind=Scale"
                .to_owned(),
        ))
    }
}

impl<S: Strategy> View<S> for ScaleView<S> {
    fn kind(&self, _version: S::Version) -> kube::core::GroupVersionKind {
        kube::core::GroupVersionKind::gvk("autoscaling", "v1", "Scale")
    }

    fn review(&self, o: &S::Object) -> Result<Option<serde_json::Value>> {
        scale_value::<S>(accessor::<S>()?, o).map(Some)
    }

    /// The Scale a mutating webhook left: its `spec.replicas` taken as a `/scale` write would take it.
    fn admitted(
        &self,
        proposed: S::Object,
        object: serde_json::Value,
        key: &ObjectKey,
        _version: S::Version,
    ) -> Result<S::Object> {
        scaled::<S>(accessor::<S>()?, &proposed, &ScaleChange::Replace(object), key)
    }
}

fn to_value(scale: &Scale) -> Result<serde_json::Value> {
    serde_json::to_value(scale).map_err(|e| Error::internal(e.to_string()))
}
