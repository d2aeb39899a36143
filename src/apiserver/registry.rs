//! The PodSet REST semantics on top of a `Store`, after kube-apiserver's generic registry: system fields,
//! defaulting and validation, optimistic concurrency with retries, finalizers and graceful deletion, subresources.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use jiff::Timestamp;
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec, ScaleStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::negotiate::BodyFormat;
use super::request::FieldValidation;
use crate::api::defaults::default_podset;
use crate::api::selector::{FieldSelector, Selector};
use crate::api::validation::{self, FieldError};
use crate::api::{PodSet, API_VERSION, KIND};
use crate::registry::fieldmanager::{FieldManagerError, Subresource};
use crate::registry::podset_field_manager;
use crate::storage::{ListOptions, Object, Revision, StorageError, Store};

const KEY_ROOT: &str = "/podsets/";
/// Attempts at a read-modify-write before giving up on a hot object.
const MAX_RETRIES: usize = 32;

pub fn key(namespace: &str, name: &str) -> String {
    format!("{KEY_ROOT}{namespace}/{name}")
}

pub fn prefix(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{KEY_ROOT}{ns}/"),
        None => KEY_ROOT.to_owned(),
    }
}

/// An object and the warnings its request earned (unknown fields under `fieldValidation=Warn`).
pub struct Written {
    pub object: Arc<Object>,
    pub warnings: Vec<String>,
    /// The write created the object (an apply can).
    pub created: bool,
}

/// How a create, update or patch treats its body, and who makes it.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub field_validation: FieldValidation,
    pub dry_run: bool,
    /// The field manager: the `fieldManager` parameter, else derived from the User-Agent.
    pub field_manager: String,
    /// `force=true`: an apply takes over fields other managers own.
    pub force: bool,
}

/// Which part of a PodSet a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

impl Part {
    fn subresource(self) -> Subresource {
        match self {
            Part::Main => Subresource::Main,
            Part::Status => Subresource::Status,
        }
    }
}

/// `metav1.DeleteOptions`, from the body and the query.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    #[serde(default)]
    pub propagation_policy: Option<String>,
    #[serde(default)]
    pub orphan_dependents: Option<bool>,
    #[serde(default)]
    pub grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub preconditions: Option<Preconditions>,
    #[serde(default)]
    pub dry_run: Option<Vec<String>>,
}

