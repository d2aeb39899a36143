//! The `/scale` subresource, a view over the PodSet (apiextensions-apiserver's `ScaleREST`): a PodSet seen as an
//! `autoscaling/v1` Scale, so `kubectl scale` and autoscalers work. A Scale write becomes a PodSet change
//! ([`scaled`]) before the generic write, and admission reviews Scales ([`SCALE`]).

use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec, ScaleStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::decode::{apply_patch, check_type};
use super::error::{Error, Result};
use super::key::ObjectKey;
use super::options::{ScaleChange, WriteOptions};
use super::strategy::{check_identity, typed};
use super::view::View;
use super::write::{Change, Write};
use super::{Registry, Revision, Written};
use crate::admission::{BoxError, ObjectInterfaces, WriteKind};
use crate::api::validation::FieldError;
use crate::api::{Operation, PodSet, Subresource};
use crate::resources::podset::{PodSetStrategy, INFO};

impl Registry<PodSetStrategy> {
    /// GET of `/scale`.
    pub async fn get_scale(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Scale> {
        Ok(scale_of(&self.get(key, resource_version).await?.decode::<PodSetStrategy>()?))
    }

    /// PUT or PATCH of `/scale`: only `spec.replicas` changes. Returns the Scale as written.
    pub async fn update_scale(&self, key: &ObjectKey, change: ScaleChange<'_>, opts: &WriteOptions) -> Result<Scale> {
        let options = match change {
            ScaleChange::Replace(_) => WriteKind::Update,
            ScaleChange::Patch(..) => WriteKind::Patch,
        };
        let version = opts.version.map(typed::<PodSetStrategy>).unwrap_or(self.storage_version);
        let w = Write { op: Operation::Update, sub: Subresource::Scale, key, opts, options, view: &SCALE, version };
        let written = self
            .write(&w, |current| {
                let Some((old, _)) = current else { return Err(Error::not_found(&INFO, &key.name)) };
                Ok(Change::update(scaled(old, &change, key)?, Vec::new()))
            })
            .await
            .map(Written::from)?;
        Ok(scale_of(&written.object.decode::<PodSetStrategy>()?))
    }
}

pub(crate) fn scale_of(ps: &PodSet) -> Scale {
    let selector = ps.selector().map(|s| s.to_string());
    let m = &ps.metadata;
    Scale {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            creation_timestamp: m.creation_timestamp.clone(),
            ..Default::default()
        },
        spec: Some(ScaleSpec { replicas: ps.spec.replicas }),
        status: Some(ScaleStatus { replicas: ps.status.as_ref().map(|s| s.replicas).unwrap_or(0), selector }),
    }
}

/// The `/scale` view of `ps` as JSON, as admission and a Scale patch see it.
pub(crate) fn scale_value(ps: &PodSet) -> Result<serde_json::Value> {
    to_value(&scale_of(ps))
}

/// The PodSet a `/scale` write makes of `old`: only `spec.replicas` changes; a resourceVersion in the Scale is a
/// precondition.
pub(crate) fn scaled(old: &PodSet, change: &ScaleChange<'_>, key: &ObjectKey) -> Result<PodSet> {
    let scale_value = match change {
        ScaleChange::Replace(body) => body.clone(),
        ScaleChange::Patch(patch, patch_type) => {
            let mut doc = scale_value(old)?;
            apply_patch(&mut doc, patch, *patch_type)?;
            doc
        }
    };
    check_type(&scale_value, "autoscaling/v1", "Scale")?;
    let scale: Scale = serde_json::from_value(scale_value)
        .map_err(|e| Error::bad_request(format!("Scale in version \"v1\" cannot be handled as a Scale: {e}")))?;
    check_identity(&scale.metadata, key)?;
    let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
    if replicas < 0 {
        return Err(Error::invalid_kind(
            "Scale.autoscaling",
            &key.name,
            vec![FieldError::invalid("spec.replicas", replicas, "must be greater than or equal to 0")],
        ));
    }
    let mut new = old.clone();
    new.spec.replicas = Some(replicas);
    new.metadata.resource_version = scale.metadata.resource_version;
    new.metadata.managed_fields = None;
    Ok(new)
}

/// Admission's view of a `/scale` write: Scales.
#[derive(Debug)]
pub(crate) struct ScaleView;

pub(crate) static SCALE: ScaleView = ScaleView;

impl ObjectInterfaces for ScaleView {
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

    fn versions(&self) -> &'static [crate::api::resource::VersionInfo] {
        &crate::api::Version::INFOS
    }
}

impl View<PodSetStrategy> for ScaleView {
    fn kind(&self, _version: crate::api::Version) -> kube::core::GroupVersionKind {
        kube::core::GroupVersionKind::gvk("autoscaling", "v1", "Scale")
    }

    fn review(&self, ps: &PodSet) -> Result<Option<serde_json::Value>> {
        scale_value(ps).map(Some)
    }

    /// The Scale a mutating webhook left: its `spec.replicas` taken as a `/scale` write would take it.
    fn admitted(
        &self,
        proposed: PodSet,
        object: serde_json::Value,
        key: &ObjectKey,
        _version: crate::api::Version,
    ) -> Result<PodSet> {
        scaled(&proposed, &ScaleChange::Replace(object), key)
    }
}

fn to_value(scale: &Scale) -> Result<serde_json::Value> {
    serde_json::to_value(scale).map_err(|e| Error::internal(e.to_string()))
}
