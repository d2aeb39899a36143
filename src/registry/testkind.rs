//! A cluster-scoped kind with a status, for the registry's own tests: what the registry does for any resource,
//! checked on one that is not PodSet.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::strategy::Strategy;
use crate::api::resource::ResourceInfo;
pub(crate) use crate::api::resource::WIDGETS;
use crate::api::validation::FieldError;

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
    type Version = &'static str;

    const INFO: &'static ResourceInfo = &WIDGETS;
    const STORAGE_VERSION: &'static str = "v1";

    fn meta(o: &Widget) -> &ObjectMeta {
        &o.metadata
    }

    fn meta_mut(o: &mut Widget) -> &mut ObjectMeta {
        &mut o.metadata
    }

    fn type_fields(o: &mut Widget) -> (&mut String, &mut String) {
        (&mut o.api_version, &mut o.kind)
    }

    fn prepare_for_create(o: &mut Widget) {
        o.status = None;
    }

    fn default(o: &mut Widget, _version: &'static str) {
        if o.spec.get("size").is_none() {
            o.spec = serde_json::json!({"size": 1});
        }
    }

    fn validate(o: &Widget, _version: &'static str) -> Vec<FieldError> {
        match o.spec["size"].as_i64() {
            Some(n) if n >= 0 => Vec::new(),
            Some(n) => vec![FieldError::invalid("spec.size", n, "must be greater than or equal to 0")],
            None => vec![FieldError::required("spec.size", "a number")],
        }
    }

    fn prepare_for_update(new: &mut Widget, old: &Widget) {
        new.status = old.status.clone();
    }

    fn validate_update(new: &Widget, _old: &Widget, version: &'static str) -> Vec<FieldError> {
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

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::registry::{ListRequest, ObjectKey, Registry, WatchRequest};
    use crate::storage::Draft;

    /// One store, two resources: each registry reads and watches its own keys only, a cluster-scoped one by name.
    #[tokio::test]
    async fn a_registry_reads_and_watches_its_own_resource_only() {
        let dir = tempfile::tempdir().unwrap();
        let podsets: Registry = Registry::on_sled(dir.path()).await;
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
}
