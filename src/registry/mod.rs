//! The registry, as kube-apiserver's generic registry (`registry/generic/registry.Store`) under sample-apiserver's
//! `pkg/registry`: a resource's semantics between the HTTP layer (and the controller) and storage, the same for
//! every resource around its [`Strategy`] — system fields, defaulting and validation (`strategy`), field
//! management (`managed`), optimistic concurrency with retries, finalizers and graceful deletion, the `status`
//! and `scale` subresources, watches, storage migration and restore. Nothing else reads or writes objects in
//! storage.

mod admit;
mod continue_token;
mod decode;
mod error;
pub mod fieldmanager;
mod key;
mod managed;
mod migrate;
mod options;

mod rest;
mod restore;
mod scale;
mod stored;
pub mod strategy;
#[cfg(test)]
mod testkind;
mod view;
mod watch;
mod write;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use self::decode::{json_object, yaml_object};
pub use self::error::{Error, Result};
pub use self::key::ObjectKey;
pub use self::migrate::{Migration, MigrationMetrics, MIGRATOR};
pub use self::options::{
    DeleteOptions, Deleted, FieldValidation, ListPage, ListRequest, PatchType, Preconditions, ScaleChange,
    WriteOptions, Written,
};
pub use self::rest::RestStorage;
pub use self::scale::ScaleAccessor;
pub use self::stored::Stored;
pub use self::strategy::Strategy;
pub use self::view::admission_attributes;
pub use self::watch::{Event, EventType, Notification, Watch, WatchRequest};
pub use crate::api::resource::{ResourceInfo, Scope};
pub use crate::api::{Operation, Subresource, UserInfo};
pub use crate::storage::Revision;

use self::decode::{apply_patch, decode_json_object, decode_object};
use self::managed::manage_fields_in;
use self::strategy::{check_identity, typed};
use self::view::ObjectView;
use self::write::{Change, Outcome, Write};
use crate::admission::{Admission, Chain, WriteKind};
use crate::api::resource::ServedVersion;
use crate::api::validation::FieldError;
use crate::storage::{ListOptions, Object, StorageError, Store};

/// How long a read "not older than" a revision this server has not reached waits for it before a 504.
const TOO_LARGE_AFTER: Duration = Duration::from_secs(3);

impl From<Outcome> for Written {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Put { object, said, created } => {
                Written { object, warnings: said.warnings, audit_annotations: said.audit_annotations, created }
            }
            Outcome::Deleted { object, said, .. } => {
                Written { object, warnings: said.warnings, audit_annotations: said.audit_annotations, created: false }
            }
        }
    }
}

/// A resource's registry (kube's generic `Store` with the resource's strategy): the only door to its objects in
/// storage.
pub struct Registry<S: Strategy> {
    store: Arc<dyn Store>,
    /// Runs on every write, whoever makes it.
    admission: Arc<dyn Admission>,
    /// What the watchers of the newest revisions share.
    recent: Arc<watch::Recent>,
    /// The version objects are written in (`--storage-version`); objects stored in another stay readable.
    storage_version: S::Version,
}

impl<S: Strategy> Clone for Registry<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            admission: self.admission.clone(),
            recent: self.recent.clone(),
            storage_version: self.storage_version,
        }
    }
}

