//! The one write path, as kube-apiserver's `Store` over `GuaranteedUpdate`: every update, patch, apply, status and
//! scale write and delete reads the current object (a create, a POST, reads nothing), asks its caller what to make
//! of it, and stores that with compare-and-swap, retrying on fresh state when another write raced. System fields,
//! defaulting and validation (`strategy`), preconditions, admission (`admit`, through the write's `view`), field
//! tracking, graceful deletion and dry run happen here, once. The only other writer is a restore into an empty
//! store (`restore.rs`).

use serde_json::Value;

use super::admit::Review;
use super::decode::versioned_value;
use super::error::{Error, Result};
use super::fieldmanager;
use super::key::ObjectKey;
use super::managed::{created_in_version, created_managed_fields, manage_fields_in, sent_managed_fields};
use super::options::{DeleteOptions, Preconditions, WriteOptions};
use super::stored::Stored;
use super::strategy::{self, now, Strategy};
use super::view::{self, View};
use super::Registry;
use crate::admission::{Outcome as Said, RequestOptions, WriteKind};
use crate::api::resource::ResourceInfo;
use crate::api::validation::{ErrorType, FieldError};
use crate::api::{Operation, Subresource};
use crate::storage::{Draft, StorageError};

/// Attempts at a read-modify-write before giving up on a hot object.
const MAX_RETRIES: usize = 32;

/// One write: what it does, to which part of which object, and how and by whom it is made.
pub(crate) struct Write<'a, S: Strategy> {
    /// `Create` is a POST: it reads nothing first. `Update` reads the current object, and may still create one
    /// (an apply to an object that does not exist).
    pub op: Operation,
    pub sub: Subresource,
    /// For a POST, the namespace (the name is the body's, or generated).
    pub key: &'a ObjectKey,
    pub opts: &'a WriteOptions,
    /// What admission is told the request's options were: `UpdateOptions` or `PatchOptions` (a create's are
    /// always `CreateOptions`, a delete's `DeleteOptions`).
    pub options: WriteKind,
    /// What admission reviews: the object, or a view of it (`/scale`'s Scale).
    pub view: &'static dyn View<S>,
    /// The version the request was made in: what defaults apply, and what admission sees.
    pub version: S::Version,
}

/// What a write makes of the current object.
pub(crate) enum Change<'a, S: Strategy> {
    /// Store this object: a create when there is no current one, else an update of it.
    Put(Box<Proposed<S>>),
    /// Delete the current object as the options say: at once, or marked while finalizers hold it. An item of a
    /// deletecollection (`collection`) is named to admission by no name, as kube-apiserver names it.
    Delete { options: &'a DeleteOptions, collection: bool },
}

/// An object a write proposes, before the server's fields, defaults and validation.
pub(crate) struct Proposed<S: Strategy> {
    pub object: S::Object,
    pub warnings: Vec<String>,
    /// How field management records the write: `Update` still to be recorded, `Apply` merged by the apply.
    pub fields: fieldmanager::Operation,
}

impl<S: Strategy> Change<'_, S> {
    /// Store `object`, recording the write in managedFields.
    pub fn update(object: S::Object, warnings: Vec<String>) -> Self {
        Change::Put(Box::new(Proposed { object, warnings, fields: fieldmanager::Operation::Update }))
    }

    /// Store `object`, which an apply merged and recorded already.
    pub fn applied(object: S::Object, warnings: Vec<String>) -> Self {
        Change::Put(Box::new(Proposed { object, warnings, fields: fieldmanager::Operation::Apply }))
    }
}

/// What a write did, and what it earned besides: warnings for the client, annotations for the audit event.
pub(crate) enum Outcome {
    /// Created or updated (or found unchanged, or a dry run): the object as stored, or as it would be.
    Put { object: Stored, said: Said, created: bool },
    /// Deleted (`gone`), or marked for deletion while finalizers hold it.
    Deleted { object: Stored, said: Said, gone: bool },
}

/// What one attempt decided.
enum Step {
    /// Nothing to store: the object is as asked already.
    Done(Outcome),
    Store(Plan),
}

