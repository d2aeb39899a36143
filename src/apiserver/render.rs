//! Turning stored objects into the representation a client negotiated: JSON (bytes as stored), YAML, Table,
//! PartialObjectMetadata.

use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderValue, StatusCode};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ops::Range;

use super::error::{ApiError, ApiResult};
use super::negotiate::Output;
use super::request::IncludeObject;
use crate::api::resource::{ResourceInfo, VersionIndex};
use crate::api::table::{age, created};
use crate::registry::{ListPage, Stored};

pub const JSON: &str = "application/json";
pub const YAML: &str = "application/yaml";

pub fn bytes_response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn yaml(value: &Value) -> ApiResult<Bytes> {
    serde_yaml::to_string(value).map(Bytes::from).map_err(|e| ApiError::internal(e.to_string()))
}

pub fn value_response(status: StatusCode, out: Output, value: &Value) -> ApiResult<Response> {
    Ok(match out {
        Output::Yaml => bytes_response(status, YAML, yaml(value)?),
        _ => bytes_response(status, JSON, Bytes::from(serde_json::to_vec(value).unwrap_or_default())),
    })
}

/// One revision's Table row, serialized once and kept with the revision (as kube-apiserver's cachingObject keeps
/// an object's serializations): the cells around Age, which alone depends on the time of asking, and where
/// `metadata` sits in the stored JSON, so a row's object is spliced from the stored bytes, never re-serialized.
///
/// Kept with the stored object and used for every version: a resource's cells read the same in every version
/// ([`crate::api::table::TableConvertor`]); the metadata is the stored bytes' too in every version the object
/// converts to by splicing.
#[derive(Clone)]
struct Row {
    /// `"web",3,2,1,`
    before_age: Box<[u8]>,
    /// `,"web-a,web-b","app=web"`
    after_age: Box<[u8]>,
    created: Option<Timestamp>,
    /// Where `metadata` sits in the stored bytes.
    metadata: Option<Range<usize>>,
    /// The version the object is stored in.
    stored_in: VersionIndex,
    /// Whether every other version has it by splicing its `apiVersion` ([`Stored::converts_by_splicing`]).
    splices: bool,
}

impl Row {
    fn of(obj: &Stored) -> Result<Row, String> {
        let value = obj.to_value().map_err(|e| e.to_string())?;
        let table = &obj.resource().table;
        let cells = (table.cells)(&value, Timestamp::UNIX_EPOCH);
        let join = |cells: &[Value]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
        let at = table.age_cell.min(cells.len().saturating_sub(1));
        let (before, after) = (join(&cells[..at]), join(&cells[(at + 1).min(cells.len())..]));
        Ok(Row {
            before_age: format!("{before},").into_bytes().into(),
            after_age: if after.is_empty() { Box::default() } else { format!(",{after}").into_bytes().into() },
            created: created(&value),
            metadata: metadata_range(obj.bytes())?,
            stored_in: obj.version(),
            splices: obj.converts_by_splicing(),
        })
    }

    /// Whether the object in `version` has the stored bytes' metadata (as [`Stored::to_version`] decides).
    fn stored_metadata_in(&self, version: VersionIndex) -> bool {
        self.stored_in == version || self.splices
    }
}

/// Where `metadata` sits in an object's JSON.
fn metadata_range(bytes: &[u8]) -> Result<Option<Range<usize>>, String> {
    #[derive(serde::Deserialize)]
    struct Doc<'a> {
        #[serde(borrow)]
        metadata: Option<&'a RawValue>,
    }
    let doc: Doc<'_> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    // RawValue borrows from `bytes`: its address gives its place in them.
    Ok(doc.metadata.map(|m| {
        let start = m.get().as_ptr() as usize - bytes.as_ptr() as usize;
        start..start + m.get().len()
    }))
}

/// The row memo of a stored object, made at most once per revision.
fn row(obj: &Stored) -> ApiResult<std::borrow::Cow<'_, Row>> {
    let unreadable = |e: &String| ApiError::internal(format!("stored object {} is unreadable: {e}", obj.key()));
    match obj.memo(|| Row::of(obj)) {
        Some(Ok(row)) => Ok(std::borrow::Cow::Borrowed(row)),
        Some(Err(e)) => Err(unreadable(e)),
        None => Row::of(obj).map(std::borrow::Cow::Owned).map_err(|e| unreadable(&e)),
    }
}

