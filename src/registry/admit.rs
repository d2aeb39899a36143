//! A write's admission, as the write path runs it: the chain's mutating phase once on the object as proposed,
//! its validating phase once on the object as it is to be stored, each through the write's view (the object, or
//! `/scale`'s Scale). Nothing is built for admission when no plugin runs, and no object when no plugin reads one.

use serde_json::Value;

use super::decode::versioned_value;
use super::error::Result;
use super::key::ObjectKey;
use super::strategy::Strategy;
use super::view::View;
use crate::admission::{Admission, Attributes, ObjectReads, Outcome};
use crate::api::resource::ServedVersion;

/// One write's admission: its attributes (none when no plugin runs), and what the plugins said.
pub(crate) struct Review<'r, S: Strategy> {
    admission: &'r dyn Admission,
    view: &'static dyn View<S>,
    attrs: Option<Attributes>,
    /// In which phases a plugin may read the objects; in the others, none are built.
    reads: ObjectReads,
    /// The request's version: the one admission sees objects in.
    version: S::Version,
    pub said: Outcome,
}

impl<'r, S: Strategy> Review<'r, S> {
    pub fn new(
        admission: &'r dyn Admission,
        view: &'static dyn View<S>,
        attrs: impl FnOnce() -> Attributes,
        warnings: Vec<String>,
        version: S::Version,
    ) -> Self {
        let attrs = admission.runs().then(attrs);
        let reads = attrs.as_ref().map(|a| admission.reads_objects(a)).unwrap_or_default();
        Self { admission, view, attrs, reads, version, said: Outcome { warnings, ..Default::default() } }
    }

    /// The object admission reviews for `o`: its view, else `json` (the object as JSON in any version, made only
    /// if needed) in the request's version.
    fn object(&self, o: &S::Object, json: impl FnOnce() -> Result<Value>) -> Result<Value> {
        match self.view.review(o)? {
            Some(v) => Ok(v),
            None => Ok(self.in_request_version(json()?)),
        }
    }

    fn in_request_version(&self, mut v: Value) -> Value {
        let from = S::INFO.version_of_value(&v);
        S::INFO.convert_value(&mut v, from, self.version.to_index());
        v
    }

    /// The stored object `old` as admission sees it, when the plugins read it; `json` is `old` as JSON.
    pub fn old(&self, old: &S::Object, json: impl FnOnce() -> Result<Value>) -> Result<Option<Value>> {
        match self.reads.any() {
            true => self.object(old, json).map(Some),
            false => Ok(None),
        }
    }

    /// The mutating phase: `proposed` becomes what the plugins left of it. `old` is [`Review::old`]'s. The
    /// object is changed in place: held by value, it would make every write's future some kilobytes larger, and
    /// futures are moved whole.
    pub async fn admit(&mut self, proposed: &mut S::Object, old: Option<&Value>, key: &ObjectKey) -> Result<()> {
        let Some(a) = &self.attrs else { return Ok(()) };
        if !self.reads.admit {
            return Ok(Box::pin(self.admission.admit(a, None, None, &mut self.said)).await?);
        }
        let mut object = self.object(proposed, || versioned_value::<S>(proposed, self.version))?;
        let sent = object.clone();
        // Boxed: a webhook call's future is large, and held inline it would be copied with every write's.
        Box::pin(self.admission.admit(a, Some(&mut object), old, &mut self.said)).await?;
        if object != sent {
            *proposed = self.view.admitted(std::mem::take(proposed), object, key, self.version)?;
        }
        Ok(())
    }

    /// The validating phase, on `o` as it is to be stored (`json`: it as JSON, made only if read).
    pub async fn validate(
        &mut self,
        o: &S::Object,
        json: impl FnOnce() -> Result<Value>,
        old: Option<&Value>,
    ) -> Result<()> {
        let Some(a) = &self.attrs else { return Ok(()) };
        let object = match self.reads.validate {
            true => Some(self.object(o, json)?),
            false => None,
        };
        Ok(Box::pin(self.admission.validate(a, object.as_ref(), old, &mut self.said)).await?)
    }

    /// Both phases of a delete: no new object, and the one that goes as the old one (`old`: it as JSON, made only
    /// if read), as kube-apiserver 1.20's `AdmissionToValidateObjectDeleteFunc`.
    pub async fn delete(&mut self, old: impl FnOnce() -> Result<Value>) -> Result<()> {
        let Some(a) = &self.attrs else { return Ok(()) };
        let old = match self.reads.any() {
            true => Some(self.in_request_version(old()?)),
            false => None,
        };
        Box::pin(self.admission.admit(a, None, old.as_ref(), &mut self.said)).await?;
        Ok(Box::pin(self.admission.validate(a, None, old.as_ref(), &mut self.said)).await?)
    }
}
