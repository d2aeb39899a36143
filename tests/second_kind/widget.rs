//! A cluster-scoped kind with `/status` and `/scale`, served beside PodSets by this test's own server: all a
//! resource has to give the framework — its types, names, versions, printer columns, schema and strategy.

use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use podset_apiserver::api::openapi::{definitions_of, Flavor, OpenApi};
use podset_apiserver::api::resource::{Conversion, ResourceInfo, Scope, ServedVersion, VersionIndex, VersionInfo};
use podset_apiserver::api::table::{age, created, TableColumnDefinition, TableConvertor};
use podset_apiserver::api::validation::{validate_object_meta, FieldError};
use podset_apiserver::registry::fieldmanager::{FieldManager, ResetFields};
use podset_apiserver::registry::{ScaleAccessor, Strategy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub const GROUP: &str = "test.podset.example";
pub const API_VERSION: &str = "test.podset.example/v1";
const DEFINITION: &str = "io.example.podset.test.v1.Widget";
const COLORS: &[&str] = &["blue", "green", "red"];

/// A Widget is a thing of some size and color, the same in every namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(
    rename = "io.example.podset.test.v1.Widget",
    extend("x-kubernetes-group-version-kind" = [{"group": "test.podset.example", "version": "v1", "kind": "Widget"}])
)]
pub struct Widget {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the widget should be.
    #[serde(default)]
    pub spec: WidgetSpec,
    /// What was last seen of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WidgetStatus>,
}

/// WidgetSpec is the desired state of a Widget.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.example.podset.test.v1.WidgetSpec")]
pub struct WidgetSpec {
    /// Size of the widget, in parts. Must be 0 or more.
    #[serde(default)]
    pub size: i32,
    /// Color of the widget: blue, green or red. Defaults to blue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

/// WidgetStatus is the observed state of a Widget.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.example.podset.test.v1.WidgetStatus")]
pub struct WidgetStatus {
    /// Seen is the size last observed.
    #[serde(default)]
    pub seen: i32,
}

/// WidgetList is a list of Widgets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(
    rename = "io.example.podset.test.v1.WidgetList",
    extend("x-kubernetes-group-version-kind" = [{"group": "test.podset.example", "version": "v1", "kind": "WidgetList"}])
)]
pub struct WidgetList {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Standard list metadata.
    #[serde(default)]
    pub metadata: ListMeta,
    /// Items is the list of Widgets.
    pub items: Vec<Widget>,
}

/// The one version widgets are served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V1;

impl std::fmt::Display for V1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("v1")
    }
}

impl ServedVersion for V1 {
    fn to_index(self) -> VersionIndex {
        VersionIndex(0)
    }

    fn from_index(_: VersionIndex) -> Self {
        V1
    }
}

const fn col(
    name: &'static str,
    type_: &'static str,
    format: &'static str,
    description: &'static str,
) -> TableColumnDefinition {
    TableColumnDefinition { name, type_, format, description, priority: 0 }
}

const COLUMNS: &[TableColumnDefinition] = &[
    col("Name", "string", "name", "Name must be unique."),
    col("Size", "integer", "", "Size of the widget (spec.size)."),
    col("Color", "string", "", "Color of the widget (spec.color)."),
    col("Age", "string", "", "Time since the widget was created."),
];

fn cells(obj: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let at = |p: &str| obj.pointer(p).cloned().unwrap_or(Value::Null);
    vec![at("/metadata/name"), at("/spec/size"), at("/spec/color"), json!(age(created(obj), now))]
}

fn definitions(_: VersionIndex, flavor: Flavor) -> Map<String, Value> {
    definitions_of::<Widget, WidgetList>(flavor, GROUP, "v1", &[])
}