/// `{"kind":"PartialObjectMetadata",...}` for a stored object in `version`, its metadata spliced from the stored
/// bytes; converted first only when conversion changes more than its `apiVersion`.
fn put_partial_metadata(buf: &mut BytesMut, obj: &Stored, row: &Row, version: VersionIndex) -> ApiResult<()> {
    buf.put_slice(br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#);
    if row.stored_metadata_in(version) {
        match &row.metadata {
            Some(r) => buf.put_slice(&obj.bytes()[r.clone()]),
            None => buf.put_slice(b"{}"),
        }
    } else {
        let converted = obj.to_version(version)?;
        let bytes = converted.bytes();
        let unreadable = |e: String| ApiError::internal(format!("stored object {} is unreadable: {e}", obj.key()));
        match metadata_range(bytes).map_err(unreadable)? {
            Some(r) => buf.put_slice(&bytes[r]),
            None => buf.put_slice(b"{}"),
        }
    }
    buf.put_u8(b'}');
    Ok(())
}

/// A row of `obj` as `version` has it: the cells and metadata from the stored object's memo, the object (for
/// `includeObject=Object`) written in the version as a JSON list writes its items.
fn put_row(
    buf: &mut BytesMut,
    obj: &Stored,
    include: IncludeObject,
    now: Timestamp,
    version: VersionIndex,
) -> ApiResult<()> {
    let row = row(obj)?;
    buf.put_slice(b"{\"cells\":[");
    buf.put_slice(&row.before_age);
    buf.put_slice(Value::String(age(row.created, now)).to_string().as_bytes());
    buf.put_slice(&row.after_age);
    buf.put_u8(b']');
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            buf.put_slice(b",\"object\":");
            put_partial_metadata(buf, obj, &row, version)?;
        }
        IncludeObject::Object => {
            buf.put_slice(b",\"object\":");
            obj.put_in_version(buf, version)?;
        }
    }
    buf.put_u8(b'}');
    Ok(())
}

/// `head` (a serialized JSON object) with `"<field>":[...]` added, each item written by `put`: lists whose items
/// are spliced from stored bytes and memos, never re-serialized.
fn splice_list(
    head: &[u8],
    field: &str,
    items: &[Stored],
    mut put: impl FnMut(&mut BytesMut, &Stored) -> ApiResult<()>,
) -> ApiResult<Bytes> {
    let size = head.len() + field.len() + items.iter().map(|o| o.bytes().len() + 1).sum::<usize>() + 8;
    let mut buf = BytesMut::with_capacity(size);
    buf.put_slice(&head[..head.len() - 1]);
    buf.put_slice(b",\"");
    buf.put_slice(field.as_bytes());
    buf.put_slice(b"\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.put_u8(b',');
        }
        put(&mut buf, item)?;
    }
    buf.put_slice(b"]}");
    Ok(buf.freeze())
}

fn head(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec())
}

