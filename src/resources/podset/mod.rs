//! `PodSet` (`podsets.demo.k8s.io`): types, versions and conversion, defaulting, validation, OpenAPI schema and
//! printer columns.

pub mod conversion;
pub mod defaults;
pub(crate) mod metrics;
pub mod schema;
mod strategy;
pub mod table;
mod types;
pub mod validation;
mod version;

use crate::api::openapi::OpenApi;
use crate::api::resource::{Conversion, ResourceInfo, Scope};
use crate::api::table::TableConvertor;
use crate::registry::ObjectKey;

pub use strategy::{PodSetStrategy, RESET_FIELDS};
pub use types::{PodSet, PodSetList, PodSetSpec, PodSetStatus};
pub use version::Version;

/// Which PodSet.
pub type PodSetKey = ObjectKey;

/// PodSets' registry.
pub type PodSets = crate::registry::Registry<PodSetStrategy>;

/// A write to a PodSet or its `status` or `scale` in `v1alpha1`, as this server describes it to admission: for
/// callers that drive an admission chain themselves (tests comparing it with kube-apiserver's).
pub fn admission_attributes(
    operation: crate::api::Operation,
    subresource: crate::api::Subresource,
    namespace: &str,
    name: &str,
    user: crate::api::UserInfo,
    options: crate::admission::RequestOptions,
) -> crate::admission::Attributes {
    let v = Version::V1alpha1;
    crate::registry::admission_attributes::<PodSetStrategy>(v, operation, subresource, namespace, name, user, options)
}

pub const GROUP: &str = "demo.k8s.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "demo.k8s.io/v1alpha1";
pub const KIND: &str = "PodSet";
pub const LIST_KIND: &str = "PodSetList";
pub const PLURAL: &str = "podsets";
pub const SINGULAR: &str = "podset";
pub const SHORT_NAMES: &[&str] = &["ps"];
pub const CATEGORIES: &[&str] = &["all"];
/// `podsets.demo.k8s.io`, the name errors use.
pub const GROUP_RESOURCE: &str = "podsets.demo.k8s.io";
/// The label the defaulted template and selector use.
pub const DEFAULT_LABEL: &str = "demo.k8s.io/podset";

/// PodSet's names and place in storage: `/podsets/<namespace>/<name>` under the group's prefix.
pub static INFO: ResourceInfo = ResourceInfo {
    group: GROUP,
    kind: KIND,
    list_kind: LIST_KIND,
    plural: PLURAL,
    singular: SINGULAR,
    short_names: SHORT_NAMES,
    categories: CATEGORIES,
    scope: Scope::Namespaced,
    status: true,
    versions: &Version::INFOS,
    conversion: Conversion {
        unnamed: crate::api::resource::VersionIndex(Version::V1alpha1 as u8),
        convert_value: conversion::convert_value_at,
        version_neutral: conversion::version_neutral,
    },
    // Conversion moves only `minReadySeconds`, no cell: rows read the same in every version.
    table: TableConvertor::new(table::COLUMNS, table::cells, table::AGE_CELL),
    openapi: OpenApi { definitions: schema::definitions_at, definition: schema::definition_at },
    key_root: "/podsets/",
};
