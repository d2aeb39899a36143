//! PodSet semantics between the HTTP layer and storage.

pub mod fieldmanager;

use std::sync::OnceLock;

use serde_json::json;

use self::fieldmanager::FieldManager;
use crate::api::schema::{component_schemas, PODSET};
use crate::api::API_VERSION;

/// Field management for PodSets, merged by the schema the server publishes.
pub fn podset_field_manager() -> &'static FieldManager {
    static FM: OnceLock<FieldManager> = OnceLock::new();
    FM.get_or_init(|| {
        // The parts of a PodSet that, like a Deployment's non-pointer structs, always exist: writes compared
        // against them never own them as nodes of their own.
        let skeleton = json!({"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": null}}},
                              "status": {}});
        FieldManager::new(&component_schemas(), PODSET, API_VERSION, skeleton)
    })
}