/// What one attempt is about to store.
enum Plan {
    /// `generated`: the name came from `generateName`, so a name taken meanwhile means "pick another".
    Create {
        key: ObjectKey,
        value: Value,
        managed_fields: Option<String>,
        said: Said,
        generated: bool,
    },
    Update {
        value: Value,
        said: Said,
    },
    /// Mark for deletion (finalizers still hold the object).
    Mark {
        value: Value,
        said: Said,
    },
    /// Delete now: on a delete (`put` is `None`), or on an update that removed the last finalizer of an object
    /// marked for deletion (`put` holds that update's object). `was` is the object as read.
    Remove {
        was: Stored,
        said: Said,
        put: Option<Value>,
    },
}

impl Preconditions {
    /// `storage.Preconditions.Check`: the object must still be the one the caller means.
    pub(crate) fn check(&self, current: &Stored, name: &str) -> Result<()> {
        let (uid, resource) = (current.uid().unwrap_or(""), current.resource());
        if let Some(want) = self.uid.as_deref().filter(|u| !u.is_empty() && *u != uid) {
            return Err(Error::conflict(
                resource,
                name,
                format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
            ));
        }
        let rv = current.resource_version();
        if let Some(want) = self.resource_version.as_deref().filter(|want| *want != rv.to_string()) {
            return Err(Error::conflict(
                resource,
                name,
                format!("Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"),
            ));
        }
        Ok(())
    }
}

