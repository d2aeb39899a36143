//! On-disk layout of the sled backend, in one tree so a write group is one atomic batch:
//! `o/<key>` → object, `e/<revision BE>` → event, `m/revision`, `m/compacted`.

use std::sync::Arc;

use bytes::Bytes;

use super::{Event, EventType, Object, Result, Revision, StorageError};

pub const OBJECT_PREFIX: &[u8] = b"o/";
pub const EVENT_PREFIX: &[u8] = b"e/";
pub const META_REVISION: &[u8] = b"m/revision";
pub const META_COMPACTED: &[u8] = b"m/compacted";

pub fn object_key(key: &str) -> Vec<u8> {
    [OBJECT_PREFIX, key.as_bytes()].concat()
}

pub fn event_key(revision: Revision) -> Vec<u8> {
    [EVENT_PREFIX, &revision.to_be_bytes()].concat()
}

pub fn encode_u64(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

pub fn decode_u64(b: &[u8]) -> Result<u64> {
    let arr: [u8; 8] = b.try_into().map_err(|_| corrupt("counter is not 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(what.to_owned())
}

/// `[mod_revision u64][json]`
pub fn encode_object(obj: &Object) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + obj.bytes.len());
    out.extend_from_slice(&obj.mod_revision.to_be_bytes());
    out.extend_from_slice(&obj.bytes);
    out
}

pub fn decode_object(key: &str, raw: &[u8]) -> Result<Object> {
    if raw.len() < 8 {
        return Err(corrupt("object record too short"));
    }
    let mod_revision = decode_u64(&raw[..8])?;
    object_from_json(key, Bytes::copy_from_slice(&raw[8..]), mod_revision)
}

pub fn object_from_json(key: &str, bytes: Bytes, mod_revision: Revision) -> Result<Object> {
    let value = serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt(format!("object {key:?}: {e}")))?;
    Ok(Object { key: key.to_owned(), value: Arc::new(value), bytes, mod_revision })
}

/// `[kind u8][key len u32][key][object record len u32][object record][prev record len u32, 0 = none][prev record]`
pub fn encode_event(ev: &Event) -> Vec<u8> {
    let kind = match ev.kind {
        EventType::Added => 0u8,
        EventType::Modified => 1,
        EventType::Deleted => 2,
    };
    let obj = encode_object(&ev.object);
    let prev = ev.prev.as_deref().map(encode_object).unwrap_or_default();
    let key = ev.object.key.as_bytes();
    let mut out = Vec::with_capacity(13 + key.len() + obj.len() + prev.len());
    out.push(kind);
    for part in [key, &obj, &prev] {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

pub fn decode_event(revision: Revision, raw: &[u8]) -> Result<Event> {
    let (&kind, mut rest) = raw.split_first().ok_or_else(|| corrupt("empty event"))?;
    let mut take = || -> Result<&[u8]> {
        if rest.len() < 4 {
            return Err(corrupt("event record truncated"));
        }
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let part = rest.get(4..4 + len).ok_or_else(|| corrupt("event record truncated"))?;
        rest = &rest[4 + len..];
        Ok(part)
    };
    let key = std::str::from_utf8(take()?).map_err(|_| corrupt("event key is not UTF-8"))?.to_owned();
    let object = Arc::new(decode_object(&key, take()?)?);
    let prev_raw = take()?;
    let prev = if prev_raw.is_empty() { None } else { Some(Arc::new(decode_object(&key, prev_raw)?)) };
    let kind = match kind {
        0 => EventType::Added,
        1 => EventType::Modified,
        2 => EventType::Deleted,
        _ => return Err(corrupt("unknown event kind")),
    };
    Ok(Event { revision, kind, object, prev })
}
