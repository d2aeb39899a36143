//! What the registry and the layers above it need to know of a resource to serve it: its names, its scope, its
//! versions and how its objects convert between them as JSON, and where its objects live in storage
//! (sample-apiserver's `APIGroupInfo` and a storage's `NamespaceScoped`).

use std::fmt;

use serde_json::Value;

use super::openapi::OpenApi;
use super::table::TableConvertor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// A served version as an index into [`ResourceInfo::versions`]: what layers that serve any resource carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionIndex(pub u8);

impl VersionIndex {
    pub const fn get(self) -> usize {
        self.0 as usize
    }
}

/// A resource's typed version (an enum of the versions it serves) and its index.
pub trait ServedVersion: Copy + Eq + fmt::Debug + fmt::Display + Send + Sync + 'static {
    fn to_index(self) -> VersionIndex;
    fn from_index(index: VersionIndex) -> Self;
}

/// One served version's names.
#[derive(Debug)]
pub struct VersionInfo {
    /// `v1beta1`.
    pub name: &'static str,
    /// `<group>/<version>`.
    pub api_version: &'static str,
    /// How JSON this server writes in this version begins: `{"apiVersion":"<group>/<version>"`.
    pub json_head: &'static str,
}

/// How a resource's objects change between versions as JSON, for the layers that hold no typed object.
#[derive(Debug)]
pub struct Conversion {
    /// The version of an object that names none: stored before there were several, or sent by an in-process caller.
    pub unnamed: VersionIndex,
    /// An object (or an apply's partial configuration) converted in place; what the type would not know passes.
    pub convert_value: fn(&mut Value, VersionIndex, VersionIndex),
    /// Whether an object's JSON after its `apiVersion` reads the same in every version (it holds nothing a
    /// conversion moves), so that converting it is splicing a new `apiVersion` in.
    pub version_neutral: fn(&[u8]) -> bool,
}

impl Conversion {
    /// A resource served in one version.
    pub const NONE: Conversion =
        Conversion { unnamed: VersionIndex(0), convert_value: |_, _, _| {}, version_neutral: |_| true };
}

/// A resource's names and place in storage. Each resource has one, a `static`.
#[derive(Debug)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub scope: Scope,
    /// Whether it has a `/status` subresource, which alone writes `status`.
    pub status: bool,
    /// Every served version, oldest first.
    pub versions: &'static [VersionInfo],
    pub conversion: Conversion,
    /// Its Table rows.
    pub table: TableConvertor,
    /// Its part of the OpenAPI documents.
    pub openapi: OpenApi,
    /// Where the resource's objects live in its group's storage, `/<plural>/`: `/<plural>/<namespace>/<name>`, or
    /// `/<plural>/<name>` when cluster-scoped, as kube-apiserver keys them under the group's prefix.
    pub key_root: &'static str,
}

impl ResourceInfo {
    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }

    pub fn version(&self, index: VersionIndex) -> &'static VersionInfo {
        &self.versions[index.get()]
    }

    /// The version an `apiVersion` names, if it is one of this resource's.
    pub fn version_of(&self, api_version: &str) -> Option<VersionIndex> {
        let i = self.versions.iter().position(|v| v.api_version == api_version)?;
        Some(VersionIndex(i as u8))
    }

    /// The version a JSON object names, else the one objects naming none are in.
    pub fn version_of_value(&self, value: &Value) -> VersionIndex {
        value
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(|v| self.version_of(v))
            .unwrap_or(self.conversion.unnamed)
    }

    /// `value`, an object in `from`, converted to `to` in place.
    pub fn convert_value(&self, value: &mut Value, from: VersionIndex, to: VersionIndex) {
        (self.conversion.convert_value)(value, from, to)
    }
}

/// `<plural>.<group>`, as errors and `EncryptionConfiguration` name the resource.
impl fmt::Display for ResourceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group {
            "" => f.write_str(self.plural),
            group => write!(f, "{}.{group}", self.plural),
        }
    }
}

/// A cluster-scoped kind for tests of what every resource gets: `widgets.test.podset.example`, served in `v1`.
#[cfg(test)]
pub(crate) static WIDGETS: ResourceInfo = ResourceInfo {
    group: "test.podset.example",
    kind: "Widget",
    list_kind: "WidgetList",
    plural: "widgets",
    singular: "widget",
    short_names: &[],
    categories: &[],
    scope: Scope::Cluster,
    status: true,
    versions: &[VersionInfo {
        name: "v1",
        api_version: "test.podset.example/v1",
        json_head: r#"{"apiVersion":"test.podset.example/v1""#,
    }],
    conversion: Conversion::NONE,
    table: TableConvertor::new(WIDGET_COLUMNS, widget_cells, 1),
    openapi: OpenApi {
        definitions: |_, _| serde_json::Map::new(),
        definition: |_| "io.example.podset.test.v1.Widget".into(),
    },
    key_root: "/widgets/",
};

#[cfg(test)]
const WIDGET_COLUMNS: &[super::table::TableColumnDefinition] = &[
    super::table::TableColumnDefinition {
        name: "Name",
        type_: "string",
        format: "name",
        description: "Name must be unique.",
        priority: 0,
    },
    super::table::TableColumnDefinition { name: "Age", type_: "string", format: "", description: "", priority: 0 },
    super::table::TableColumnDefinition { name: "Size", type_: "integer", format: "", description: "", priority: 0 },
];

#[cfg(test)]
fn widget_cells(obj: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let name = obj.pointer("/metadata/name").cloned().unwrap_or_default();
    let size = obj.pointer("/spec/size").cloned().unwrap_or_default();
    vec![name, super::table::age(super::table::created(obj), now).into(), size]
}
