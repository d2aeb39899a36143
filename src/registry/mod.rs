//! The PodSet registry, as sample-apiserver's `pkg/registry`: PodSet semantics between the HTTP layer (and the
//! controller) and storage, after kube-apiserver's generic registry — system fields, defaulting and validation
//! (`strategy`), field management (`managed`), optimistic concurrency with retries, finalizers and graceful
//! deletion, the `status` and `scale` subresources, watches. Nothing else reads or writes PodSets in storage.

mod continue_token;
mod decode;
mod error;
pub mod fieldmanager;
mod key;
mod managed;
mod options;
mod restore;
mod scale;
mod stored;
mod strategy;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v1::Scale;
use serde_json::Value;

pub use self::decode::{json_object, yaml_object};
pub use self::fieldmanager::{Operation, Subresource};
pub use self::key::PodSetKey;
pub use self::managed::podset_field_manager;
pub use self::options::{
    DeleteOptions, Deleted, FieldValidation, ListPage, ListRequest, Part, PatchType, Preconditions, ScaleChange,
    WriteOptions, Written,
};
pub use self::stored::Stored;
pub use self::watch::{Event, EventType, Notification, Watch, WatchRequest};
pub use crate::storage::Revision;

use self::decode::{apply_patch, decode_json_podset, decode_podset};
use self::error::storage_error;
use self::managed::{created_managed_fields, manage_fields, sent_managed_fields};
use self::strategy::{check_identity, now};
use crate::api::status::{ApiError, ApiResult};
use crate::api::validation::{self, FieldError};
use crate::api::{PodSet, PodSetStatus};
use crate::storage::{Draft, ListOptions, Object, StorageError, Store};

/// Attempts at a read-modify-write before giving up on a hot object.
const MAX_RETRIES: usize = 32;
/// How long a read "not older than" a revision this server has not reached waits for it before a 504.
const TOO_LARGE_AFTER: Duration = Duration::from_secs(3);

impl Part {
    fn subresource(self) -> Subresource {
        match self {
            Part::Main => Subresource::Main,
            Part::Status => Subresource::Status,
        }
    }
}

fn to_value(ps: &PodSet) -> ApiResult<Value> {
    serde_json::to_value(ps).map_err(|e| ApiError::internal(e.to_string()))
}

/// Whether a write's managedFields are still to be recorded, or an apply has merged them already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    Update,
    Applied,
}

/// The PodSet registry.
#[derive(Clone)]
pub struct Registry {
    store: Arc<dyn Store>,
    /// What the watchers of the newest revisions share.
    recent: Arc<watch::Recent>,
}

