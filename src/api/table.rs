//! A `meta.k8s.io/v1` Table's parts every resource shares (neither k8s-openapi nor kube-core has the type; the
//! HTTP layer writes Tables around a resource's cells).

use std::sync::OnceLock;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

/// How a resource's objects read as Table rows (kube's `rest.TableConvertor`): its printer columns, and each
/// object's cells read from its JSON. The cells must read the same in every version (the HTTP layer keeps one row
/// per stored revision for all), and only the Age cell may change with the time of asking.
#[derive(Debug)]
pub struct TableConvertor {
    pub columns: &'static [TableColumnDefinition],
    pub cells: fn(&Value, Timestamp) -> Vec<Value>,
    /// Which cell is the Age.
    pub age_cell: usize,
    /// The column definitions as JSON, the same in every Table: serialized once.
    columns_json: OnceLock<Vec<u8>>,
}

impl TableConvertor {
    pub const fn new(
        columns: &'static [TableColumnDefinition],
        cells: fn(&Value, Timestamp) -> Vec<Value>,
        age_cell: usize,
    ) -> Self {
        Self { columns, cells, age_cell, columns_json: OnceLock::new() }
    }

    pub fn columns_json(&self) -> &[u8] {
        self.columns_json.get_or_init(|| serde_json::to_vec(self.columns).unwrap_or_else(|_| b"[]".to_vec()))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TableColumnDefinition {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
}

/// When the object was created, which its Age counts from.
pub fn created(obj: &Value) -> Option<Timestamp> {
    obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(|t| t.parse().ok())
}

/// The Age cell: time since `created`, as kubectl shows it.
pub fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    created.map(|t| human_duration(now.as_second() - t.as_second())).unwrap_or_else(|| "<unknown>".into())
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
}