impl DeleteOptions {
    /// `dryRun: [All]` in the body.
    pub fn dry_run_all(&self) -> bool {
        self.dry_run.iter().flatten().any(|d| d == "All")
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What a list reads: scope, selectors, revision and page.
#[derive(Default)]
pub struct ListRequest {
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<Revision>,
    pub exact: bool,
}

pub struct ListPage {
    pub items: Vec<Arc<Object>>,
    pub revision: Revision,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    start: String,
}

fn encode_continue(rv: i64, start: &str) -> String {
    let t = ContinueToken { v: "meta.k8s.io/v1".into(), rv, start: start.to_owned() };
    base64::engine::general_purpose::URL_SAFE.encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_continue(token: &str) -> ApiResult<ContinueToken> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE.decode(token).map_err(|_| bad())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if t.v != "meta.k8s.io/v1" || t.start.contains("..") || t.start.starts_with('/') {
        return Err(bad());
    }
    Ok(t)
}

fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn now_text() -> String {
    now().0.to_string()
}

impl From<FieldManagerError> for ApiError {
    fn from(e: FieldManagerError) -> Self {
        match e {
            FieldManagerError::Conflicts(conflicts) => ApiError::apply_conflict(
                &e_message(&conflicts),
                conflicts.iter().map(|c| (format!("conflict with {}", c.manager), c.field.clone())).collect(),
            ),
            FieldManagerError::BadRequest(m) => ApiError::bad_request(m),
            e @ FieldManagerError::Schema(_) => ApiError::bad_request(e.to_string()),
        }
    }
}

fn e_message(conflicts: &[crate::registry::fieldmanager::Conflict]) -> String {
    FieldManagerError::Conflicts(conflicts.to_vec()).to_string()
}

/// Records `manager`'s update in `value` (the object about to be stored). An object the schema cannot take
/// loses its field tracking rather than the write, as kube-apiserver does.
fn track_update(live: Option<&Value>, value: &mut Value, manager: &str, sub: Subresource) {
    if let Err(e) = podset_field_manager().update(live, value, manager, sub, &now_text()) {
        tracing::warn!(error = %e, "managedFields could not be updated; dropping them");
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    }
}

fn to_value(ps: &PodSet) -> ApiResult<Value> {
    serde_json::to_value(ps).map_err(|e| ApiError::internal(e.to_string()))
}

fn stored_podset(obj: &Object) -> ApiResult<PodSet> {
    PodSet::deserialize(&*obj.value)
        .map_err(|e| ApiError::internal(format!("stored object {} is unreadable: {e}", obj.key)))
}

/// An object that was not stored (dry run): its JSON without a new resourceVersion.
fn unstored(value: Value) -> Arc<Object> {
    let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
    Arc::new(Object { key: String::new(), value: Arc::new(value), bytes, mod_revision: 0 })
}

/// Parses a request body (JSON or YAML) into a JSON object.
pub fn parse_body(body: &[u8], format: BodyFormat) -> ApiResult<Value> {
    let value: Value =
        match format {
            BodyFormat::Yaml => serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error parsing YAML body: {e}")))?,
            _ => serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON body: {e}")))?,
        };
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// Decodes a PodSet, checking its type fields and, per `fieldValidation`, its unknown fields.
pub fn decode_podset(value: Value, fv: FieldValidation) -> ApiResult<(PodSet, Vec<String>)> {
    check_type(&value, API_VERSION, KIND)?;
    let mut unknown = Vec::new();
    let ps: PodSet = serde_ignored::deserialize(value, |path| unknown.push(path.to_string())).map_err(|e| {
        ApiError::bad_request(format!("PodSet in version \"v1alpha1\" cannot be handled as a PodSet: {e}"))
    })?;
    unknown_fields(unknown, fv, "PodSet").map(|w| (ps, w))
}

fn unknown_fields(unknown: Vec<String>, fv: FieldValidation, kind: &str) -> ApiResult<Vec<String>> {
    let messages: Vec<String> = unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
    match fv {
        FieldValidation::Strict if !messages.is_empty() => Err(ApiError::bad_request(format!(
            "{kind} in version \"v1alpha1\" cannot be handled as a {kind}: strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Warn => Ok(messages),
        _ => Ok(Vec::new()),
    }
}

fn check_type(value: &Value, api_version: &str, kind: &str) -> ApiResult<()> {
    if let Some(av) = value.get("apiVersion").filter(|v| !v.is_null()) {
        if av.as_str() != Some(api_version) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({api_version})",
                av.as_str().unwrap_or("?")
            )));
        }
    }
    if let Some(k) = value.get("kind").filter(|v| !v.is_null()) {
        if k.as_str() != Some(kind) {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({}) does not match the expected kind ({kind})",
                k.as_str().unwrap_or("?")
            )));
        }
    }
    Ok(())
}

/// Applies a JSON merge patch or JSON patch to a document.
pub fn apply_patch(doc: &mut Value, patch: &[u8], format: BodyFormat) -> ApiResult<()> {
    match format {
        BodyFormat::MergePatch => {
            let p: Value = serde_json::from_slice(patch).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !p.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(doc, &p);
            Ok(())
        }
        BodyFormat::JsonPatch => {
            let p: json_patch::Patch =
                serde_json::from_slice(patch).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(doc, &p).map_err(|e| {
                ApiError::invalid_kind("", "", &[FieldError::invalid("patch", String::from_utf8_lossy(patch), e.to_string())])
            })
        }
        BodyFormat::ApplyPatch => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "server-side apply (application/apply-patch+yaml) is not supported by this server yet; use kubectl apply without --server-side",
        )),
        _ => Err(ApiError::unsupported_patch(match format {
            BodyFormat::StrategicMergePatch => "application/strategic-merge-patch+json",
            _ => "application/json",
        })),
    }
}

