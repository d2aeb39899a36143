//! PodSet's printer columns.

use jiff::Timestamp;
use serde_json::{json, Value};

use crate::api::selector::Selector;
use crate::api::table::{age, created, TableColumnDefinition};

const fn col(
    name: &'static str,
    type_: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
) -> TableColumnDefinition {
    TableColumnDefinition { name, type_, format, description, priority }
}

/// Name, Desired, Current, Ready, Age; `-o wide` adds Pods and Selector.
pub const COLUMNS: &[TableColumnDefinition] = &[
    col("Name", "string", "name", "Name must be unique within a namespace.", 0),
    col("Desired", "integer", "", "Number of desired pods (spec.replicas).", 0),
    col("Current", "integer", "", "Number of pods the controller counts (status.replicas).", 0),
    col("Ready", "integer", "", "Number of ready pods (status.readyReplicas).", 0),
    col("Age", "string", "", "Time since the PodSet was created.", 0),
    col("Pods", "string", "", "Names of the pods (status.podNames).", 1),
    col("Selector", "string", "", "Label selector of the pods (spec.selector).", 1),
];

/// Index of the Age cell, the only one that changes with the time of asking.
pub const AGE_CELL: usize = 4;

/// The cells of one PodSet, read from its JSON.
pub fn cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let int = |ptr: &str| obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(0);
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let age = age(created(obj), now);
    let pods = obj
        .pointer("/status/podNames")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))
        .unwrap_or_else(|| "<none>".into());
    let selector = obj
        .pointer("/spec/selector")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .and_then(|ls| Selector::from_label_selector(&ls).ok())
        .map(|s| s.to_string())
        .unwrap_or_else(|| "<none>".into());
    vec![
        name,
        json!(int("/spec/replicas")),
        json!(int("/status/replicas")),
        json!(int("/status/readyReplicas")),
        json!(age),
        json!(pods),
        json!(selector),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_of_a_podset() {
        let obj = json!({
            "metadata": {"name": "web", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 2, "readyReplicas": 1, "podNames": ["web-a", "web-b"]}
        });
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        assert_eq!(
            cells(&obj, now),
            vec![json!("web"), json!(3), json!(2), json!(1), json!("60s"), json!("web-a,web-b"), json!("app=web")]
        );
    }
}