impl Registry {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store, recent: Arc::default() }
    }

    async fn get_object(&self, key: &PodSetKey) -> ApiResult<Option<Arc<Object>>> {
        self.store.get(&key.storage_key()).await.map_err(|e| storage_error(e, &key.name))
    }

    /// The current object for a write: from the cache, which may lag a write another replica just made; a stale
    /// state is caught by the write's compare-and-swap, a missing one only here, by catching up before saying 404.
    async fn get_for_write(&self, key: &PodSetKey) -> ApiResult<Option<Arc<Object>>> {
        match self.get_object(key).await? {
            Some(o) => Ok(Some(o)),
            None => {
                self.store.sync().await.map_err(|e| storage_error(e, &key.name))?;
                self.get_object(key).await
            }
        }
    }

    /// A GET, with kube-apiserver's `resourceVersion` semantics: unset reads the newest state any replica has
    /// acknowledged (a consistent read); `0` reads this server's cache as it is; `n` waits for a state not older
    /// than `n`.
    pub async fn get(&self, key: &PodSetKey, resource_version: Option<Revision>) -> ApiResult<Stored> {
        if resource_version != Some(0) {
            self.read_revision(resource_version, false).await?;
        }
        self.get_object(key).await?.map(Stored::new).ok_or_else(|| ApiError::not_found(&key.name))
    }

    /// GET of `/scale`.
    pub async fn get_scale(&self, key: &PodSetKey, resource_version: Option<Revision>) -> ApiResult<Scale> {
        Ok(scale::scale_of(self.get(key, resource_version).await?.decode()?))
    }

    /// Resolves which revision a list or watch reads at (`resourceVersion` + `resourceVersionMatch`).
    async fn read_revision(&self, requested: Option<Revision>, exact: bool) -> ApiResult<Revision> {
        match requested {
            // Unset: a consistent read, which waits until the cache holds every acknowledged write.
            None => self.store.sync().await.map_err(ApiError::from),
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
                        Err(ApiError::too_large_resource_version(rv, self.store.current_revision()))
                    }
                    reached => Ok(reached?),
                }
            }
        }
    }

    pub async fn list(&self, req: ListRequest) -> ApiResult<ListPage> {
        let prefix = PodSetKey::prefix(req.namespace.as_deref());
        let (revision, start_key) = match &req.continue_token {
            Some(token) => {
                let t = continue_token::decode(token)?;
                let rv = if t.rv <= 0 { self.store.current_revision() } else { t.rv as u64 };
                (rv, Some(format!("{prefix}{}", t.start)))
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
        };
        let result = match self.store.list(opts).await {
            Err(StorageError::Expired { .. }) if req.continue_token.is_some() => {
                let start = start_key.as_deref().unwrap_or(&prefix).strip_prefix(&prefix).unwrap_or("");
                let mut e = ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new \
                     list without the continue parameter, or use the continue token in this response to retrieve the \
                     remainder of the results. Continuing with the provided token results in an inconsistent list - \
                     objects that were created, modified, or deleted between the time the first chunk was returned and \
                     now may show up in the list.",
                );
                if let Some(meta) = e.status.metadata.as_mut() {
                    meta.continue_ = Some(continue_token::encode(-1, start));
                }
                return Err(e);
            }
            other => other?,
        };
        let continue_token = result
            .next_key
            .as_deref()
            .map(|k| continue_token::encode(result.revision as i64, k.strip_prefix(&prefix).unwrap_or(k)));
        Ok(ListPage {
            items: result.items.into_iter().map(Stored::new).collect(),
            revision: result.revision,
            continue_token,
            remaining: result.remaining,
        })
    }

    /// POST: creates a PodSet in `namespace` from a decoded body.
    pub async fn create(&self, namespace: &str, body: Value, opts: &WriteOptions) -> ApiResult<Written> {
        let (ps, warnings) = decode_podset(body, opts.field_validation)?;
        self.insert(namespace, ps, warnings, opts, Tracking::Update).await
    }

    /// POST with a JSON body: [`Registry::create`] of `json_object(body)`, usually decoded without the tree.
    pub async fn create_json(&self, namespace: &str, body: &[u8], opts: &WriteOptions) -> ApiResult<Written> {
        let (ps, warnings) = decode_json_podset(body, opts.field_validation)?;
        self.insert(namespace, ps, warnings, opts, Tracking::Update).await
    }

    /// Stores a new PodSet: system fields, defaults, validation, and (unless an apply did) field tracking.
    async fn insert(
        &self,
        namespace: &str,
        mut ps: PodSet,
        warnings: Vec<String>,
        opts: &WriteOptions,
        tracking: Tracking,
    ) -> ApiResult<Written> {
        let generate = strategy::prepare_for_create(&mut ps, namespace)?;
        for attempt in 0.. {
            if let Some(prefix) = &generate {
                ps.metadata.name = Some(strategy::generated_name(prefix));
            }
            let key = PodSetKey::new(namespace, ps.metadata.name.clone().unwrap_or_default());
            let mut candidate = ps.clone();
            strategy::validate_create(&mut candidate)?;
            let mut value = to_value(&candidate)?;
            // A create's managedFields are written out as JSON and stored as such, never built as a tree; ones the
            // client sent go the general way.
            let managed_fields = match tracking {
                Tracking::Update if sent_managed_fields(&value) => {
                    value = manage_fields(None, value, opts, Operation::Update, Subresource::Main)?;
                    None
                }
                Tracking::Update => created_managed_fields(&mut value, opts),
                Tracking::Applied => None,
            };
            if opts.dry_run {
                if let Some(json) = &managed_fields {
                    value["metadata"]["managedFields"] =
                        serde_json::from_str(json).map_err(|e| ApiError::internal(e.to_string()))?;
                }
                return Ok(Written { object: Stored::unstored(value), warnings, created: true });
            }
            let raw: Vec<(&str, &str)> = managed_fields.iter().map(|m| ("managedFields", m.as_str())).collect();
            let draft = Draft::new(&value, &raw).map_err(|e| storage_error(e, &key.name))?;
            match self.store.create(&key.storage_key(), draft).await {
                Ok(object) => return Ok(Written { object: Stored::new(object), warnings, created: true }),
                Err(StorageError::AlreadyExists { .. }) if generate.is_some() && attempt < 8 => continue,
                Err(e) => return Err(storage_error(e, &key.name)),
            }
        }
        unreachable!("the loop returns")
    }

    /// Read-modify-write with compare-and-swap: `propose` builds the new object from the current one; a
    /// resourceVersion it carries is a precondition, otherwise conflicts are retried on fresh state.
    async fn update_with<F>(
        &self,
        key: &PodSetKey,
        sub: Subresource,
        opts: &WriteOptions,
        tracking: Tracking,
        propose: F,
    ) -> ApiResult<Written>
    where
        F: Fn(&PodSet, &Stored) -> ApiResult<(PodSet, Vec<String>)>,
    {
        let part = if sub == Subresource::Status { Part::Status } else { Part::Main };
        let storage_key = key.storage_key();
        for _ in 0..MAX_RETRIES {
            let Some(current) = self.get_for_write(key).await?.map(Stored::new) else {
                return Err(ApiError::not_found(&key.name));
            };
            let old = current.decode()?;
            let (proposed, warnings) = propose(&old, &current)?;
            let precondition = proposed.metadata.resource_version.clone().filter(|rv| !rv.is_empty());
            if precondition.as_deref().is_some_and(|rv| rv != current.resource_version().to_string()) {
                return Err(ApiError::stale(&key.name));
            }
            let mut new = strategy::prepare_for_update(proposed, &old, part, key)?;
            let mut value = to_value(&new)?;
            if tracking == Tracking::Update {
                value = manage_fields(Some(&current.to_value()?), value, opts, Operation::Update, sub)?;
            }
            new.metadata.managed_fields =
                value.pointer("/metadata/managedFields").and_then(|m| serde_json::from_value(m.clone()).ok());
            if new == old {
                return Ok(Written { object: current, warnings, created: false });
            }
            if opts.dry_run {
                return Ok(Written { object: Stored::unstored(value), warnings, created: false });
            }
            let deleting =
                new.metadata.deletion_timestamp.is_some() && new.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
            let expected = Some(current.resource_version());
            let result = if deleting {
                // The last finalizer is gone: the object goes now, as kube-apiserver does.
                self.store.delete(&storage_key, expected).await
            } else {
                let draft = Draft::new(&value, &[]).map_err(|e| storage_error(e, &key.name))?;
                self.store.update(&storage_key, draft, expected).await
            };
            match result {
                Ok(object) => return Ok(Written { object: Stored::new(object), warnings, created: false }),
                // Raced with another write: propose again on the new state (a precondition is checked there).
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(storage_error(e, &key.name)),
            }
        }
        Err(ApiError::stale(&key.name))
    }

    /// PUT of the whole object or its status.
    pub async fn replace(&self, key: &PodSetKey, body: Value, part: Part, opts: &WriteOptions) -> ApiResult<Written> {
        let (ps, warnings) = decode_podset(body, opts.field_validation)?;
        check_identity(&ps.metadata, key)?;
        self.update_with(key, part.subresource(), opts, Tracking::Update, |_, _| Ok((ps.clone(), warnings.clone())))
            .await
    }

    /// PATCH of the whole object or its status.
    pub async fn patch(
        &self,
        key: &PodSetKey,
        patch: &[u8],
        patch_type: PatchType,
        part: Part,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        if patch_type == PatchType::Apply {
            return self.apply(key, patch, part, opts).await;
        }
        self.update_with(key, part.subresource(), opts, Tracking::Update, |_, current| {
            let mut doc = current.to_value()?;
            apply_patch(&mut doc, patch, patch_type)?;
            let (ps, warnings) = decode_podset(doc, opts.field_validation)?;
            check_identity(&ps.metadata, key)?;
            Ok((ps, warnings))
        })
        .await
    }

    /// Server-side apply (`application/apply-patch+yaml`) to the object or its status, by `opts.field_manager`;
    /// creates the object when it does not exist.
    async fn apply(&self, key: &PodSetKey, patch: &[u8], part: Part, opts: &WriteOptions) -> ApiResult<Written> {
        if opts.field_manager.is_empty() {
            return Err(ApiError::invalid_kind(
                "PatchOptions.meta.k8s.io",
                "",
                &[FieldError::required("fieldManager", "is required for apply patch")],
            ));
        }
        let mut config = yaml_object(patch)?;
        // Unknown fields per fieldValidation, and the type fields, as for any other write.
        let (decoded, warnings) = decode_podset(config.clone(), opts.field_validation)?;
        check_identity(&decoded.metadata, key)?;
        fieldmanager::typed::prune_unknown(podset_field_manager().schema(), &mut config);
        let sub = part.subresource();
        for _ in 0..MAX_RETRIES {
            if self.get_for_write(key).await?.is_none() {
                if part == Part::Status {
                    return Err(ApiError::not_found(&key.name));
                }
                let merged = manage_fields(None, config.clone(), opts, Operation::Apply, sub)?;
                let (mut ps, _) = decode_podset(merged, FieldValidation::Ignore)?;
                ps.metadata.name = Some(key.name.clone());
                match self.insert(&key.namespace, ps, warnings.clone(), opts, Tracking::Applied).await {
                    // Created by someone else meanwhile: apply to theirs.
                    Err(e) if e.reason() == "AlreadyExists" => continue,
                    other => return other,
                }
            }
            let result = self
                .update_with(key, sub, opts, Tracking::Applied, |_, current| {
                    let merged =
                        manage_fields(Some(&current.to_value()?), config.clone(), opts, Operation::Apply, sub)?;
                    let (ps, _) = decode_podset(merged, FieldValidation::Ignore)?;
                    Ok((ps, warnings.clone()))
                })
                .await;
            match result {
                // Deleted meanwhile: apply creates it again.
                Err(e) if e.code() == 404 && part == Part::Main => continue,
                other => return other,
            }
        }
        Err(ApiError::stale(&key.name))
    }

    /// A status write by an in-process manager (the controller) on the revision it read (409 when the object
    /// changed since): through the same validation, field management and compare-and-swap as a PUT of `/status`.
    pub async fn update_status(
        &self,
        key: &PodSetKey,
        status: PodSetStatus,
        read_at: Revision,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.update_with(key, Subresource::Status, opts, Tracking::Update, |old, _| {
            let mut new = old.clone();
            new.status = Some(status.clone());
            new.metadata.resource_version = Some(read_at.to_string());
            Ok((new, Vec::new()))
        })
        .await
    }

    /// PUT or PATCH of `/scale`: only `spec.replicas` changes. Returns the Scale as written.
    pub async fn update_scale(
        &self,
        key: &PodSetKey,
        change: ScaleChange<'_>,
        opts: &WriteOptions,
    ) -> ApiResult<Scale> {
        let written = self
            .update_with(key, Subresource::Scale, opts, Tracking::Update, |old, _| {
                Ok((scale::scaled(old, &change, key)?, Vec::new()))
            })
            .await?;
        Ok(scale::scale_of(written.object.decode()?))
    }

    pub async fn delete(&self, key: &PodSetKey, opts: &DeleteOptions, dry_run: bool) -> ApiResult<Deleted> {
        let name = key.name.as_str();
        let storage_key = key.storage_key();
        for _ in 0..MAX_RETRIES {
            let current = self.get_for_write(key).await?.map(Stored::new).ok_or_else(|| ApiError::not_found(name))?;
            let mut ps = current.decode()?;
            if let Some(p) = &opts.preconditions {
                if let Some(uid) = p.uid.as_deref().filter(|u| Some(*u) != ps.metadata.uid.as_deref()) {
                    return Err(ApiError::conflict(
                        name,
                        &format!(
                            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                            ps.metadata.uid.as_deref().unwrap_or("")
                        ),
                    ));
                }
                let rv = current.resource_version();
                if let Some(want) = p.resource_version.as_deref().filter(|want| *want != rv.to_string()) {
                    return Err(ApiError::conflict(
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                        ),
                    ));
                }
            }
            let mut finalizers = ps.metadata.finalizers.clone().unwrap_or_default();
            let policy = opts.propagation_policy.as_deref().or(match opts.orphan_dependents {
                Some(true) => Some("Orphan"),
                Some(false) => Some("Background"),
                None => None,
            });
            match policy {
                Some("Orphan") => set_finalizer(&mut finalizers, "orphan", "foregroundDeletion"),
                Some("Foreground") => set_finalizer(&mut finalizers, "foregroundDeletion", "orphan"),
                Some("Background") => finalizers.retain(|f| f != "orphan" && f != "foregroundDeletion"),
                None => {}
                Some(other) => {
                    return Err(ApiError::invalid_kind(
                        "DeleteOptions.meta.k8s.io",
                        "",
                        &[FieldError {
                            field: "propagationPolicy".into(),
                            kind: validation::ErrorType::Invalid,
                            value: Some(format!("{other:?}")),
                            detail: "must be one of Orphan, Background, Foreground".into(),
                        }],
                    ))
                }
            }
            let gone = finalizers.is_empty();
            let expected = Some(current.resource_version());
            let result = if gone {
                if dry_run {
                    return Ok(Deleted { object: current, gone });
                }
                self.store.delete(&storage_key, expected).await
            } else {
                // Graceful: mark for deletion; whoever owns the finalizers finishes it.
                let before = ps.clone();
                ps.metadata.finalizers = Some(finalizers);
                if ps.metadata.deletion_timestamp.is_none() {
                    ps.metadata.deletion_timestamp = Some(now());
                    ps.metadata.deletion_grace_period_seconds = Some(0);
                }
                if ps == before {
                    return Ok(Deleted { object: current, gone });
                }
                let value = to_value(&ps)?;
                if dry_run {
                    return Ok(Deleted { object: Stored::unstored(value), gone });
                }
                let draft = Draft::new(&value, &[]).map_err(|e| storage_error(e, name))?;
                self.store.update(&storage_key, draft, expected).await
            };
            match result {
                Ok(object) => return Ok(Deleted { object: Stored::new(object), gone }),
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(storage_error(e, name)),
            }
        }
        Err(ApiError::stale(name))
    }

    /// Deletes every PodSet the list request selects; returns what was deleted (or marked for deletion) and the
    /// revision after.
    pub async fn delete_collection(
        &self,
        req: ListRequest,
        opts: &DeleteOptions,
        dry_run: bool,
    ) -> ApiResult<(Vec<Stored>, Revision)> {
        let page = self.list(ListRequest { limit: None, continue_token: None, ..req }).await?;
        let mut deleted = Vec::with_capacity(page.items.len());
        for item in page.items {
            match self.delete(&item.key(), opts, dry_run).await {
                Ok(d) => deleted.push(d.object),
                Err(e) if e.code() == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok((deleted, self.store.current_revision()))
    }
}

fn set_finalizer(finalizers: &mut Vec<String>, add: &str, remove: &str) {
    finalizers.retain(|f| f != remove);
    if !finalizers.iter().any(|f| f == add) {
        finalizers.push(add.to_owned());
    }
}