fn scale_of(obj: &Object) -> ApiResult<Scale> {
    let ps = stored_podset(obj)?;
    let selector = ps.spec.selector.as_ref().and_then(|s| Selector::from_label_selector(s).ok()).map(|s| s.to_string());
    Ok(Scale {
        metadata: ObjectMeta {
            name: ps.metadata.name,
            namespace: ps.metadata.namespace,
            uid: ps.metadata.uid,
            resource_version: ps.metadata.resource_version,
            creation_timestamp: ps.metadata.creation_timestamp,
            ..Default::default()
        },
        spec: Some(ScaleSpec { replicas: ps.spec.replicas }),
        status: Some(ScaleStatus { replicas: ps.status.map(|s| s.replicas).unwrap_or(0), selector }),
    })
}

pub fn scale_json(obj: &Object) -> ApiResult<Value> {
    serde_json::to_value(scale_of(obj)?).map_err(|e| ApiError::internal(e.to_string()))
}

/// The PodSet registry.
#[derive(Clone)]
pub struct Registry {
    store: Arc<dyn Store>,
}

impl Registry {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub async fn get(&self, namespace: &str, name: &str) -> ApiResult<Arc<Object>> {
        self.store
            .get(&key(namespace, name))
            .await
            .map_err(|e| ApiError::from_storage(e, name))?
            .ok_or_else(|| ApiError::not_found(name))
    }

    /// Resolves which revision a list or watch reads at (`resourceVersion` + `resourceVersionMatch`).
    pub async fn read_revision(&self, requested: Option<Revision>, exact: bool) -> ApiResult<Revision> {
        let current = self.store.current_revision();
        match requested {
            None | Some(0) => Ok(current),
            Some(rv) if exact => Ok(rv),
            Some(rv) => {
                // "Not older than": wait briefly for a revision another replica may have written.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                while self.store.current_revision() < rv {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(ApiError::too_large_resource_version(rv, self.store.current_revision()));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(self.store.current_revision())
            }
        }
    }