/// A Table of stored `items` of `resource` in `version`, the rows spliced from their memos.
fn table(
    resource: &ResourceInfo,
    meta: ListMeta,
    items: &[Stored],
    include: IncludeObject,
    version: VersionIndex,
) -> ApiResult<Bytes> {
    let mut head = head(&json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": meta}));
    head.pop();
    head.extend_from_slice(b",\"columnDefinitions\":");
    head.extend_from_slice(resource.table.columns_json());
    head.push(b'}');
    let now = Timestamp::now();
    splice_list(&head, "rows", items, |buf, obj| put_row(buf, obj, include, now, version))
}

/// A Table of one stored object in `version`, as a watch event or a GET carries it.
pub fn single_row_table(obj: &Stored, include: IncludeObject, version: VersionIndex) -> ApiResult<Bytes> {
    let rv = Some(obj.resource_version()).filter(|rv| *rv > 0).map(|rv| rv.to_string());
    let meta = ListMeta { resource_version: rv, ..Default::default() };
    table(obj.resource(), meta, std::slice::from_ref(obj), include, version)
}

/// A watch's BOOKMARK in Table form, as kube-apiserver's table conversion renders the bookmark object: one row
/// of it, whose object is its metadata alone when it marks the end of the initial events (`initial_events_end`;
/// else as `include` says), and the table at its revision.
pub fn bookmark_table(
    resource: &'static ResourceInfo,
    bookmark: Value,
    revision: u64,
    initial_events_end: bool,
    include: IncludeObject,
) -> ApiResult<Bytes> {
    let include =
        if initial_events_end && include == IncludeObject::Object { IncludeObject::Metadata } else { include };
    let meta = ListMeta { resource_version: Some(revision.to_string()), ..Default::default() };
    let bookmark = Stored::unstored(bookmark, resource);
    // Already in the watch's version: rendered as it is.
    let version = bookmark.version();
    table(resource, meta, &[bookmark], include, version)
}

/// A stored object as PartialObjectMetadata, in `version`.
pub fn partial_metadata(obj: &Stored, version: VersionIndex) -> ApiResult<Bytes> {
    let row = row(obj)?;
    let mut buf = BytesMut::with_capacity(obj.bytes().len());
    put_partial_metadata(&mut buf, obj, &row, version)?;
    Ok(buf.freeze())
}

/// One object in `version`, as the client negotiated it.
pub fn object_response(
    status: StatusCode,
    out: Output,
    obj: &Stored,
    include: IncludeObject,
    version: VersionIndex,
) -> ApiResult<Response> {
    match out {
        Output::Json | Output::Discovery(_) => {
            Ok(bytes_response(status, JSON, obj.to_version(version)?.bytes().clone()))
        }
        Output::Yaml => Ok(bytes_response(status, YAML, yaml(&obj.to_version(version)?.to_value()?)?)),
        // From the stored object, whose row memo serves every version.
        Output::Table => Ok(bytes_response(status, JSON, single_row_table(obj, include, version)?)),
        Output::Metadata => Ok(bytes_response(status, JSON, partial_metadata(obj, version)?)),
    }
}

fn list_meta(page: &ListPage) -> ListMeta {
    ListMeta {
        resource_version: Some(page.revision.to_string()),
        continue_: page.continue_token.clone(),
        remaining_item_count: page.remaining.map(|r| r as i64),
        ..Default::default()
    }
}

/// A list of `resource` in `version`: each item as that version has it. JSON, Table and PartialObjectMetadata are
/// written from the stored items (their bytes, spliced, and their row memos, which serve every version); YAML
/// converts them.
pub fn list_response(
    resource: &ResourceInfo,
    out: Output,
    page: &ListPage,
    include: IncludeObject,
    version: VersionIndex,
) -> ApiResult<Response> {
    let meta = list_meta(page);
    let (api_version, list_kind) = (resource.version(version).api_version, resource.list_kind);
    match out {
        Output::Json | Output::Discovery(_) => {
            // Each item written in the version straight from its stored bytes.
            let head = head(&json!({"apiVersion": api_version, "kind": list_kind, "metadata": meta}));
            let body = splice_list(&head, "items", &page.items, |buf, obj| Ok(obj.put_in_version(buf, version)?))?;
            Ok(bytes_response(StatusCode::OK, JSON, body))
        }
        Output::Yaml => {
            let items = page.items.iter().map(|o| o.to_version(version)?.to_value()).collect::<Result<Vec<_>, _>>()?;
            let v = json!({"apiVersion": api_version, "kind": list_kind, "metadata": meta, "items": items});
            value_response(StatusCode::OK, out, &v)
        }
        Output::Table => {
            Ok(bytes_response(StatusCode::OK, JSON, table(resource, meta, &page.items, include, version)?))
        }
        Output::Metadata => {
            let head =
                head(&json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta}));
            let body = splice_list(&head, "items", &page.items, |buf, obj| {
                put_partial_metadata(buf, obj, &*row(obj)?, version)
            })?;
            Ok(bytes_response(StatusCode::OK, JSON, body))
        }
    }
}