impl<S: Strategy> Registry<S> {
    /// The one write function: `change` turns the current object (`None`: there is none) into what to store.
    pub(crate) async fn write<'o, F>(&self, w: &Write<'_, S>, mut change: F) -> Result<Outcome>
    where
        F: FnMut(Option<(&S::Object, &Stored)>) -> Result<Change<'o, S>>,
    {
        let info: &'static ResourceInfo = S::INFO;
        let mut synced = false;
        for _ in 0..MAX_RETRIES {
            let current = match w.op {
                Operation::Create => None,
                _ => self.get_for_write(w.key).await?.map(|o| Stored::new(o, info)),
            };
            // An object may be kilobytes: boxed, with each step's future, so that the futures of every write and of
            // the handlers above it stay small (they are moved whole on their way to the runtime).
            let old = current.as_ref().map(Stored::decode::<S>).transpose()?.map(Box::new);
            let step = match (change(old.as_deref().zip(current.as_ref()))?, current.as_ref(), old) {
                (Change::Put(p), None, _) => Box::pin(self.plan_create(w, *p)).await,
                (Change::Put(p), Some(cur), Some(old)) => Box::pin(self.plan_update(w, *p, cur, old)).await,
                (Change::Delete { options, collection }, Some(cur), Some(old)) => {
                    Box::pin(self.plan_delete(w, options, collection, cur, old)).await
                }
                (Change::Delete { .. }, None, _) | (_, Some(_), None) => Err(Error::not_found(info, &w.key.name)),
            };
            let step = match step {
                // A precondition failed on the cache, which may lag a write another replica acknowledged: judge it
                // again on the newest state before calling it failed, as GuaranteedUpdate does on a cached object.
                Err(Error::Conflict { .. }) if current.is_some() && !std::mem::replace(&mut synced, true) => {
                    self.store.sync().await.map_err(|e| Error::storage(e, info, &w.key.name))?;
                    continue;
                }
                step => step?,
            };
            let plan = match step {
                Step::Done(outcome) => return Ok(outcome),
                Step::Store(plan) if w.opts.dry_run => return Ok(dry_run(plan, info)),
                Step::Store(plan) => plan,
            };
            // Who may retry when the name is taken: a POST whose name was generated, or a write that found no
            // object and so creates one (an apply), which applies to the one created meanwhile.
            let retry_taken = match &plan {
                Plan::Create { generated, .. } => *generated || w.op != Operation::Create,
                _ => false,
            };
            let expected = current.as_ref().map(Stored::resource_version);
            let mut name = w.key.name.clone();
            // Where every write of a request reaches storage.
            let stored = match plan {
                Plan::Create { key, value, managed_fields, said, .. } => {
                    name = key.name.clone();
                    let raw: Vec<(&str, &str)> = managed_fields.iter().map(|m| ("managedFields", m.as_str())).collect();
                    let draft = Draft::new(&value, &raw).map_err(|e| Error::storage(e, info, &name))?;
                    #[cfg(feature = "planted-bugs")]
                    if crate::planted::strikes(crate::planted::Bug::AckBeforeCommit, 4) {
                        let revision = self.store.current_revision() + 1;
                        let object = crate::storage::Object::from_draft(&key.storage_key(info), draft, revision);
                        return Ok(Outcome::Put {
                            object: Stored::new(std::sync::Arc::new(object), info),
                            said,
                            created: true,
                        });
                    }
                    let result = self.store.create(&key.storage_key(info), draft).await;
                    result.map(|o| Outcome::Put { object: Stored::new(o, info), said, created: true })
                }
                Plan::Update { value, said } => {
                    let draft = Draft::new(&value, &[]).map_err(|e| Error::storage(e, info, &name))?;
                    let result = self.store.update(&w.key.storage_key(info), draft, expected).await;
                    #[cfg(feature = "planted-bugs")]
                    if result.is_ok() && crate::planted::strikes(crate::planted::Bug::ConflictAfterCommit, 4) {
                        return Err(Error::stale(info, &name));
                    }
                    result.map(|o| Outcome::Put { object: Stored::new(o, info), said, created: false })
                }
                Plan::Mark { value, said } => {
                    let draft = Draft::new(&value, &[]).map_err(|e| Error::storage(e, info, &name))?;
                    let result = self.store.update(&w.key.storage_key(info), draft, expected).await;
                    result.map(|o| Outcome::Deleted { object: Stored::new(o, info), said, gone: false })
                }
                Plan::Remove { put, said, .. } => {
                    let result = self.store.delete(&w.key.storage_key(info), expected).await;
                    result.map(|o| match put {
                        Some(_) => Outcome::Put { object: Stored::new(o, info), said, created: false },
                        None => Outcome::Deleted { object: Stored::new(o, info), said, gone: true },
                    })
                }
            };
            match stored {
                Ok(outcome) => return Ok(outcome),
                // Raced with another write, or the object was deleted since it was read: decide again on fresh
                // state (a precondition is checked there; an update of nothing is a 404 there).
                Err(StorageError::Conflict { .. } | StorageError::NotFound { .. }) if current.is_some() => continue,
                Err(StorageError::AlreadyExists { .. }) if retry_taken => continue,
                Err(e) => return Err(Error::storage(e, info, &name)),
            }
        }
        Err(Error::stale(info, &w.key.name))
    }

    /// Mutating admission, PrepareForCreate, defaults, validation, field tracking and validating admission of a
    /// new object.
    async fn plan_create(&self, w: &Write<'_, S>, p: Proposed<S>) -> Result<Step> {
        let mut o = p.object;
        // As kube-apiserver: a create's attributes carry the name sent (empty with generateName), and admission
        // is told of CreateOptions even when an apply creates.
        let name = S::meta(&o).name.clone().unwrap_or_default();
        let options = || self.options(w, WriteKind::Create);
        let mut review = self.review(w, Operation::Create, &name, options, p.warnings);
        // Mutating admission sees the object as sent, before the server's own fields.
        *S::type_fields(&mut o).1 = S::INFO.kind.into();
        review.admit(&mut o, None, w.key).await?;
        let prefix = strategy::prepare_for_create::<S>(&mut o, &w.key.namespace)?;
        if let Some(prefix) = &prefix {
            S::meta_mut(&mut o).name = Some(strategy::generated_name(prefix));
        }
        strategy::validate_create::<S>(&mut o, w.version)?;
        let key = ObjectKey::new(&w.key.namespace, S::meta(&o).name.clone().unwrap_or_default());
        let (storage, version) = (self.storage_version, w.version);
        let mut value = versioned_value::<S>(&o, storage)?;
        // A create's managedFields are written out as JSON and stored as such, never built as a tree; ones the
        // client sent go the general way. Either way the writer's fields are recorded in the request's version.
        let managed_fields = match p.fields {
            fieldmanager::Operation::Update if sent_managed_fields(&value) => {
                let sent = versioned_value::<S>(&o, version)?;
                let op = fieldmanager::Operation::Update;
                value = manage_fields_in::<S>(None, sent, w.opts, op, w.sub, version, storage)?;
                None
            }
            fieldmanager::Operation::Update => created_managed_fields::<S>(&mut value, w.opts, storage)
                .map(|entries| created_in_version::<S>(entries, storage, version)),
            fieldmanager::Operation::Apply => None,
        };
        // Validating admission sees the object as it is to be stored.
        let stored = || {
            let mut object = value.clone();
            if let Some(m) = managed_fields.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok()) {
                object["metadata"]["managedFields"] = m;
            }
            Ok(object)
        };
        review.validate(&o, stored, None).await?;
        let generated = prefix.is_some();
        let said = review.said;
        Ok(Step::Store(Plan::Create { key, value, managed_fields, said, generated }))
    }

    /// Preconditions, mutating admission, PrepareForUpdate, defaults, validation, field tracking and validating
    /// admission of a change to `old`.
    async fn plan_update(
        &self,
        w: &Write<'_, S>,
        p: Proposed<S>,
        current: &Stored,
        old: Box<S::Object>,
    ) -> Result<Step> {
        let name = &w.key.name;
        // As kube-apiserver: the body's uid is a precondition, and so is its resourceVersion, which fails as any
        // compare-and-swap that lost a race does.
        let uid = S::meta(&p.object).uid.clone();
        Preconditions { uid, resource_version: None }.check(current, name)?;
        if S::meta(&p.object)
            .resource_version
            .as_deref()
            .is_some_and(|rv| !rv.is_empty() && rv != current.resource_version().to_string())
        {
            return Err(Error::stale(S::INFO, name));
        }
        let mut review = self.review(w, Operation::Update, name, || self.options(w, w.options), p.warnings);
        let tracked = p.fields == fieldmanager::Operation::Update;
        let storage = self.storage_version;
        // The stored object as JSON, parsed only for those who read it (an apply merged against it already).
        let live = match tracked {
            true => Some(current.to_value()?),
            false => None,
        };
        // Admission sees the stored object through the write's view.
        let old_view = review.old(&old, || live.clone().map_or_else(|| current.to_value(), Ok))?;
        let mut proposed = p.object;
        review.admit(&mut proposed, old_view.as_ref(), w.key).await?;
        let mut new = strategy::prepare_for_update::<S>(proposed, &old, w.sub, w.key, w.version)?;
        let value = match tracked {
            true => {
                let sent = versioned_value::<S>(&new, w.version)?;
                let op = fieldmanager::Operation::Update;
                manage_fields_in::<S>(Some(current), sent, w.opts, op, w.sub, w.version, storage)?
            }
            false => versioned_value::<S>(&new, storage)?,
        };
        S::meta_mut(&mut new).managed_fields = value
            .pointer("/metadata/managedFields")
            .map(|m| serde_json::from_value(m.clone()))
            .transpose()
            .map_err(|e| Error::internal(format!("managedFields as recorded do not read back: {e}")))?;
        // Validating admission sees the object as it is to be stored, even when that changes nothing.
        review.validate(&new, || Ok(value.clone()), old_view.as_ref()).await?;
        let said = review.said;
        // Unchanged, stored in the storage version and by the encryption provider that writes now (else it is
        // rewritten: a storage migration, or a move to the current key).
        if new == *old && !self.needs_migration(current) {
            let object = current.clone();
            return Ok(Step::Done(Outcome::Put { object, said, created: false }));
        }
        // The last finalizer is gone from an object marked for deletion: it goes now, as in kube-apiserver.
        let meta = S::meta(&new);
        let finalized = meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty);
        Ok(Step::Store(match finalized {
            true => Plan::Remove { was: current.clone(), said, put: Some(value) },
            false => Plan::Update { value, said },
        }))
    }

    /// Preconditions, propagation policy, admission and graceful deletion: the object goes now unless finalizers
    /// hold it.
    async fn plan_delete(
        &self,
        w: &Write<'_, S>,
        d: &DeleteOptions,
        collection: bool,
        current: &Stored,
        old: Box<S::Object>,
    ) -> Result<Step> {
        let name = &w.key.name;
        if let Some(p) = &d.preconditions {
            p.check(current, name)?;
        }
        let mut finalizers = S::meta(&old).finalizers.clone().unwrap_or_default();
        match d.propagation()? {
            Some(Propagation::Orphan) => set_finalizer(&mut finalizers, "orphan", "foregroundDeletion"),
            Some(Propagation::Foreground) => set_finalizer(&mut finalizers, "foregroundDeletion", "orphan"),
            Some(Propagation::Background) => finalizers.retain(|f| f != "orphan" && f != "foregroundDeletion"),
            None => {}
        }
        // An item of a deletecollection is named to admission by no name, as kube-apiserver names it.
        let admitted_name = if collection { "" } else { name.as_str() };
        let options = || d.admission_options(w.opts.dry_run);
        let mut review = self.review(w, Operation::Delete, admitted_name, options, Vec::new());
        review.delete(|| current.to_value()).await?;
        let said = review.said;
        if finalizers.is_empty() {
            return Ok(Step::Store(Plan::Remove { was: current.clone(), said, put: None }));
        }
        // Graceful: mark for deletion; whoever owns the finalizers finishes it.
        let mut marked = old.clone();
        let meta = S::meta_mut(&mut marked);
        meta.finalizers = Some(finalizers);
        if meta.deletion_timestamp.is_none() {
            meta.deletion_timestamp = Some(now());
            meta.deletion_grace_period_seconds = Some(0);
        }
        if marked == old {
            return Ok(Step::Done(Outcome::Deleted { object: current.clone(), said, gone: false }));
        }
        Ok(Step::Store(Plan::Mark { value: versioned_value::<S>(&marked, self.storage_version)?, said }))
    }

    /// The write's admission, as `op` on `name` (its attributes built only when a plugin runs).
    fn review(
        &self,
        w: &Write<'_, S>,
        op: Operation,
        name: &str,
        options: impl FnOnce() -> RequestOptions,
        warnings: Vec<String>,
    ) -> Review<'_, S> {
        let attrs = || {
            let (user, dry_run) = (w.opts.user.clone(), w.opts.dry_run);
            view::attributes(w.view, w.version, op, w.sub, &w.key.namespace, name, user, dry_run, options())
        };
        Review::new(&*self.admission, w.view, attrs, warnings, w.version)
    }

    /// The options admission is told of, as kube-apiserver fills them.
    fn options(&self, w: &Write<'_, S>, kind: WriteKind) -> RequestOptions {
        let manager = w.opts.field_manager_named.then_some(w.opts.field_manager.as_str());
        RequestOptions::write(kind, w.opts.dry_run, manager)
    }
}