    pub async fn list(&self, req: ListRequest) -> ApiResult<ListPage> {
        let prefix = prefix(req.namespace.as_deref());
        let (revision, start_key) = match &req.continue_token {
            Some(token) => {
                let t = decode_continue(token)?;
                let rv = if t.rv <= 0 { self.store.current_revision() } else { t.rv as u64 };
                (rv, Some(format!("{prefix}{}", t.start)))
            }
            None => (self.read_revision(req.resource_version, req.exact).await?, None),
        };
        let (labels, fields) = (req.labels, req.fields);
        let predicate: Option<crate::storage::Predicate> = if labels.is_empty() && fields.is_empty() {
            None
        } else {
            Some(Box::new(move |o: &Object| labels.matches_json(&o.value) && fields.matches_json(&o.value)))
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
                    meta.continue_ = Some(encode_continue(-1, start));
                }
                return Err(e);
            }
            other => other.map_err(|e| ApiError::from_storage(e, ""))?,
        };
        let continue_token = result
            .next_key
            .as_deref()
            .map(|k| encode_continue(result.revision as i64, k.strip_prefix(&prefix).unwrap_or(k)));
        Ok(ListPage { items: result.items, revision: result.revision, continue_token, remaining: result.remaining })
    }

    pub async fn create(&self, namespace: &str, body: Value, opts: WriteOptions) -> ApiResult<Written> {
        let (ps, warnings) = decode_podset(body, opts.field_validation)?;
        self.insert(namespace, ps, warnings, &opts, Tracking::Update).await
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
        let dry_run = opts.dry_run;
        let meta = &mut ps.metadata;
        match meta.namespace.as_deref() {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => meta.namespace = Some(namespace.to_owned()),
        }
        if meta.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        let generate = meta.name.as_deref().is_none_or(str::is_empty).then(|| meta.generate_name.clone()).flatten();
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
        meta.creation_timestamp = Some(now());
        meta.generation = Some(1);
        meta.deletion_timestamp = None;
        meta.deletion_grace_period_seconds = None;
        meta.self_link = None;
        ps.status = None;
        ps.api_version = API_VERSION.into();
        ps.kind = KIND.into();

        for attempt in 0.. {
            if let Some(prefix) = &generate {
                ps.metadata.name = Some(format!("{}{}", truncate_generate_name(prefix), random_suffix()));
            }
            let name = ps.metadata.name.clone().unwrap_or_default();
            let mut candidate = ps.clone();
            default_podset(&mut candidate);
            let errors = validation::validate(&candidate);
            if !errors.is_empty() {
                return Err(ApiError::invalid(&name, &errors));
            }
            let mut value = to_value(&candidate)?;
            if tracking == Tracking::Update {
                track_update(None, &mut value, &opts.field_manager, Subresource::Main);
            }
            if dry_run {
                return Ok(Written { object: unstored(value), warnings, created: true });
            }
            match self.store.create(&key(namespace, &name), value).await {
                Ok(object) => return Ok(Written { object, warnings, created: true }),
                Err(StorageError::AlreadyExists { .. }) if generate.is_some() && attempt < 8 => continue,
                Err(e) => return Err(ApiError::from_storage(e, &name)),
            }
        }
        unreachable!("the loop returns")
    }

    /// Read-modify-write with compare-and-swap: `propose` builds the new object from the current one; a
    /// resourceVersion it carries is a precondition, otherwise conflicts are retried on fresh state.
    async fn update_with<F>(
        &self,
        namespace: &str,
        name: &str,
        sub: Subresource,
        opts: &WriteOptions,
        tracking: Tracking,
        propose: F,
    ) -> ApiResult<Written>
    where
        F: Fn(&PodSet, &Object) -> ApiResult<(PodSet, Vec<String>)>,
    {
        let dry_run = opts.dry_run;
        let part = if sub == Subresource::Status { Part::Status } else { Part::Main };
        let key = key(namespace, name);
        for _ in 0..MAX_RETRIES {
            let current = self.get(namespace, name).await?;
            let old = stored_podset(&current)?;
            let (proposed, warnings) = propose(&old, &current)?;
            let precondition = proposed.metadata.resource_version.clone().filter(|rv| !rv.is_empty());
            if precondition.as_deref().is_some_and(|rv| rv != current.mod_revision.to_string()) {
                return Err(ApiError::stale(name));
            }
            let mut new = prepare_update(proposed, &old, part, name, namespace)?;
            let mut value = to_value(&new)?;
            if tracking == Tracking::Update {
                track_update(Some(&current.value), &mut value, &opts.field_manager, sub);
            }
            new.metadata.managed_fields =
                value.pointer("/metadata/managedFields").and_then(|m| serde_json::from_value(m.clone()).ok());
            if new == old {
                return Ok(Written { object: current, warnings, created: false });
            }
            if dry_run {
                return Ok(Written { object: unstored(value), warnings, created: false });
            }
            let deleting =
                new.metadata.deletion_timestamp.is_some() && new.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
            let result = if deleting {
                // The last finalizer is gone: the object goes now, as kube-apiserver does.
                if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                self.store.delete(&key, Some(current.mod_revision)).await
            } else {
                self.store.update(&key, value, Some(current.mod_revision)).await
            };
            match result {
                Ok(object) => return Ok(Written { object, warnings, created: false }),
                // Raced with another write: propose again on the new state (a precondition is checked there).
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(ApiError::from_storage(e, name)),
            }
        }
        Err(ApiError::stale(name))
    }

    /// PUT of the whole object or its status.
    pub async fn replace(
        &self,
        namespace: &str,
        name: &str,
        body: Value,
        part: Part,
        opts: WriteOptions,
    ) -> ApiResult<Written> {
        let (ps, warnings) = decode_podset(body, opts.field_validation)?;
        check_identity(&ps.metadata, namespace, name)?;
        self.update_with(namespace, name, part.subresource(), &opts, Tracking::Update, |_, _| {
            Ok((ps.clone(), warnings.clone()))
        })
        .await
    }

    /// PATCH of the whole object or its status.
    pub async fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: &[u8],
        format: BodyFormat,
        part: Part,
        opts: WriteOptions,
    ) -> ApiResult<Written> {
        if format == BodyFormat::ApplyPatch {
            return self.apply(namespace, name, patch, part, opts).await;
        }
        self.update_with(namespace, name, part.subresource(), &opts, Tracking::Update, |_, current| {
            let mut doc = (*current.value).clone();
            apply_patch(&mut doc, patch, format)?;
            let (ps, warnings) = decode_podset(doc, opts.field_validation)?;
            check_identity(&ps.metadata, namespace, name)?;
            Ok((ps, warnings))
        })
        .await
    }

    /// Server-side apply (`application/apply-patch+yaml`) to the object or its status, by `opts.field_manager`;
    /// creates the object when it does not exist.
    async fn apply(
        &self,
        namespace: &str,
        name: &str,
        patch: &[u8],
        part: Part,
        opts: WriteOptions,
    ) -> ApiResult<Written> {
        if opts.field_manager.is_empty() {
            return Err(ApiError::invalid_kind(
                "PatchOptions.meta.k8s.io",
                "",
                &[FieldError::required("fieldManager", "is required for apply patch")],
            ));
        }
        let fm = podset_field_manager();
        let mut config = parse_body(patch, BodyFormat::Yaml)?;
        // Unknown fields per fieldValidation, and the type fields, as for any other write.
        let (decoded, warnings) = decode_podset(config.clone(), opts.field_validation)?;
        check_identity(&decoded.metadata, namespace, name)?;
        crate::registry::fieldmanager::typed::prune_unknown(fm.schema(), &mut config);
        let sub = part.subresource();
        for _ in 0..MAX_RETRIES {
            let exists = self.store.get(&key(namespace, name)).await.map_err(|e| ApiError::from_storage(e, name))?;
            if exists.is_none() {
                if part == Part::Status {
                    return Err(ApiError::not_found(name));
                }
                let merged = fm.apply(None, &config, &opts.field_manager, sub, opts.force, &now_text())?;
                let (mut ps, _) = decode_podset(merged, FieldValidation::Ignore)?;
                ps.metadata.name = Some(name.to_owned());
                match self.insert(namespace, ps, warnings.clone(), &opts, Tracking::Done).await {
                    // Created by someone else meanwhile: apply to theirs.
                    Err(e) if e.reason() == "AlreadyExists" => continue,
                    other => return other,
                }
            }
            let result = self
                .update_with(namespace, name, sub, &opts, Tracking::Done, |_, current| {
                    let merged =
                        fm.apply(Some(&current.value), &config, &opts.field_manager, sub, opts.force, &now_text())?;
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
        Err(ApiError::stale(name))
    }

    /// A status write by an in-process manager (the controller), on the revision it read: through the same
    /// validation, field management and compare-and-swap as a write to `/status`.
    pub async fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: crate::api::PodSetStatus,
        read_at: Revision,
        manager: &str,
    ) -> ApiResult<Written> {
        let opts = WriteOptions { field_manager: manager.to_owned(), ..Default::default() };
        self.update_with(namespace, name, Subresource::Status, &opts, Tracking::Update, |old, _| {
            let mut new = old.clone();
            new.status = Some(status.clone());
            new.metadata.resource_version = Some(read_at.to_string());
            Ok((new, Vec::new()))
        })
        .await
    }

    /// PUT or PATCH of `/scale`: only `spec.replicas` changes.
    pub async fn update_scale(
        &self,
        namespace: &str,
        name: &str,
        change: ScaleChange<'_>,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        self.update_with(namespace, name, Subresource::Scale, opts, Tracking::Update, |old, current| {
            let scale_value = match &change {
                ScaleChange::Replace(body) => body.clone(),
                ScaleChange::Patch(patch, format) => {
                    let mut doc = scale_json(current)?;
                    apply_patch(&mut doc, patch, *format)?;
                    doc
                }
            };
            check_type(&scale_value, "autoscaling/v1", "Scale")?;
            let scale: Scale = serde_json::from_value(scale_value).map_err(|e| {
                ApiError::bad_request(format!("Scale in version \"v1\" cannot be handled as a Scale: {e}"))
            })?;
            check_identity(&scale.metadata, namespace, name)?;
            let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
            if replicas < 0 {
                return Err(ApiError::invalid_kind(
                    "Scale.autoscaling",
                    name,
                    &[FieldError::invalid("spec.replicas", replicas, "must be greater than or equal to 0")],
                ));
            }
            let mut new = old.clone();
            new.spec.replicas = Some(replicas);
            new.metadata.resource_version = scale.metadata.resource_version;
            new.metadata.managed_fields = None;
            Ok((new, Vec::new()))
        })
        .await
    }

    pub async fn delete(&self, namespace: &str, name: &str, opts: &DeleteOptions, dry_run: bool) -> ApiResult<Deleted> {
        let key = key(namespace, name);
        for _ in 0..MAX_RETRIES {
            let current = self.get(namespace, name).await?;
            let mut ps = stored_podset(&current)?;
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
                if let Some(rv) = p.resource_version.as_deref().filter(|rv| *rv != current.mod_revision.to_string()) {
                    return Err(ApiError::conflict(name, &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        current.mod_revision
                    )));
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
            let result = if gone {
                if dry_run {
                    return Ok(Deleted { object: current, gone });
                }
                self.store.delete(&key, Some(current.mod_revision)).await
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
                    return Ok(Deleted { object: unstored(value), gone });
                }
                self.store.update(&key, value, Some(current.mod_revision)).await
            };
            match result {
                Ok(object) => return Ok(Deleted { object, gone }),
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(ApiError::from_storage(e, name)),
            }
        }
        Err(ApiError::stale(name))
    }

    /// Deletes every PodSet the list request selects; returns what was deleted (or marked for deletion).
    pub async fn delete_collection(
        &self,
        req: ListRequest,
        opts: &DeleteOptions,
        dry_run: bool,
    ) -> ApiResult<(Vec<Arc<Object>>, Revision)> {
        let page = self.list(ListRequest { limit: None, continue_token: None, ..req }).await?;
        let mut deleted = Vec::with_capacity(page.items.len());
        for item in page.items {
            let ns = item.value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_owned();
            let name = item.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
            match self.delete(&ns, &name, opts, dry_run).await {
                Ok(d) => deleted.push(d.object),
                Err(e) if e.code() == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok((deleted, self.store.current_revision()))
    }
}

/// Whether a write still needs its managedFields updated (an apply has done it already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    Update,
    Done,
}