/// Adds `Warning: 299 - "..."` headers, as kube-apiserver reports unknown fields.
/// A write's answer with what admission said: `Warning` headers for the client, annotations for the audit event.
pub fn with_admission(resp: Response, warnings: &[String], annotations: &BTreeMap<String, String>) -> Response {
    let mut resp = with_warnings(resp, warnings);
    if !annotations.is_empty() {
        resp.extensions_mut().insert(super::audit::Annotations(annotations.clone()));
    }
    resp
}

pub fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Version;
    use crate::resources::podset::table::{cells, AGE_CELL};
    use crate::resources::podset::INFO;

    fn unstored(v: Value) -> Stored {
        Stored::unstored(v, &INFO)
    }
    use crate::api::API_VERSION;

    fn podset() -> Stored {
        unstored(json!({
            "apiVersion": API_VERSION, "kind": "PodSet",
            "metadata": {"name": "web", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"app": "web"}, "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 2, "readyReplicas": 1, "podNames": ["web-a", "web-b"]}
        }))
    }

    fn rows(out: &Bytes) -> Vec<Value> {
        let table: Value = serde_json::from_slice(out).expect("a Table is JSON");
        assert_eq!((table["kind"].as_str(), table["apiVersion"].as_str()), (Some("Table"), Some("meta.k8s.io/v1")));
        assert_eq!(table["columnDefinitions"].as_array().map(Vec::len), Some(7));
        table["rows"].as_array().cloned().unwrap()
    }

    #[test]
    fn a_spliced_row_equals_the_row_built_as_a_tree() {
        let obj = podset();
        let value = obj.to_value().unwrap();
        let metadata = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                              "metadata": value["metadata"].clone()});
        for (include, object) in [
            (IncludeObject::None, None),
            (IncludeObject::Metadata, Some(metadata.clone())),
            (IncludeObject::Object, Some(value.clone())),
        ] {
            let now = Timestamp::now();
            let row = rows(&single_row_table(&obj, include, Version::V1alpha1.into()).unwrap()).remove(0);
            let mut want = json!({"cells": cells(&value, now)});
            if let Some(o) = object {
                want["object"] = o;
            }
            assert_eq!(row, want, "{include:?}");
        }
        let partial: Value =
            serde_json::from_slice(&partial_metadata(&obj, Version::V1alpha1.into()).unwrap()).unwrap();
        assert_eq!(partial, metadata);
    }

    #[test]
    fn a_row_is_made_once_per_revision_and_its_age_moves() {
        let obj = podset();
        let first = rows(
            &table(
                &INFO,
                ListMeta::default(),
                std::slice::from_ref(&obj),
                IncludeObject::None,
                Version::V1alpha1.into(),
            )
            .unwrap(),
        );
        assert!(obj.memo(|| -> Result<Row, String> { panic!("made twice") }).is_some());
        let age = first[0]["cells"][AGE_CELL].as_str().unwrap().to_owned();
        assert!(age.ends_with('d') || age.ends_with('y') || age.contains('d'), "{age}");
        let many = table(
            &INFO,
            ListMeta::default(),
            &[obj.clone(), obj.clone(), obj],
            IncludeObject::Metadata,
            Version::V1alpha1.into(),
        )
        .unwrap();
        assert_eq!(rows(&many).len(), 3);
    }

    #[test]
    fn a_bookmark_is_a_table_of_its_own_row_and_the_end_marker_carries_only_metadata() {
        let end = json!({"apiVersion": API_VERSION, "kind": "PodSet",
            "metadata": {"resourceVersion": "7", "annotations": {"k8s.io/initial-events-end": "true"}}});
        let table: Value =
            serde_json::from_slice(&bookmark_table(&INFO, end.clone(), 7, true, IncludeObject::Object).unwrap())
                .unwrap();
        assert_eq!(table["metadata"]["resourceVersion"], "7");
        let row = &table["rows"][0];
        assert_eq!(
            row["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": end["metadata"]})
        );
        let plain = json!({"apiVersion": API_VERSION, "kind": "PodSet", "metadata": {"resourceVersion": "8"}});
        let table: Value =
            serde_json::from_slice(&bookmark_table(&INFO, plain.clone(), 8, false, IncludeObject::Object).unwrap())
                .unwrap();
        assert_eq!(table["rows"][0]["object"], plain);
    }

    #[test]
    fn an_object_without_metadata_still_renders() {
        let obj = unstored(json!({"spec": {"replicas": 1}}));
        let row = rows(&single_row_table(&obj, IncludeObject::Metadata, Version::V1alpha1.into()).unwrap()).remove(0);
        assert_eq!(row["object"]["metadata"], json!({}));
        assert_eq!(row["cells"][0], json!(""));
    }

    /// The rendering before rows were kept for every version: the item converted first, its row made from the
    /// converted copy (whose memo is its own), and that copy's bytes.
    fn converted_first(obj: &Stored, include: IncludeObject, version: Version) -> (Bytes, Bytes) {
        let copy = obj.to_version(version).unwrap();
        (single_row_table(&copy, include, version.into()).unwrap(), partial_metadata(&copy, version.into()).unwrap())
    }

    #[test]
    fn rows_and_metadata_in_another_version_come_from_the_stored_memo_and_equal_a_converted_copys() {
        let stored = |spec: Value, annotations: Value| {
            let v = json!({"apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
                "metadata": {"name": "web", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                             "annotations": annotations, "managedFields": [{"manager": "m", "operation": "Apply"}]},
                "spec": spec, "status": {"replicas": 2, "readyReplicas": 1, "podNames": ["web-a"]}});
            let obj = unstored(v.clone());
            let mut alpha = v;
            crate::api::conversion::convert_value(&mut alpha, Version::V1beta1, Version::V1alpha1);
            [obj, unstored(alpha)]
        };
        let selector = json!({"matchLabels": {"app": "web"}});
        let cases = [
            stored(json!({"replicas": 3, "selector": selector}), json!({"x": "y"})),
            // minReadySeconds moves into an annotation in v1alpha1: metadata differs between the versions.
            stored(json!({"replicas": 3, "selector": selector, "minReadySeconds": 5}), json!({"x": "y"})),
        ];
        for obj in cases.iter().flatten() {
            for version in Version::ALL {
                for include in [IncludeObject::None, IncludeObject::Metadata, IncludeObject::Object] {
                    // Byte for byte (the Age cell, in days here, is the same within the test).
                    let ours = (
                        single_row_table(obj, include, version.into()).unwrap(),
                        partial_metadata(obj, version.into()).unwrap(),
                    );
                    assert_eq!(ours, converted_first(obj, include, version), "{version} {include:?}");
                }
            }
            assert!(obj.memo(|| -> Result<Row, String> { panic!("made again") }).is_some(), "one memo, stored");
        }
    }

    /// Tables as served, byte for byte, in every version and with every `includeObject` (objects without a
    /// creation time: the Age cell is then `<unknown>`, not the time of the run).
    #[test]
    fn tables_equal_their_snapshots() {
        let objects: Vec<Stored> = [
            json!({"apiVersion": "demo.k8s.io/v1beta1", "kind": "PodSet",
                "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "5", "labels": {"app": "web"}},
                "spec": {"replicas": 3, "minReadySeconds": 5, "selector": {"matchLabels": {"app": "web"}}},
                "status": {"replicas": 2, "readyReplicas": 1, "podNames": ["web-a", "web-b"]}}),
            json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
                "metadata": {"name": "db", "namespace": "ns", "resourceVersion": "6"},
                "spec": {"replicas": 1, "selector": {"matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["db"]}]}}}),
        ]
        .into_iter()
        .map(unstored)
        .collect();
        let meta = ListMeta { resource_version: Some("6".into()), ..ListMeta::default() };
        for version in Version::ALL {
            for include in [IncludeObject::None, IncludeObject::Metadata, IncludeObject::Object] {
                let out = table(&INFO, meta.clone(), &objects, include, version.into()).unwrap();
                crate::apiserver::golden::check(&format!("table/{version}-{include:?}.json"), &out);
            }
        }
    }
}
