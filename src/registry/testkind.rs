//! A cluster-scoped kind with a status, for the registry's own tests: what the registry does for any resource,
//! checked on one that is not PodSet.

use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::fieldmanager::{FieldManager, ResetFields};
use super::strategy::Strategy;
pub(crate) use crate::api::resource::WIDGETS;
use crate::api::resource::{ResourceInfo, ServedVersion, VersionIndex};
use crate::api::validation::FieldError;

/// The one version widgets are served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct V1;

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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Widget {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

pub(crate) struct WidgetStrategy;

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

    /// A schema of its own, with the object metadata every kind shares.
    fn field_manager(_version: V1) -> &'static FieldManager {
        static FM: OnceLock<FieldManager> = OnceLock::new();
        FM.get_or_init(|| {
            let object = |properties: Value| json!({"type": "object", "properties": properties});
            let strings = json!({"type": "object", "additionalProperties": {"type": "string"}});
            let meta = object(json!({
                "name": {"type": "string"}, "labels": strings, "annotations": strings,
                "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            }));
            let widget = object(json!({
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": meta,
                "spec": object(json!({"size": {"type": "integer"}})),
                "status": object(json!({"seen": {"type": "integer"}})),
            }));
            let schemas = serde_json::Map::from_iter([("io.example.podset.test.v1.Widget".to_owned(), widget)]);
            static RESET: ResetFields =
                ResetFields { main: &[&["status"]], status: &[&["metadata"], &["spec"]], scale: &[] };
            let skeleton = json!({"metadata": {}, "spec": {}, "status": {}});
            FieldManager::new(
                &schemas,
                "io.example.podset.test.v1.Widget",
                WIDGETS.versions[0].api_version,
                skeleton,
                &RESET,
            )
        })
    }

    fn scale() -> Option<&'static dyn crate::registry::ScaleAccessor<Widget>> {
        Some(&Size)
    }

    fn prepare_for_create(o: &mut Widget) {
        o.status = None;
    }

    fn default(o: &mut Widget, _version: V1) {
        if o.spec.get("size").is_none() {
            o.spec = serde_json::json!({"size": 1});
        }
    }

    fn validate(o: &Widget, _version: V1) -> Vec<FieldError> {
        match o.spec["size"].as_i64() {
            Some(n) if n >= 0 => Vec::new(),
            Some(n) => vec![FieldError::invalid("spec.size", n, "must be greater than or equal to 0")],
            None => vec![FieldError::required("spec.size", "a number")],
        }
    }

    fn prepare_for_update(new: &mut Widget, old: &Widget) {
        new.status = old.status.clone();
    }

    fn validate_update(new: &Widget, _old: &Widget, version: V1) -> Vec<FieldError> {
        Self::validate(new, version)
    }

    fn prepare_for_status_update(new: &mut Widget, old: &Widget) {
        let status = new.status.take();
        *new = Widget { status, ..old.clone() };
    }

    fn validate_status_update(_new: &Widget, _old: &Widget) -> Vec<FieldError> {
        Vec::new()
    }

    fn spec_changed(new: &Widget, old: &Widget) -> bool {
        new.spec != old.spec
    }
}

/// `/scale` of a widget is its `spec.size`.
struct Size;

impl crate::registry::ScaleAccessor<Widget> for Size {
    fn spec_replicas(&self, o: &Widget) -> Option<i32> {
        o.spec["size"].as_i64().map(|n| n as i32)
    }

    fn set_spec_replicas(&self, o: &mut Widget, replicas: i32) {
        o.spec["size"] = replicas.into();
    }

    fn status_replicas(&self, o: &Widget) -> i32 {
        o.status.as_ref().and_then(|s| s["seen"].as_i64()).unwrap_or(0) as i32
    }

    fn selector(&self, _o: &Widget) -> Option<String> {
        Some("color=blue".into())
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use serde_json::json;

    use super::*;

    use crate::registry::{ListRequest, ObjectKey, Registry, WatchRequest};
    use crate::resources::podset::PodSets;
    use crate::storage::Draft;

    /// One store, two resources: each registry reads and watches its own keys only, a cluster-scoped one by name.
    #[tokio::test]
    async fn a_registry_reads_and_watches_its_own_resource_only() {
        let dir = tempfile::tempdir().unwrap();
        let podsets = PodSets::on_sled(dir.path()).await;
        let widgets: Registry<WidgetStrategy> = Registry::new(podsets.store.clone());
        let put = |key: &'static str, v: Value| {
            let store = podsets.store.clone();
            async move { store.create(key, Draft::new(&v, &[]).unwrap()).await.unwrap() }
        };
        let mut watch = widgets.watch(WatchRequest { resource_version: Some(0), ..Default::default() }).await.unwrap();
        put("/widgets/blue", serde_json::json!({"kind": "Widget", "metadata": {"name": "blue"}})).await;
        put("/podsets/ns/web", serde_json::json!({"kind": "PodSet", "metadata": {"name": "web", "namespace": "ns"}}))
            .await;
        put("/widgets/green", serde_json::json!({"kind": "Widget", "metadata": {"name": "green"}})).await;

        let names =
            |page: crate::registry::ListPage| page.items.iter().map(|o| o.key().to_string()).collect::<Vec<_>>();
        assert_eq!(names(widgets.list(ListRequest::default()).await.unwrap()), ["blue", "green"]);
        assert_eq!(names(podsets.list(ListRequest::default()).await.unwrap()), ["ns/web"]);
        assert_eq!(widgets.get(&ObjectKey::new("", "green"), None).await.unwrap().name(), "green");
        let e = widgets.get(&ObjectKey::new("", "web"), None).await.unwrap_err();
        assert_eq!(e.to_string(), "widgets.test.podset.example \"web\" not found");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            if let crate::registry::Notification::Event(ev) = watch.events.next().await.unwrap().unwrap() {
                seen.push(ev.object.name().to_owned());
            }
        }
        assert_eq!(seen, ["blue", "green"], "the PodSet in between is not a widget's event");
    }

    fn opts(manager: &str) -> crate::registry::WriteOptions {
        crate::registry::WriteOptions::manager(manager, crate::api::UserInfo::named("alice", vec![]))
    }

    /// Every write the registry makes, on a cluster-scoped kind: create (a namespace in the body is dropped),
    /// update and `/status` each keeping the other's part, generation, patches, server-side apply with its
    /// conflicts, dry run, delete with finalizers, restore, and the errors that name the resource.
    #[tokio::test]
    async fn a_cluster_scoped_kind_goes_through_every_write() {
        use crate::registry::{DeleteOptions, Error, PatchType, Subresource};
        let dir = tempfile::tempdir().unwrap();
        let podsets = PodSets::on_sled(dir.path()).await;
        let widgets: Registry<WidgetStrategy> = Registry::new(podsets.store.clone());
        let key = ObjectKey::new("", "blue");
        let body = serde_json::json!({"apiVersion": "test.podset.example/v1", "kind": "Widget",
            "metadata": {"name": "blue", "namespace": "stray"}, "spec": {"size": 2}, "status": {"seen": 5}});
        let made = widgets.create("", body.clone(), &opts("kubectl")).await.unwrap();
        assert!(made.created);
        let w = made.object.decode::<WidgetStrategy>().unwrap();
        assert_eq!((w.metadata.namespace, w.status, w.metadata.generation), (None, None, Some(1)));
        assert_eq!(made.object.object().key, "/widgets/blue");
        let e = widgets.create("", body.clone(), &opts("kubectl")).await.err().unwrap();
        assert_eq!(e.to_string(), "widgets.test.podset.example \"blue\" already exists");
        let bad = serde_json::json!({"metadata": {"name": "x"}, "spec": {"size": -1}});
        assert!(matches!(widgets.create("", bad, &opts("k")).await, Err(Error::Invalid { .. })));

        // The main resource keeps status, `/status` keeps spec; generation follows spec.
        let status = serde_json::json!({"metadata": {"name": "blue"}, "spec": {"size": 9}, "status": {"seen": 1}});
        let s = widgets.replace(&key, status, Subresource::Status, &opts("ctl")).await.unwrap();
        let w = s.object.decode::<WidgetStrategy>().unwrap();
        assert_eq!(
            (w.spec["size"].as_i64(), w.status, w.metadata.generation),
            (Some(2), Some(json!({"seen": 1})), Some(1))
        );
        let patch = br#"{"spec":{"size":3},"status":{"seen":7}}"#;
        let p = widgets.patch(&key, patch, PatchType::Merge, Subresource::Main, &opts("kubectl")).await.unwrap();
        let w = p.object.decode::<WidgetStrategy>().unwrap();
        assert_eq!(
            (w.spec["size"].as_i64(), w.status, w.metadata.generation),
            (Some(3), Some(json!({"seen": 1})), Some(2))
        );

        // Server-side apply: a second manager's conflicting value is refused, then forced.
        let apply = |size: i64| {
            format!(
                "apiVersion: test.podset.example/v1\nkind: Widget\nmetadata: {{name: blue}}\nspec: {{size: {size}}}\n"
            )
        };
        widgets.patch(&key, apply(3).as_bytes(), PatchType::Apply, Subresource::Main, &opts("a")).await.unwrap();
        let e = widgets.patch(&key, apply(4).as_bytes(), PatchType::Apply, Subresource::Main, &opts("b")).await;
        assert!(matches!(&e, Err(Error::FieldManager(_))), "{:?}", e.err());
        assert!(e.err().unwrap().to_string().contains(".spec.size"), "a conflict on the field");
        let force = crate::registry::WriteOptions { force: true, ..opts("b") };
        let forced =
            widgets.patch(&key, apply(4).as_bytes(), PatchType::Apply, Subresource::Main, &force).await.unwrap();
        let w = forced.object.decode::<WidgetStrategy>().unwrap();
        let managers: Vec<_> = w.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
        assert_eq!(w.spec["size"].as_i64(), Some(4));
        assert!(managers.contains(&"b".to_owned()) && managers.contains(&"ctl".to_owned()), "{managers:?}");

        // `/scale` reads and writes the size, nothing else.
        let scale = widgets.get_scale(&key, None).await.unwrap();
        assert_eq!(
            (scale.spec.unwrap().replicas, scale.status.unwrap().selector.as_deref()),
            (Some(4), Some("color=blue"))
        );
        let patch = crate::registry::ScaleChange::Patch(br#"{"spec":{"replicas":6}}"#, PatchType::Merge);
        let scale = widgets.update_scale(&key, patch, &opts("hpa")).await.unwrap();
        assert_eq!((scale.spec.unwrap().replicas, scale.status.unwrap().replicas), (Some(6), 1));
        let w = widgets.get(&key, None).await.unwrap().decode::<WidgetStrategy>().unwrap();
        assert_eq!((w.spec, w.metadata.generation), (json!({"size": 6}), Some(4)));

        // A dry run stores nothing; finalizers hold a delete; the last one going deletes.
        let dry = crate::registry::WriteOptions { dry_run: true, ..opts("kubectl") };
        assert!(widgets.delete(&key, &DeleteOptions::default(), &dry).await.unwrap().gone);
        let hold = br#"{"metadata":{"finalizers":["example.com/hold"]}}"#;
        widgets.patch(&key, hold, PatchType::Merge, Subresource::Main, &opts("kubectl")).await.unwrap();
        let d = widgets.delete(&key, &DeleteOptions::default(), &opts("kubectl")).await.unwrap();
        assert!(!d.gone && d.object.decode::<WidgetStrategy>().unwrap().metadata.deletion_timestamp.is_some());
        let clear = br#"{"metadata":{"finalizers":null}}"#;
        widgets.patch(&key, clear, PatchType::Merge, Subresource::Main, &opts("kubectl")).await.unwrap();
        let e = widgets.get(&key, None).await.unwrap_err();
        assert_eq!(e.to_string(), "widgets.test.podset.example \"blue\" not found");
        assert!(podsets.is_empty().await.unwrap(), "no PodSet came of it");

        // A restore takes a widget by name alone, and refuses one with a namespace.
        let backup = |ns: Option<&str>| {
            serde_json::json!({"apiVersion": "test.podset.example/v1", "kind": "Widget",
            "metadata": {"name": "green", "namespace": ns, "uid": "u1"}, "spec": {"size": 1}})
        };
        let e = widgets.restore(backup(Some("ns"))).await.unwrap_err();
        assert!(
            e.to_string().contains("a Widget in a backup must have metadata.name and no metadata.namespace"),
            "{e}"
        );
        let restored = widgets.restore(backup(None)).await.unwrap();
        assert_eq!((restored.object().key.as_str(), restored.uid()), ("/widgets/green", Some("u1")));
    }
}
