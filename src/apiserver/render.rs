//! Turning stored objects into the representation a client negotiated: JSON (bytes as stored), YAML, Table,
//! PartialObjectMetadata.

use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderValue, StatusCode};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::negotiate::Output;
use super::request::IncludeObject;
use crate::api::table::{cells, Table, TableRow};
use crate::api::{API_VERSION, LIST_KIND};
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

pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

pub fn table_row(obj: &Value, include: IncludeObject, now: Timestamp) -> TableRow {
    let object = match include {
        IncludeObject::None => None,
        IncludeObject::Metadata => Some(partial_metadata(obj)),
        IncludeObject::Object => Some(obj.clone()),
    };
    TableRow { cells: cells(obj, now), object }
}

fn table_value(table: &Table) -> Value {
    serde_json::to_value(table).unwrap_or_default()
}

/// A Table of one object, as a watch event or a GET carries it.
pub fn single_row_table(obj: &Value, include: IncludeObject) -> Value {
    let rv = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
    let meta = ListMeta { resource_version: rv, ..Default::default() };
    table_value(&Table::new(meta, vec![table_row(obj, include, Timestamp::now())]))
}

pub fn object_response(status: StatusCode, out: Output, obj: &Stored, include: IncludeObject) -> ApiResult<Response> {
    match out {
        Output::Json | Output::Discovery(_) => Ok(bytes_response(status, JSON, obj.bytes().clone())),
        Output::Yaml => Ok(bytes_response(status, YAML, yaml(&obj.to_value())?)),
        Output::Table => value_response(status, out, &single_row_table(&obj.to_value(), include)),
        Output::Metadata => value_response(status, out, &partial_metadata(&obj.to_value())),
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

pub fn list_response(out: Output, page: &ListPage, include: IncludeObject) -> ApiResult<Response> {
    let meta = list_meta(page);
    match out {
        Output::Json | Output::Discovery(_) => {
            // Splice the stored bytes: each object was serialized once, when it was written.
            let head = json!({"apiVersion": API_VERSION, "kind": LIST_KIND, "metadata": meta});
            let head = serde_json::to_vec(&head).unwrap_or_default();
            let size = head.len() + page.items.iter().map(|o| o.bytes().len() + 1).sum::<usize>() + 16;
            let mut buf = BytesMut::with_capacity(size);
            buf.put_slice(&head[..head.len() - 1]);
            buf.put_slice(b",\"items\":[");
            for (i, item) in page.items.iter().enumerate() {
                if i > 0 {
                    buf.put_u8(b',');
                }
                buf.put_slice(item.bytes());
            }
            buf.put_slice(b"]}");
            Ok(bytes_response(StatusCode::OK, JSON, buf.freeze()))
        }
        Output::Yaml => {
            let items: Vec<_> = page.items.iter().map(|o| o.to_value()).collect();
            let v = json!({"apiVersion": API_VERSION, "kind": LIST_KIND, "metadata": meta, "items": items});
            value_response(StatusCode::OK, out, &v)
        }
        Output::Table => {
            let now = Timestamp::now();
            let rows = page.items.iter().map(|o| table_row(&o.to_value(), include, now)).collect();
            value_response(StatusCode::OK, out, &table_value(&Table::new(meta, rows)))
        }
        Output::Metadata => {
            let items: Vec<Value> = page.items.iter().map(|o| partial_metadata(&o.to_value())).collect();
            let v = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
            value_response(StatusCode::OK, out, &v)
        }
    }
}

/// Adds `Warning: 299 - "..."` headers, as kube-apiserver reports unknown fields.
pub fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}
