//! Field management, as k8s.io/apiserver's fieldmanager over structured-merge-diff: who owns which field of a
//! stored object (`metadata.managedFields`), updated on every write, and server-side apply with conflicts.
//!
//! Objects are plain JSON here; the registry decides what a write may change (status vs main, defaults) and
//! calls [`FieldManager::update`] for every create, update and patch, [`FieldManager::apply`] for an apply patch.
//! A mutating admission policy's apply configuration merges by the same schema, tracked by nobody
//! ([`apply_configuration`]).

mod applyconfig;
pub mod path;
pub mod schema;
pub mod set;
pub mod typed;

use std::collections::{btree_map, BTreeMap};

use serde_json::{json, Map, Value};

pub use self::applyconfig::apply_configuration;
use self::path::{Path, PathElement};
use self::schema::Schema;
use self::set::Set;
use self::typed::SchemaError;

/// The annotation client-side `kubectl apply` keeps; server-side apply by `kubectl` keeps it in step.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The manager that gets the fields of an object that had none tracked when it is first applied.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";
/// Where the oldest updaters' fields go when there are too many of them.
const ANCIENT_CHANGES: &str = "ancient-changes";
const MAX_UPDATE_MANAGERS: usize = 10;
/// Only this manager's applies may take over fields from a client-side apply (kube-apiserver's rule).
const KUBECTL: &str = "kubectl";
const CURRENT_OPERATION: &str = "\u{0}current-operation";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

pub use crate::api::Subresource;

/// What makes two managedFields entries one: the same manager, operation and subresource (and, for updates,
/// API version).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ManagerId {
    manager: String,
    operation: Operation,
    api_version: String,
    subresource: String,
}

impl ManagerId {
    /// How conflicts name a manager: `"kubectl"`, `"podset-controller" using demo.k8s.io/v1alpha1`.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if self.operation == Operation::Update {
            s = format!("{s} using {}", self.api_version);
        }
        if !self.subresource.is_empty() {
            s = format!("{s} with subresource {:?}", self.subresource);
        }
        s
    }
}

#[derive(Debug, Clone)]
struct Entry {
    set: Set,
    api_version: String,
    time: Option<String>,
}

type Managed = BTreeMap<ManagerId, Entry>;

