//! The PodSet printer columns of a `meta.k8s.io/v1` Table (neither k8s-openapi nor kube-core has the type; the
//! HTTP layer writes Tables around these cells).

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{json, Value};

use super::selector::Selector;

#[derive(Debug, Clone, Serialize)]
pub struct TableColumnDefinition {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
}

/// Name, Desired, Current, Ready, Age; `-o wide` adds Pods and Selector.
pub fn columns() -> Vec<TableColumnDefinition> {
    let col = |name, type_, format, description, priority| TableColumnDefinition {
        name,
        type_,
        format,
        description,
        priority,
    };
    vec![
        col("Name", "string", "name", "Name must be unique within a namespace.", 0),
        col("Desired", "integer", "", "Number of desired pods (spec.replicas).", 0),
        col("Current", "integer", "", "Number of pods the controller counts (status.replicas).", 0),
        col("Ready", "integer", "", "Number of ready pods (status.readyReplicas).", 0),
        col("Age", "string", "", "Time since the PodSet was created.", 0),
        col("Pods", "string", "", "Names of the pods (status.podNames).", 1),
        col("Selector", "string", "", "Label selector of the pods (spec.selector).", 1),
    ]
}

/// Index of the Age cell, the only one that changes with the time of asking.
pub const AGE_CELL: usize = 4;

/// When the object was created, which its Age counts from.
pub fn created(obj: &Value) -> Option<Timestamp> {
    obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(|t| t.parse().ok())
}

/// The Age cell: time since `created`, as kubectl shows it.
pub fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    created.map(|t| human_duration(now.as_second() - t.as_second())).unwrap_or_else(|| "<unknown>".into())
}

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

/// A duration in seconds as kubectl shows ages (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{dy}d", hours / 24 / 365) };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 5 + 60 * 7), "5h7m");
        assert_eq!(human_duration(3600 * 24 * 3), "3d");
        assert_eq!(human_duration(-5), "<invalid>");
    }

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