impl<S: Strategy> Registry<S> {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store, admission: Arc::new(Chain::empty()), recent: Arc::default(), storage_version: S::STORAGE_VERSION }
    }

    /// The same registry writing objects in `version`.
    pub fn with_storage_version(self, version: S::Version) -> Self {
        Self { storage_version: version, ..self }
    }

    pub fn storage_version(&self) -> S::Version {
        self.storage_version
    }

    /// Objects stored, as the cache counts them (readable or not: a scrape of /metrics never fails for one).
    pub fn object_count(&self) -> usize {
        self.store.stats().objects
    }

    pub fn current_revision(&self) -> Revision {
        self.store.current_revision()
    }

    /// A registry over sled in `dir` with the default history, for the tests of this layer and those above it
    /// (which see storage only through the registry).
    #[cfg(test)]
    pub(crate) async fn on_sled(dir: &std::path::Path) -> Self {
        use crate::storage::{Cacher, HistoryLimits, SledBackend, SledOptions};
        let backend = SledBackend::open(dir, SledOptions::default()).unwrap();
        Self::new(Arc::new(Cacher::new(Arc::new(backend), HistoryLimits::default()).await.unwrap()))
    }

    /// The same registry with `admission` in its write path.
    pub fn with_admission(self, admission: Arc<dyn Admission>) -> Self {
        Self { admission, ..self }
    }

    async fn get_object(&self, key: &ObjectKey) -> Result<Option<Arc<Object>>> {
        self.store.get(&key.storage_key(S::INFO)).await.map_err(|e| Error::storage(e, S::INFO, &key.name))
    }

    /// The current object for a write: from the cache, which may lag a write another replica just made; a stale
    /// state is caught by the write's compare-and-swap, a missing one only here, by catching up before saying 404.
    async fn get_for_write(&self, key: &ObjectKey) -> Result<Option<Arc<Object>>> {
        match self.get_object(key).await? {
            Some(o) => Ok(Some(o)),
            None => {
                self.store.sync().await.map_err(|e| Error::storage(e, S::INFO, &key.name))?;
                self.get_object(key).await
            }
        }
    }

    /// A GET, with kube-apiserver's `resourceVersion` semantics: unset reads the newest state any replica has
    /// acknowledged (a consistent read); `0` reads this server's cache as it is; `n` waits for a state not older
    /// than `n`.
    pub async fn get(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Stored> {
        if resource_version != Some(0) {
            self.read_revision(resource_version, false).await?;
        }
        let found = self.get_object(key).await?.map(|o| Stored::new(o, S::INFO));
        #[cfg(feature = "planted-bugs")]
        let found = match resource_version {
            Some(0) => late_delete(key.storage_key(S::INFO), found),
            _ => found,
        };
        found.ok_or_else(|| Error::not_found(S::INFO, &key.name))
    }

    /// Resolves which revision a list or watch reads at (`resourceVersion` + `resourceVersionMatch`).
    async fn read_revision(&self, requested: Option<Revision>, exact: bool) -> Result<Revision> {
        match requested {
            // Unset: a consistent read, which waits until the cache holds every acknowledged write.
            None => self.store.sync().await.map_err(Error::from),
            Some(0) => Ok(self.store.current_revision()),
            Some(rv) if exact => Ok(rv),
            Some(rv) => {
                // "Not older than": wait up to 3 s in all (kube-apiserver's watch cache waits as long) for a
                // revision another replica may have written, then "too large".
                let deadline = tokio::time::Instant::now() + TOO_LARGE_AFTER;
                if self.store.current_revision() < rv {
                    // Catch up with the backend first: the revision may be one without a change of ours to apply.
                    if let Ok(synced) = tokio::time::timeout_at(deadline, self.store.sync()).await {
                        synced?;
                    }
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match self.store.wait_for(rv, left).await {
                    Err(StorageError::Timeout(_)) => {
                        Err(Error::TooLargeResourceVersion { requested: rv, current: self.store.current_revision() })
                    }
                    reached => Ok(reached?),
                }
            }
        }
    }

    pub async fn list(&self, req: ListRequest) -> Result<ListPage> {
        let prefix = ObjectKey::prefix(S::INFO, req.namespace.as_deref());
        let (revision, start_key) = match &req.continue_token {
            Some(token) => {
                let t = continue_token::decode(token)?;
                let rv = if t.rv <= 0 { self.store.current_revision() } else { t.rv as u64 };
                (rv, Some(format!("{prefix}{}", t.start)))
            }
            #[cfg(feature = "planted-bugs")]
            None if req.resource_version.is_none() && crate::planted::planted(crate::planted::Bug::StaleList) => {
                (self.store.current_revision().saturating_sub(1).max(1), None)
            }
            None => (self.read_revision(req.resource_version, req.exact).await?, None),
        };
        let (labels, fields) = (req.labels, req.fields);
        let predicate: Option<crate::storage::Predicate> = if labels.is_empty() && fields.is_empty() {
            None
        } else {
            Some(Box::new(move |o: &Object| stored::object_matches(o, &labels, &fields)))
        };
        let opts = ListOptions {
            prefix: prefix.clone(),
            revision: Some(revision),
            start_key: start_key.clone(),
            limit: req.limit,
            predicate,
            skip_unreadable: req.skip_unreadable,
        };
        let result = match self.store.list(opts).await {
            Err(StorageError::Expired { .. }) if req.continue_token.is_some() => {
                let start = start_key.as_deref().unwrap_or(&prefix).strip_prefix(&prefix).unwrap_or("");
                return Err(Error::Expired {
                    message: "The provided continue parameter is too old to display a consistent list result. You can \
                              start a new list without the continue parameter, or use the continue token in this \
                              response to retrieve the remainder of the results. Continuing with the provided token \
                              results in an inconsistent list - objects that were created, modified, or deleted \
                              between the time the first chunk was returned and now may show up in the list."
                        .into(),
                    continue_token: Some(continue_token::encode(-1, start)),
                });
            }
            other => other?,
        };
        let continue_token = result
            .next_key
            .as_deref()
            .map(|k| continue_token::encode(result.revision as i64, k.strip_prefix(&prefix).unwrap_or(k)));
        Ok(ListPage {
            items: result.items.into_iter().map(|o| Stored::new(o, S::INFO)).collect(),
            revision: result.revision,
            continue_token,
            remaining: result.remaining,
        })
    }

    /// POST: creates an object in `namespace` (empty for a cluster-scoped resource) from a decoded body.
    pub async fn create(&self, namespace: &str, body: Value, opts: &WriteOptions) -> Result<Written> {
        let (o, warnings, version) = decode_object::<S>(body, opts.field_validation, self.request_version(opts))?;
        self.insert(namespace, o, warnings, version, opts).await
    }

    /// POST with a JSON body: [`Registry::create`] of `json_object(body)`, usually decoded without the tree.
    pub async fn create_json(&self, namespace: &str, body: &[u8], opts: &WriteOptions) -> Result<Written> {
        let (o, warnings, version) = decode_json_object::<S>(body, opts.field_validation, self.request_version(opts))?;
        self.insert(namespace, o, warnings, version, opts).await
    }

    /// The version a request names (its URL's), as `S` types it.
    fn request_version(&self, opts: &WriteOptions) -> Option<S::Version> {
        opts.version.map(typed::<S>)
    }

    /// The version a write is made in: the request's, else (an in-process caller's) the storage version.
    fn write_version(&self, opts: &WriteOptions) -> S::Version {
        self.request_version(opts).unwrap_or(self.storage_version)
    }

    async fn insert(
        &self,
        namespace: &str,
        o: S::Object,
        warnings: Vec<String>,
        version: S::Version,
        opts: &WriteOptions,
    ) -> Result<Written> {
        let key = ObjectKey::new(namespace, "");
        let w = Write {
            op: Operation::Create,
            sub: Subresource::Main,
            key: &key,
            opts,
            options: WriteKind::Create,
            view: ObjectView::<S>::NEW,
            version,
        };
        self.write(&w, |_| Ok(Change::update(o.clone(), warnings.clone()))).await.map(Written::from)
    }

    /// PUT of the whole object or its status.
    pub async fn replace(
        &self,
        key: &ObjectKey,
        body: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written> {
        let (o, warnings, version) = decode_object::<S>(body, opts.field_validation, self.request_version(opts))?;
        check_identity(S::meta(&o), key)?;
        let view = ObjectView::<S>::NEW;
        let w = Write { op: Operation::Update, sub, key, opts, options: WriteKind::Update, view, version };
        self.write(&w, |current| match current {
            None => Err(Error::not_found(S::INFO, &key.name)),
            Some(_) => Ok(Change::update(o.clone(), warnings.clone())),
        })
        .await
        .map(Written::from)
    }

    /// PATCH of the whole object or its status: a merge or JSON patch, or a server-side apply.
    pub async fn patch(
        &self,
        key: &ObjectKey,
        patch: &[u8],
        patch_type: PatchType,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written> {
        if patch_type == PatchType::Apply {
            return self.apply(key, patch, sub, opts).await;
        }
        // A patch applies to the object in the request's version.
        let version = self.write_version(opts);
        let view = ObjectView::<S>::NEW;
        let w = Write { op: Operation::Update, sub, key, opts, options: WriteKind::Patch, view, version };
        self.write(&w, |current| {
            let Some((_, current)) = current else { return Err(Error::not_found(S::INFO, &key.name)) };
            let mut doc = current.to_version(version.to_index())?.to_value()?;
            apply_patch(&mut doc, patch, patch_type)?;
            let (o, warnings, _) = decode_object::<S>(doc, opts.field_validation, Some(version))?;
            check_identity(S::meta(&o), key)?;
            Ok(Change::update(o, warnings))
        })
        .await
        .map(Written::from)
    }

    /// Server-side apply (`application/apply-patch+yaml`) to the object or its status, by `opts.field_manager`;
    /// creates the object when it does not exist.
    async fn apply(&self, key: &ObjectKey, patch: &[u8], sub: Subresource, opts: &WriteOptions) -> Result<Written> {
        if opts.field_manager.is_empty() {
            return Err(Error::invalid_kind(
                "PatchOptions.meta.k8s.io",
                "",
                vec![FieldError::required("fieldManager", "is required for apply patch")],
            ));
        }
        let mut config = yaml_object(patch)?;
        // Unknown fields per fieldValidation, and the type fields, as for any other write.
        let (decoded, warnings, version) =
            decode_object::<S>(config.clone(), opts.field_validation, self.request_version(opts))?;
        check_identity(S::meta(&decoded), key)?;
        fieldmanager::typed::prune_unknown(S::field_manager(version).schema(), &mut config);
        let view = ObjectView::<S>::NEW;
        let w = Write { op: Operation::Update, sub, key, opts, options: WriteKind::Patch, view, version };
        self.write(&w, |current| {
            let live = match current {
                Some((_, current)) => Some(current),
                None if sub == Subresource::Status => return Err(Error::not_found(S::INFO, &key.name)),
                None => None,
            };
            let op = fieldmanager::Operation::Apply;
            // Merged and read in the request's version, so it is validated as that version's create would be
            // (read in the storage version, a field kept elsewhere there would stand for what the request's
            // version refuses).
            let merged = manage_fields_in::<S>(live, config.clone(), opts, op, sub, version, version)?;
            let (mut o, _, _) = decode_object::<S>(merged, FieldValidation::Ignore, Some(version))?;
            if live.is_none() {
                S::meta_mut(&mut o).name = Some(key.name.clone());
            }
            Ok(Change::applied(o, warnings.clone()))
        })
        .await
        .map(Written::from)
    }

    /// A write by an in-process manager (the controller) of `sub` on the revision it read (409 when the object
    /// changed since): `change` makes the new object of the current one, which then goes through the same
    /// validation, field management and compare-and-swap as a PUT.
    pub async fn update_with(
        &self,
        key: &ObjectKey,
        sub: Subresource,
        read_at: Revision,
        opts: &WriteOptions,
        change: impl Fn(&mut S::Object),
    ) -> Result<Written> {
        let w = Write {
            op: Operation::Update,
            sub,
            key,
            opts,
            options: WriteKind::Update,
            view: ObjectView::<S>::NEW,
            version: self.write_version(opts),
        };
        self.write(&w, |current| {
            let Some((old, _)) = current else { return Err(Error::not_found(S::INFO, &key.name)) };
            let mut new = old.clone();
            change(&mut new);
            S::meta_mut(&mut new).resource_version = Some(read_at.to_string());
            Ok(Change::update(new, Vec::new()))
        })
        .await
        .map(Written::from)
    }

    /// DELETE: the object goes at once, or is marked for deletion while finalizers hold it.
    pub async fn delete(&self, key: &ObjectKey, delete: &DeleteOptions, opts: &WriteOptions) -> Result<Deleted> {
        self.delete_item(key, delete, opts, false).await
    }

    async fn delete_item(
        &self,
        key: &ObjectKey,
        options: &DeleteOptions,
        opts: &WriteOptions,
        collection: bool,
    ) -> Result<Deleted> {
        let w = Write {
            op: Operation::Delete,
            sub: Subresource::Main,
            key,
            opts,
            options: WriteKind::Update,
            view: ObjectView::<S>::NEW,
            version: self.write_version(opts),
        };
        match self.write(&w, |_| Ok(Change::Delete { options, collection })).await? {
            Outcome::Deleted { object, said, gone } => {
                Ok(Deleted { object, gone, warnings: said.warnings, audit_annotations: said.audit_annotations })
            }
            Outcome::Put { .. } => Err(Error::internal("a delete stored an update")),
        }
    }

    /// Deletes every object the list request selects; returns what was deleted (or marked for deletion) and the
    /// revision after.
    pub async fn delete_collection(
        &self,
        req: ListRequest,
        delete: &DeleteOptions,
        opts: &WriteOptions,
    ) -> Result<(Vec<Stored>, Revision)> {
        let page = self.list(ListRequest { limit: None, continue_token: None, ..req }).await?;
        let mut deleted = Vec::with_capacity(page.items.len());
        for item in page.items {
            match self.delete_item(&item.key(), delete, opts, true).await {
                Ok(d) => deleted.push(d.object),
                // Deleted by someone else meanwhile.
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((deleted, self.store.current_revision()))
    }
}

/// Per object (by storage key), the last live version a cached GET returned, and since when it has been hidden.
#[cfg(feature = "planted-bugs")]
static HIDDEN: parking_lot::Mutex<std::collections::BTreeMap<String, (Stored, Option<std::time::Instant>)>> =
    parking_lot::Mutex::new(std::collections::BTreeMap::new());

/// What a GET of `key` at resourceVersion=0 returns, given what the cache holds: with the planted fault
/// `LateDeletes`, the last live version it returned while the deletion is hidden.
#[cfg(feature = "planted-bugs")]
fn late_delete(key: String, cached: Option<Stored>) -> Option<Stored> {
    use crate::planted::{planted, Bug, LATE_DELETES};
    if !planted(Bug::LateDeletes) {
        return cached;
    }
    let mut hidden = HIDDEN.lock();
    let marked = |v: serde_json::Value| v.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null());
    let live = cached.as_ref().filter(|s| s.to_value().is_ok_and(|v| !marked(v)));
    if let Some(live) = live {
        hidden.insert(key, (live.clone(), None));
        return cached;
    }
    let Some((last, since)) = hidden.get_mut(&key) else { return cached };
    if since.get_or_insert_with(std::time::Instant::now).elapsed() < LATE_DELETES {
        return Some(last.clone());
    }
    hidden.remove(&key);
    cached
}