pub static WIDGETS: ResourceInfo = ResourceInfo {
    group: GROUP,
    kind: "Widget",
    list_kind: "WidgetList",
    plural: "widgets",
    singular: "widget",
    short_names: &["wd"],
    categories: &[],
    scope: Scope::Cluster,
    status: true,
    versions: &[VersionInfo {
        name: "v1",
        api_version: API_VERSION,
        json_head: r#"{"apiVersion":"test.podset.example/v1""#,
    }],
    conversion: Conversion::NONE,
    table: TableConvertor::new(COLUMNS, cells, 3),
    openapi: OpenApi { definitions, definition: |_| DEFINITION.into() },
    key_root: "/widgets/",
};

/// `/scale` is the widget's size; its status has no selector.
struct Size;

impl ScaleAccessor<Widget> for Size {
    fn spec_replicas(&self, o: &Widget) -> Option<i32> {
        Some(o.spec.size)
    }

    fn set_spec_replicas(&self, o: &mut Widget, replicas: i32) {
        o.spec.size = replicas;
    }

    fn status_replicas(&self, o: &Widget) -> i32 {
        o.status.as_ref().map_or(0, |s| s.seen)
    }

    fn selector(&self, _: &Widget) -> Option<String> {
        None
    }
}

pub struct WidgetStrategy;

impl Strategy for WidgetStrategy {
    type Object = Widget;
    type Version = V1;

    const INFO: &'static ResourceInfo = &WIDGETS;
    const STORAGE_VERSION: V1 = V1;

    fn meta(o: &Widget) -> &ObjectMeta {
        &o.metadata
    }

    fn meta_mut(o: &mut Widget) -> &mut ObjectMeta {
        &mut o.metadata
    }

    fn type_fields(o: &mut Widget) -> (&mut String, &mut String) {
        (&mut o.api_version, &mut o.kind)
    }

    fn field_manager(_: V1) -> &'static FieldManager {
        static FM: OnceLock<FieldManager> = OnceLock::new();
        static RESET: ResetFields = ResetFields {
            main: &[&["status"]],
            status: &[&["metadata"], &["spec"]],
            scale: &[&["metadata"], &["status"], &["spec", "color"]],
        };
        FM.get_or_init(|| {
            let skeleton = json!({"metadata": {}, "spec": {}, "status": {}});
            FieldManager::new(&definitions(VersionIndex(0), Flavor::V3), DEFINITION, API_VERSION, skeleton, &RESET)
        })
    }

    fn scale() -> Option<&'static dyn ScaleAccessor<Widget>> {
        Some(&Size)
    }

    fn prepare_for_create(o: &mut Widget) {
        o.status = None;
    }

    fn default(o: &mut Widget, _: V1) {
        o.spec.color.get_or_insert_with(|| "blue".into());
    }

    fn validate(o: &Widget, _: V1) -> Vec<FieldError> {
        let mut errors = validate_object_meta(&o.metadata);
        if o.spec.size < 0 {
            errors.push(FieldError::invalid("spec.size", o.spec.size, "must be greater than or equal to 0"));
        }
        if let Some(c) = o.spec.color.as_deref().filter(|c| !COLORS.contains(c)) {
            errors.push(FieldError::not_supported("spec.color", c, COLORS));
        }
        errors
    }

    fn prepare_for_update(new: &mut Widget, old: &Widget) {
        new.status = old.status.clone();
    }

    fn validate_update(new: &Widget, _: &Widget, v: V1) -> Vec<FieldError> {
        Self::validate(new, v)
    }

    fn prepare_for_status_update(new: &mut Widget, old: &Widget) {
        let status = new.status.take();
        *new = Widget { status, ..old.clone() };
    }

    fn validate_status_update(new: &Widget, _: &Widget) -> Vec<FieldError> {
        match new.status.as_ref().map(|s| s.seen) {
            Some(n) if n < 0 => vec![FieldError::invalid("status.seen", n, "must be greater than or equal to 0")],
            _ => Vec::new(),
        }
    }

    fn spec_changed(new: &Widget, old: &Widget) -> bool {
        new.spec != old.spec
    }
}