/// What a dry run answers: the object as it would be stored (or, deleted, as it was).
fn dry_run(plan: Plan, resource: &'static ResourceInfo) -> Outcome {
    let unstored = |value| Stored::unstored(value, resource);
    match plan {
        Plan::Create { mut value, managed_fields, said, .. } => {
            if let Some(m) = managed_fields.and_then(|json| serde_json::from_str::<Value>(&json).ok()) {
                value["metadata"]["managedFields"] = m;
            }
            Outcome::Put { object: unstored(value), said, created: true }
        }
        Plan::Update { value, said } => Outcome::Put { object: unstored(value), said, created: false },
        Plan::Mark { value, said } => Outcome::Deleted { object: unstored(value), said, gone: false },
        Plan::Remove { put: Some(value), said, .. } => Outcome::Put { object: unstored(value), said, created: false },
        Plan::Remove { was, said, put: None } => Outcome::Deleted { object: was, said, gone: true },
    }
}

/// `metav1.DeletionPropagation`.
pub(crate) enum Propagation {
    Orphan,
    Background,
    Foreground,
}

impl DeleteOptions {
    /// These options as admission is told of them (`request.options`): what the client set, as
    /// `meta.k8s.io/v1` DeleteOptions.
    fn admission_options(&self, dry_run: bool) -> RequestOptions {
        let options = k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions {
            propagation_policy: self.propagation_policy.as_ref().map(|p| p.as_str().to_owned()),
            grace_period_seconds: self.grace_period_seconds,
            orphan_dependents: self.orphan_dependents,
            preconditions: self.preconditions.as_ref().map(|p| {
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Preconditions {
                    uid: p.uid.clone(),
                    resource_version: p.resource_version.clone(),
                }
            }),
            ..Default::default()
        };
        RequestOptions::delete(options, dry_run)
    }