/// The outcome of a delete: the object, and whether it is gone (rather than marked for deletion).
pub struct Deleted {
    pub object: Arc<Object>,
    pub gone: bool,
}

/// The body of a `/scale` write.
pub enum ScaleChange<'a> {
    Replace(Value),
    Patch(&'a [u8], BodyFormat),
}

fn set_finalizer(finalizers: &mut Vec<String>, add: &str, remove: &str) {
    finalizers.retain(|f| f != remove);
    if !finalizers.iter().any(|f| f == add) {
        finalizers.push(add.to_owned());
    }
}

fn check_identity(meta: &ObjectMeta, namespace: &str, name: &str) -> ApiResult<()> {
    if let Some(n) = meta.name.as_deref().filter(|n| *n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    if meta.namespace.as_deref().is_some_and(|ns| !ns.is_empty() && ns != namespace) {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// Carries the server-owned fields over from `old`, bumps `generation` on a spec change, defaults and validates.
fn prepare_update(mut new: PodSet, old: &PodSet, part: Part, name: &str, namespace: &str) -> ApiResult<PodSet> {
    if let (Some(want), Some(have)) =
        (new.metadata.uid.as_deref().filter(|u| !u.is_empty()), old.metadata.uid.as_deref())
    {
        if want != have {
            return Err(ApiError::conflict(
                name,
                &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {have}"),
            ));
        }
    }
    let mut next = match part {
        Part::Status => {
            let mut next = old.clone();
            next.status = new.status.take();
            // What field management decided (it never takes a status write's own managedFields).
            next.metadata.managed_fields = new.metadata.managed_fields.take();
            let errors = validation::validate_status_update(&next);
            if !errors.is_empty() {
                return Err(ApiError::invalid(name, &errors));
            }
            next
        }
        Part::Main => {
            let m = &mut new.metadata;
            let o = &old.metadata;
            m.name = Some(name.to_owned());
            m.namespace = Some(namespace.to_owned());
            m.uid = o.uid.clone();
            m.creation_timestamp = o.creation_timestamp.clone();
            m.deletion_timestamp = o.deletion_timestamp.clone();
            m.deletion_grace_period_seconds = o.deletion_grace_period_seconds;
            m.generate_name = m.generate_name.take().or_else(|| o.generate_name.clone());
            m.self_link = None;
            new.status = old.status.clone();
            default_podset(&mut new);
            let errors = validation::validate_update(&new, old);
            if !errors.is_empty() {
                return Err(ApiError::invalid(name, &errors));
            }
            let generation = old.metadata.generation.unwrap_or(1);
            new.metadata.generation = Some(if new.spec != old.spec { generation + 1 } else { generation });
            new
        }
    };
    next.api_version = API_VERSION.into();
    next.kind = KIND.into();
    next.metadata.resource_version = old.metadata.resource_version.clone();
    Ok(next)
}

/// kube-apiserver keeps generated names within 63 characters: at most 58 of the prefix.
fn truncate_generate_name(prefix: &str) -> &str {
    let max = 58;
    if prefix.len() <= max {
        return prefix;
    }
    let mut end = max;
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    &prefix[..end]
}

/// Five characters from the alphabet kube-apiserver uses (no vowels, no confusable digits).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = decode_continue(&encode_continue(42, "ns/b\u{0}")).unwrap();
        assert_eq!((t.rv, t.start.as_str()), (42, "ns/b\u{0}"));
        assert_eq!(decode_continue("not base64!").unwrap_err().code(), 400);
        let sneaky =
            base64::engine::general_purpose::URL_SAFE.encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../x"}"#);
        assert_eq!(decode_continue(&sneaky).unwrap_err().code(), 400);
    }

    #[test]
    fn generated_names_have_five_random_characters() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
        assert_eq!(truncate_generate_name(&"a".repeat(80)).len(), 58);
    }

    #[test]
    fn strict_decoding_rejects_unknown_fields_and_warn_reports_them() {
        let v = serde_json::json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "bogus": true}});
        let err = decode_podset(v.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(err.status.message.contains("unknown field \"spec.bogus\""), "{}", err.status.message);
        let (_, warnings) = decode_podset(v.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(warnings, vec!["unknown field \"spec.bogus\"".to_owned()]);
        assert!(decode_podset(v, FieldValidation::Ignore).unwrap().1.is_empty());
        let wrong_kind = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}});
        assert_eq!(decode_podset(wrong_kind, FieldValidation::Warn).unwrap_err().code(), 400);
    }
}