/// One field another manager owns and an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The manager as kube-apiserver prints it.
    pub manager: String,
    /// The field, as `.spec.replicas`.
    pub field: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FieldManagerError {
    #[error("{}", conflict_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The apply request itself is wrong (400).
    #[error("{0}")]
    BadRequest(String),
    /// The object does not fit the schema (duplicate keys, missing key fields).
    #[error("failed to create typed object: {0}")]
    Schema(#[from] SchemaError),
}

/// kube-apiserver's message for apply conflicts.
fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!("Apply failed with 1 conflict: conflict with {}: {}", c.manager, c.field);
    }
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (manager, fields) in by_manager {
        lines.push(format!("conflicts with {manager}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
}

/// Field management for one resource type.
pub struct FieldManager {
    schema: Schema,
    api_version: String,
    /// The fields every object has even when empty (Go's non-pointer structs): a create or a first status write
    /// is compared against these, so they never show up as owned nodes (`.`) of their own.
    skeleton: Value,
    strip: Set,
    /// Per subresource, see [`FieldManager::ignored`].
    ignored: [Set; 3],
}

fn field_path(names: &[&str]) -> Path {
    names.iter().map(|n| PathElement::Field((*n).to_owned())).collect()
}

fn set_of(paths: &[&[&str]]) -> Set {
    let mut s = Set::new();
    for p in paths {
        s.insert(&field_path(p));
    }
    s
}

fn annotations(v: &Value) -> Option<&Map<String, Value>> {
    v.pointer("/metadata/annotations").and_then(Value::as_object)
}

/// kube's reset fields: per subresource, the fields a write to it never changes (the main resource keeps status,
/// `/status` everything else), so that nobody owns them through it.
pub struct ResetFields {
    pub main: &'static [&'static [&'static str]],
    pub status: &'static [&'static [&'static str]],
    pub scale: &'static [&'static [&'static str]],
}

impl FieldManager {
    /// `definitions`: OpenAPI v3 component schemas; `root`: the resource's definition name; `reset`: what each
    /// subresource never writes.
    pub fn new(
        definitions: &Map<String, Value>,
        root: &str,
        api_version: &str,
        skeleton: Value,
        reset: &ResetFields,
    ) -> Self {
        let strip = set_of(&[
            &["apiVersion"],
            &["kind"],
            &["metadata"],
            &["metadata", "name"],
            &["metadata", "namespace"],
            &["metadata", "creationTimestamp"],
            &["metadata", "selfLink"],
            &["metadata", "uid"],
            &["metadata", "clusterName"],
            &["metadata", "generation"],
            &["metadata", "managedFields"],
            &["metadata", "resourceVersion"],
        ]);
        let ignored = [set_of(reset.main), set_of(reset.status), set_of(reset.scale)];
        Self {
            schema: Schema::from_openapi(definitions, root),
            api_version: api_version.to_owned(),
            skeleton,
            strip,
            ignored,
        }
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Fields a write to `sub` never changes, so nobody owns them through it (kube-apiserver's reset fields).
    fn ignored(&self, sub: Subresource) -> &Set {
        match sub {
            Subresource::Main => &self.ignored[0],
            Subresource::Status => &self.ignored[1],
            Subresource::Scale => &self.ignored[2],
        }
    }

    fn id(&self, manager: &str, operation: Operation, sub: Subresource) -> ManagerId {
        ManagerId {
            manager: manager.to_owned(),
            operation,
            api_version: if operation == Operation::Update { self.api_version.clone() } else { String::new() },
            subresource: sub.as_str().to_owned(),
        }
    }

    /// Records an update (create, update, merge or JSON patch) by `manager` on `new`, which is the object about to
    /// be stored; `live` is the stored object (`None` on create). `new`'s `metadata.managedFields` as the client
    /// sent it replace the live ones when they differ (`[]` or `[{}]` clear them); on a subresource they are
    /// ignored.
    pub fn update(
        &self,
        live: Option<&Value>,
        new: &mut Value,
        manager: &str,
        sub: Subresource,
        now: &str,
    ) -> Result<(), FieldManagerError> {
        let live_managed = live.map(decode_managed_fields).and_then(Result::ok).unwrap_or_default();
        let sent = new.pointer("/metadata/managedFields").cloned();
        let managed = if sub != Subresource::Main {
            live_managed
        } else if is_reset(sent.as_ref()) {
            Managed::new()
        } else {
            match sent.as_ref().and_then(Value::as_array).map(|a| decode_entries(a)) {
                Some(Ok(m)) if !m.is_empty() => m,
                _ => live_managed,
            }
        };
        remove_managed_fields(new);
        // An object that existed without field tracking stays so until it is applied (kube-apiserver's rule).
        if managed.is_empty() && live.is_some() {
            return Ok(());
        }
        let live = live.map(without_managed_fields).unwrap_or_else(|| json!({}));
        let managed = self.track_update(&live, new, managed, manager, sub, now)?;
        set_managed_fields(new, &managed);
        Ok(())
    }

    /// [`FieldManager::update`] of a create on the main resource of an object sent without managedFields, for a
    /// caller that stores objects serialized: the JSON of the `metadata.managedFields` to store with `new` (`None`:
    /// nothing to record), written in one walk that builds no set and no tree. `new` is left as `update` leaves
    /// it, but for that field.
    pub fn created_managed_fields(
        &self,
        new: &mut Value,
        manager: &str,
        now: &str,
    ) -> Result<Option<String>, FieldManagerError> {
        debug_assert!(new.pointer("/metadata/managedFields").is_none_or(Value::is_null));
        remove_managed_fields(new);
        let text = |out: &mut Vec<u8>, s: &str| serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
        // One entry, its keys in the order serde_json writes a map's.
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"[{\"apiVersion\":");
        text(&mut out, &self.api_version);
        out.extend_from_slice(b",\"fieldsType\":\"FieldsV1\",\"fieldsV1\":");
        let ignored = self.ignored(Subresource::Main);
        let any =
            typed::write_created_fields_v1(&self.schema, new, Some(&self.skeleton), ignored, &self.strip, &mut out)?;
        if let Some(o) = new.as_object_mut() {
            o.entry("metadata").or_insert_with(|| json!({}));
        }
        if !any {
            return Ok(None);
        }
        out.extend_from_slice(b",\"manager\":");
        text(&mut out, manager);
        out.extend_from_slice(b",\"operation\":\"Update\",\"time\":");
        text(&mut out, now);
        out.extend_from_slice(b"}]");
        Ok(Some(String::from_utf8(out).expect("JSON is UTF-8")))
    }

    fn track_update(
        &self,
        live: &Value,
        new: &Value,
        mut managed: Managed,
        manager: &str,
        sub: Subresource,
        now: &str,
    ) -> Result<Managed, FieldManagerError> {
        let ignored = self.ignored(sub);
        let mut set = if managed.is_empty() && live.as_object().is_some_and(Map::is_empty) {
            // A create: nobody owns anything to take from, and the writer owns all it set. One walk over `new`
            // finds that, where comparing against `{}` would build and merge three sets.
            let mut set = typed::created_set(&self.schema, new, Some(&self.skeleton))?;
            set.recursive_difference_in_place(ignored);
            set
        } else {
            let current = ManagerId { manager: CURRENT_OPERATION.into(), ..self.id(manager, Operation::Update, sub) };
            let cmp = self.update_managers(live, new, &mut managed, &current, true, ignored)?;
            cmp.modified.union(&cmp.added)
        };
        set.difference_in_place(&self.strip);
        if !set.is_empty() {
            let time = Some(now.to_owned());
            match managed.entry(self.id(manager, Operation::Update, sub)) {
                btree_map::Entry::Occupied(mut e) => {
                    let e = e.get_mut();
                    e.set.union_in_place(&set);
                    e.time = time;
                }
                btree_map::Entry::Vacant(e) => {
                    e.insert(Entry { set, api_version: self.api_version.clone(), time });
                }
            }
        }
        cap_update_managers(&mut managed, &self.api_version);
        Ok(managed)
    }

    /// structured-merge-diff's `update`: what changed from `old` to `new` is taken from every manager but
    /// `workflow`; without `force`, a change to another manager's field is a conflict.
    fn update_managers(
        &self,
        old: &Value,
        new: &Value,
        managed: &mut Managed,
        workflow: &ManagerId,
        force: bool,
        ignored: &Set,
    ) -> Result<typed::Comparison, FieldManagerError> {
        let mut cmp = typed::compare_with_skeleton(&self.schema, old, new, Some(&self.skeleton))?;
        cmp.added = cmp.added.recursive_difference(ignored);
        cmp.modified = cmp.modified.recursive_difference(ignored);
        cmp.removed = cmp.removed.recursive_difference(ignored);
        let changed = cmp.modified.union(&cmp.added);
        let mut conflicts = Vec::new();
        for (id, entry) in managed.iter_mut() {
            if id == workflow {
                continue;
            }
            let taken = entry.set.intersection(&changed);
            if !taken.is_empty() {
                if !force {
                    let manager = id.describe();
                    conflicts.extend(
                        taken
                            .paths()
                            .iter()
                            .map(|p| Conflict { manager: manager.clone(), field: path::Display(p).to_string() }),
                    );
                    continue;
                }
                entry.set = entry.set.difference(&taken);
            }
            if !cmp.removed.is_empty() {
                entry.set = entry.set.difference(&cmp.removed);
            }
        }
        if !conflicts.is_empty() {
            return Err(FieldManagerError::Conflicts(conflicts));
        }
        managed.retain(|_, e| !e.set.is_empty());
        Ok(cmp)
    }

    /// Server-side apply of `config` by `manager`: the object to store, with its managedFields.
    pub fn apply(
        &self,
        live: Option<&Value>,
        config: &Value,
        manager: &str,
        sub: Subresource,
        force: bool,
        now: &str,
    ) -> Result<Value, FieldManagerError> {
        let version = config.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if version != self.api_version {
            return Err(FieldManagerError::BadRequest(format!(
                "Incorrect version specified in apply patch. Specified patch version: {version}, expected: {}",
                self.api_version
            )));
        }
        if config.pointer("/metadata/managedFields").is_some_and(|m| !m.is_null()) {
            return Err(FieldManagerError::BadRequest("metadata.managedFields must be nil".into()));
        }
        let mut managed = live.map(decode_managed_fields).and_then(Result::ok).unwrap_or_default();
        let mut live_obj = live.map(without_managed_fields).unwrap_or_else(|| json!({}));
        if managed.is_empty() && live.is_some() {
            // The fields set before tracking began belong to someone: attribute them before applying.
            managed = self.track_update(&json!({}), &live_obj, managed, BEFORE_FIRST_APPLY, Subresource::Main, now)?;
        }
        let mut result = match self.apply_once(&live_obj, config, managed.clone(), manager, sub, force, now) {
            Err(FieldManagerError::Conflicts(conflicts)) if manager == KUBECTL && !force => {
                // A client-side apply's fields may be taken over by kubectl's server-side apply.
                let allowed = self.last_applied_fields(&live_obj);
                let all_allowed = allowed.is_some_and(|a| {
                    conflicts.iter().all(|c| a.iter().any(|p| path::Display(p).to_string() == c.field))
                });
                if !all_allowed {
                    return Err(FieldManagerError::Conflicts(conflicts));
                }
                self.apply_once(&live_obj, config, managed, manager, sub, true, now)?
            }
            other => other?,
        };
        if manager == KUBECTL && annotations(&result.0).is_some_and(|a| a.contains_key(LAST_APPLIED)) {
            let mut applied = config.clone();
            if let Some(a) = applied.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
                a.remove(LAST_APPLIED);
                if a.is_empty() {
                    applied["metadata"].as_object_mut().map(|m| m.remove("annotations"));
                }
            }
            let text = serde_json::to_string(&applied).unwrap_or_default();
            if let Some(a) = result.0.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
                a.insert(LAST_APPLIED.into(), Value::String(text));
            }
        }
        live_obj = result.0;
        cap_update_managers(&mut result.1, &self.api_version);
        set_managed_fields(&mut live_obj, &result.1);
        Ok(live_obj)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_once(
        &self,
        live: &Value,
        config: &Value,
        mut managed: Managed,
        manager: &str,
        sub: Subresource,
        force: bool,
        now: &str,
    ) -> Result<(Value, Managed), FieldManagerError> {
        let ignored = self.ignored(sub);
        let id = self.id(manager, Operation::Apply, sub);
        let merged = typed::merge(&self.schema, live, config)?;
        let set = typed::to_field_set(&self.schema, config)?.recursive_difference(ignored).difference(&self.strip);
        let previous = managed.remove(&id);
        managed.insert(
            id.clone(),
            Entry { set, api_version: self.api_version.clone(), time: previous.as_ref().and_then(|p| p.time.clone()) },
        );
        let merged = match previous.as_ref().filter(|p| !p.set.is_empty()) {
            Some(last) => self.prune(&merged, &managed, &last.set)?,
            None => merged,
        };
        self.update_managers(live, &merged, &mut managed, &id, force, ignored)?;
        if let Some(e) = managed.get_mut(&id) {
            if merged != *live || e.time.is_none() {
                e.time = Some(now.to_owned());
            }
        }
        Ok((merged, managed))
    }

    /// Removes from `merged` the fields the applier owned last time, no longer applies, and nobody else owns
    /// (structured-merge-diff's `prune`, `addBackOwnedItems`, `addBackDanglingItems`).
    fn prune(&self, merged: &Value, managed: &Managed, last: &Set) -> Result<Value, FieldManagerError> {
        let s = &self.schema;
        let ensure = |set: &Set| typed::ensure_named_fields_are_members(s, set);
        let last = ensure(last);
        let pruned = typed::remove_items(s, merged, &last);
        let mut owned = Set::new();
        for e in managed.values() {
            owned.union_in_place(&e.set);
        }
        let merged_set = ensure(&typed::to_field_set(s, merged)?);
        let pruned_set = ensure(&typed::to_field_set(s, &pruned)?);
        let pruned = typed::remove_items(s, merged, &merged_set.difference(&pruned_set.union(&ensure(&owned))));
        let pruned_set = ensure(&typed::to_field_set(s, &pruned)?);
        Ok(typed::remove_items(s, merged, &merged_set.difference(&pruned_set).intersection(&last)))
    }

    /// The paths a client-side apply set that still hold the value it set (from its annotation).
    fn last_applied_fields(&self, live: &Value) -> Option<Vec<Path>> {
        let text = annotations(live)?.get(LAST_APPLIED)?.as_str()?;
        let mut last: Value = serde_json::from_str(text).ok()?;
        typed::prune_unknown(&self.schema, &mut last);
        let set = typed::to_field_set(&self.schema, &last).ok()?;
        let cmp = typed::compare(&self.schema, &last, live).ok()?;
        Some(set.difference(&cmp.modified).paths())
    }
}

/// `managedFields: []` or `[{}]` in a write clears them.
fn is_reset(sent: Option<&Value>) -> bool {
    match sent {
        Some(Value::Array(a)) => a.is_empty() || (a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty)),
        _ => false,
    }
}

fn without_managed_fields(v: &Value) -> Value {
    let mut v = v.clone();
    remove_managed_fields(&mut v);
    v
}

fn remove_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
}

fn decode_managed_fields(obj: &Value) -> Result<Managed, String> {
    let list = match obj.pointer("/metadata/managedFields") {
        None | Some(Value::Null) => return Ok(Managed::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("managedFields must be a list".into()),
    };
    decode_entries(list)
}

fn decode_entries(list: &[Value]) -> Result<Managed, String> {
    let mut managed = Managed::new();
    for (i, e) in list.iter().enumerate() {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
        let operation = match s("operation") {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return Err("operation must be `Apply` or `Update`".into()),
        };
        if s("apiVersion").is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match s("fieldsType") {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {i}")),
            other => return Err(format!("invalid fieldsType {other:?} in managed fields entry {i}")),
        }
        let set = Set::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Object(Map::new())))?;
        let id = ManagerId {
            manager: s("manager").to_owned(),
            operation,
            api_version: if operation == Operation::Update { s("apiVersion").to_owned() } else { String::new() },
            subresource: s("subresource").to_owned(),
        };
        let time = e.get("time").and_then(Value::as_str).map(str::to_owned);
        managed.insert(id, Entry { set, api_version: s("apiVersion").to_owned(), time });
    }
    Ok(managed)
}

/// Writes `managed` into `metadata.managedFields`, in kube-apiserver's order: applies first, then by time,
/// manager, API version and subresource.
fn set_managed_fields(obj: &mut Value, managed: &Managed) {
    let mut entries: Vec<(&ManagerId, &Entry)> = managed.iter().collect();
    entries.sort_by(|(a, ae), (b, be)| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| ae.time.as_deref().unwrap_or("").cmp(be.time.as_deref().unwrap_or("")))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| ae.api_version.cmp(&be.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let list: Vec<Value> = entries
        .into_iter()
        .map(|(id, e)| {
            let mut m = Map::new();
            m.insert("manager".into(), Value::String(id.manager.clone()));
            m.insert("operation".into(), Value::String(id.operation.as_str().into()));
            m.insert("apiVersion".into(), Value::String(e.api_version.clone()));
            if let Some(t) = &e.time {
                m.insert("time".into(), Value::String(t.clone()));
            }
            m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
            m.insert("fieldsV1".into(), e.set.to_fields_v1());
            if !id.subresource.is_empty() {
                m.insert("subresource".into(), Value::String(id.subresource.clone()));
            }
            Value::Object(m)
        })
        .collect();
    let Some(meta) = obj.as_object_mut().map(|o| o.entry("metadata").or_insert_with(|| json!({}))) else { return };
    if let Some(meta) = meta.as_object_mut() {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Keeps at most ten update entries: the oldest merge into `ancient-changes` (kube-apiserver's cap).
fn cap_update_managers(managed: &mut Managed, api_version: &str) {
    let mut updaters: Vec<(Option<String>, ManagerId)> = managed
        .iter()
        .filter(|(id, _)| id.operation == Operation::Update)
        .map(|(id, e)| (e.time.clone(), id.clone()))
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort();
    let bucket = ManagerId {
        manager: ANCIENT_CHANGES.into(),
        operation: Operation::Update,
        api_version: api_version.to_owned(),
        subresource: String::new(),
    };
    let mut count = updaters.len();
    let mut first: Option<ManagerId> = None;
    for (time, id) in updaters {
        if count <= MAX_UPDATE_MANAGERS {
            break;
        }
        let Some(f) = &first else {
            first = Some(id);
            continue;
        };
        if !managed.contains_key(&bucket) {
            if let Some(e) = managed.remove(f) {
                managed.insert(bucket.clone(), e);
            }
        }
        if let Some(e) = managed.remove(&id) {
            if let Some(b) = managed.get_mut(&bucket) {
                b.set.union_in_place(&e.set);
                b.time = time;
            }
        }
        count -= 1;
    }
}

#[cfg(test)]
mod tests;