    /// The propagation policy, `orphanDependents` read as the deprecated spelling of it.
    fn propagation(&self) -> Result<Option<Propagation>> {
        let policy = self.propagation_policy.as_deref().or(match self.orphan_dependents {
            Some(true) => Some("Orphan"),
            Some(false) => Some("Background"),
            None => None,
        });
        Ok(match policy {
            Some("Orphan") => Some(Propagation::Orphan),
            Some("Foreground") => Some(Propagation::Foreground),
            Some("Background") => Some(Propagation::Background),
            None => None,
            Some(other) => {
                return Err(Error::invalid_kind(
                    "DeleteOptions.meta.k8s.io",
                    "",
                    vec![FieldError {
                        field: "propagationPolicy".into(),
                        kind: ErrorType::Invalid,
                        value: Some(format!("{other:?}")),
                        detail: "must be one of Orphan, Background, Foreground".into(),
                    }],
                ))
            }
        })
    }
}

fn set_finalizer(finalizers: &mut Vec<String>, add: &str, remove: &str) {
    finalizers.retain(|f| f != remove);
    if !finalizers.iter().any(|f| f == add) {
        finalizers.push(add.to_owned());
    }
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;

    type Registry = crate::registry::Registry<crate::resources::podset::PodSetStrategy>;
    use crate::api::UserInfo;
    use crate::registry::{PatchType, Written};
    use crate::resources::podset::PodSetStrategy;

    async fn registry(dir: &std::path::Path) -> Registry {
        Registry::on_sled(dir).await
    }

    fn opts() -> WriteOptions {
        WriteOptions::manager("test", UserInfo::named("alice", vec![]))
    }

    fn body(name: &str) -> Value {
        json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"name": name},
               "spec": {"replicas": 1}})
    }

    async fn create(reg: &Registry, name: &str) -> Written {
        reg.create("ns", body(name), &opts()).await.unwrap()
    }

    #[tokio::test]
    async fn preconditions_name_what_failed() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let made = create(&reg, "a").await.object;
        let key = ObjectKey::new("ns", "a");
        let uid = Preconditions { uid: Some("other".into()), resource_version: None };
        let e = reg.delete(&key, &DeleteOptions { preconditions: Some(uid), ..Default::default() }, &opts()).await;
        let want =
            format!("Precondition failed: UID in precondition: other, UID in object meta: {}", made.uid().unwrap());
        assert!(matches!(&e, Err(Error::Conflict { message, .. }) if *message == want), "{:?}", e.as_ref().err());
        let rv = Preconditions { uid: None, resource_version: Some("999".into()) };
        let e = reg.delete(&key, &DeleteOptions { preconditions: Some(rv), ..Default::default() }, &opts()).await;
        let want = format!(
            "Precondition failed: ResourceVersion in precondition: 999, ResourceVersion in object meta: {}",
            made.resource_version()
        );
        assert!(matches!(&e, Err(Error::Conflict { message, .. }) if *message == want), "{:?}", e.as_ref().err());
        // The same uid check guards an update whose body names another object.
        let mut other = body("a");
        other["metadata"]["uid"] = json!("other");
        let e = reg.replace(&key, other, Subresource::Main, &opts()).await;
        assert!(matches!(&e, Err(Error::Conflict { message, .. }) if message.starts_with("Precondition failed: UID")));
        // A stale resourceVersion fails as a lost race does.
        let mut stale = body("a");
        stale["metadata"]["resourceVersion"] = json!("999");
        let e = reg.replace(&key, stale, Subresource::Main, &opts()).await;
        assert!(
            matches!(&e, Err(Error::Conflict { message, .. }) if message.starts_with("the object has been modified"))
        );
        assert!(reg.get(&key, None).await.is_ok(), "nothing was deleted");
    }

    #[tokio::test]
    async fn a_dry_run_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let dry = WriteOptions { dry_run: true, ..opts() };
        let w = reg.create("ns", body("a"), &dry).await.unwrap();
        assert!(w.created && w.object.uid().is_some(), "answered as created");
        let key = ObjectKey::new("ns", "a");
        assert!(matches!(reg.get(&key, None).await, Err(Error::NotFound { .. })));
        create(&reg, "a").await;
        let before = reg.get(&key, None).await.unwrap();
        let patch = br#"{"spec":{"replicas":5}}"#;
        let w = reg.patch(&key, patch, PatchType::Merge, Subresource::Main, &dry).await.unwrap();
        assert_eq!(w.object.decode::<PodSetStrategy>().unwrap().spec.replicas, Some(5));
        let d = reg.delete(&key, &DeleteOptions::default(), &dry).await.unwrap();
        assert!(d.gone);
        let after = reg.get(&key, None).await.unwrap();
        assert_eq!(after.resource_version(), before.resource_version(), "neither the patch nor the delete stored");
    }

    #[tokio::test]
    async fn finalizers_hold_a_delete_until_the_last_one_goes() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let mut b = body("a");
        b["metadata"]["finalizers"] = json!(["example.com/hold"]);
        reg.create("ns", b, &opts()).await.unwrap();
        let key = ObjectKey::new("ns", "a");
        let d = reg.delete(&key, &DeleteOptions::default(), &opts()).await.unwrap();
        assert!(!d.gone);
        let marked = d.object.decode::<PodSetStrategy>().unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        let again = reg.delete(&key, &DeleteOptions::default(), &opts()).await.unwrap();
        assert_eq!(again.object.resource_version(), d.object.resource_version(), "marking twice changes nothing");
        let orphan = DeleteOptions { propagation_policy: Some("Orphan".into()), ..Default::default() };
        let o = reg.delete(&key, &orphan, &opts()).await.unwrap().object.decode::<PodSetStrategy>().unwrap();
        assert_eq!(o.metadata.finalizers, Some(vec!["example.com/hold".to_owned(), "orphan".to_owned()]));
        let bad = DeleteOptions { propagation_policy: Some("Sometimes".into()), ..Default::default() };
        assert!(matches!(reg.delete(&key, &bad, &opts()).await, Err(Error::Invalid { .. })));
        let clear = br#"{"metadata":{"finalizers":null}}"#;
        reg.patch(&key, clear, PatchType::Merge, Subresource::Main, &opts()).await.unwrap();
        assert!(matches!(reg.get(&key, None).await, Err(Error::NotFound { .. })), "gone with its last finalizer");
    }

    #[tokio::test]
    async fn generated_names_and_taken_names() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let b = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet", "metadata": {"generateName": "web-"}});
        let first = reg.create("ns", b.clone(), &opts()).await.unwrap().object;
        let second = reg.create("ns", b, &opts()).await.unwrap().object;
        assert!(first.name().starts_with("web-") && first.name().len() == 9);
        assert_ne!(first.name(), second.name());
        create(&reg, "a").await;
        assert!(
            matches!(reg.create("ns", body("a"), &opts()).await, Err(Error::AlreadyExists { name, .. }) if name == "a")
        );
    }

    #[tokio::test]
    async fn an_apply_creates_what_is_missing_and_updates_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).await;
        let key = ObjectKey::new("ns", "a");
        let cfg = b"apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata: {name: a}\nspec: {replicas: 2}\n";
        let made = reg.patch(&key, cfg, PatchType::Apply, Subresource::Main, &opts()).await.unwrap();
        assert!(made.created);
        let cfg = b"apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata: {name: a}\nspec: {replicas: 3}\n";
        let changed = reg.patch(&key, cfg, PatchType::Apply, Subresource::Main, &opts()).await.unwrap();
        assert!(!changed.created);
        assert_eq!(changed.object.decode::<PodSetStrategy>().unwrap().spec.replicas, Some(3));
        let missing = ObjectKey::new("ns", "b");
        let status = b"apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata: {name: b}\nstatus: {replicas: 1}\n";
        let e = reg.patch(&missing, status, PatchType::Apply, Subresource::Status, &opts()).await;
        assert!(matches!(e, Err(Error::NotFound { .. })), "an apply to status creates nothing");
    }
}
