//! What the registry's callers ask for, in plain types: how a write treats its body and who makes it, how a list
//! or watch reads, how a delete proceeds — and what they get back.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::stored::Stored;
use super::Revision;
use crate::api::resource::VersionIndex;
use crate::api::selector::{FieldSelector, Selector};
use crate::api::UserInfo;

/// `fieldValidation`: what a write does with fields the schema does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// The kinds of patch the registry applies (strategic merge patch is not among them, as for custom resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

/// Who makes a write, and how it treats its body.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The caller (for a request through the aggregator, the user the front proxy names).
    pub user: UserInfo,
    /// `dryRun=All`: everything but storing.
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// The field manager the write is recorded under (`fieldManager`, else derived from the User-Agent).
    pub field_manager: String,
    /// The client named the field manager (`fieldManager`), rather than it being derived: admission is told of
    /// a named one only.
    pub field_manager_named: bool,
    /// `force=true`: an apply takes over fields other managers own.
    pub force: bool,
    /// The version of the request (its URL's), which bodies must be in; `None` (in-process callers): the version
    /// a body names, else the resource's unnamed one.
    pub version: Option<VersionIndex>,
}

impl WriteOptions {
    /// A write by an in-process manager, such as the controller, as `user`.
    pub fn manager(field_manager: &str, user: UserInfo) -> Self {
        Self { user, field_manager: field_manager.to_owned(), ..Default::default() }
    }
}

/// The body of a `/scale` write.
pub enum ScaleChange<'a> {
    /// A whole `autoscaling/v1` Scale.
    Replace(Value),
    Patch(&'a [u8], PatchType),
}

/// An object and the warnings its request earned (unknown fields under `fieldValidation=Warn`).
pub struct Written {
    pub object: Stored,
    /// For the client's `Warning` headers: unknown fields (`fieldValidation=Warn`), admission webhooks' warnings.
    pub warnings: Vec<String>,
    /// What admission webhooks asked to be recorded in the request's audit event.
    pub audit_annotations: BTreeMap<String, String>,
    /// The write created the object (an apply can).
    pub created: bool,
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
    /// `resourceVersionMatch=Exact`: read at `resource_version`, not at the newest revision not older than it.
    pub exact: bool,
    /// Leave out objects no encryption provider reads (the server's own readers); a client's list fails instead.
    pub skip_unreadable: bool,
}

impl ListRequest {
    /// Every object a provider reads, for the server's own readers (the controller, the migration).
    pub fn readable() -> Self {
        Self { skip_unreadable: true, ..Default::default() }
    }
}

pub struct ListPage {
    pub items: Vec<Stored>,
    /// The revision the list was read at.
    pub revision: Revision,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
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

/// The outcome of a delete: the object, and whether it is gone (rather than marked for deletion).
pub struct Deleted {
    pub object: Stored,
    pub gone: bool,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
}
