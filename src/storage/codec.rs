//! On-disk layout of the sled backend, in one tree so a write group is one atomic batch:
//! `o/<key>` → object record, `e/<revision BE>` → event record, `m/revision`, `m/compacted`, `m/probe`.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::{EventType, Object, Result, Revision, StorageError};

pub const OBJECT_PREFIX: &[u8] = b"o/";
pub const EVENT_PREFIX: &[u8] = b"e/";
pub const META_REVISION: &[u8] = b"m/revision";
pub const META_COMPACTED: &[u8] = b"m/compacted";
/// Written to prove the disk takes writes again after a failure.
pub const META_PROBE: &[u8] = b"m/probe";

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

pub fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(what.to_owned())
}

/// An object record: `[mod_revision u64][json]`.
pub fn encode_object(obj: &Object) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + obj.bytes.len());
    out.extend_from_slice(&obj.mod_revision.to_be_bytes());
    out.extend_from_slice(&obj.bytes);
    out
}

/// The revision of an object record, without decoding the rest.
pub fn record_revision(raw: &[u8]) -> Result<Revision> {
    raw.get(..8).ok_or_else(|| corrupt("object record too short")).and_then(decode_u64)
}

pub fn decode_object(key: &str, raw: &[u8]) -> Result<Object> {
    let mod_revision = record_revision(raw)?;
    Object::from_json(key, Bytes::copy_from_slice(&raw[8..]), mod_revision)
}

/// Decodes an object record, or shares the copy already decoded for the same revision: a revision names one
/// state of one key, so the history and the current objects need each state in memory once.
pub fn decode_shared(key: &str, raw: &[u8], seen: &mut HashMap<Revision, Arc<Object>>) -> Result<Arc<Object>> {
    let revision = record_revision(raw)?;
    if let Some(o) = seen.get(&revision) {
        if o.key == key {
            return Ok(o.clone());
        }
    }
    let obj = Arc::new(decode_object(key, raw)?);
    seen.insert(revision, obj.clone());
    Ok(obj)
}

/// `[kind u8][key len u32][key][object record len u32][object record][prev record len u32, 0 = none][prev record]`
pub fn encode_event(kind: EventType, key: &str, object: &[u8], prev: Option<&[u8]>) -> Vec<u8> {
    let kind = match kind {
        EventType::Added => 0u8,
        EventType::Modified => 1,
        EventType::Deleted => 2,
    };
    let prev = prev.unwrap_or_default();
    let key = key.as_bytes();
    let mut out = Vec::with_capacity(13 + key.len() + object.len() + prev.len());
    out.push(kind);
    for part in [key, object, prev] {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// The parts of an event record, not yet decoded.
pub struct RawEvent<'a> {
    pub kind: EventType,
    pub key: &'a str,
    pub object: &'a [u8],
    /// Empty when there was no previous state.
    pub prev: &'a [u8],
}

pub fn split_event(raw: &[u8]) -> Result<RawEvent<'_>> {
    let (&kind, mut rest) = raw.split_first().ok_or_else(|| corrupt("empty event"))?;
    let mut take = || -> Result<&[u8]> {
        let len = rest.get(..4).ok_or_else(|| corrupt("event record truncated"))?;
        let len = u32::from_be_bytes(len.try_into().map_err(|_| corrupt("event record truncated"))?) as usize;
        let part = rest.get(4..4 + len).ok_or_else(|| corrupt("event record truncated"))?;
        rest = &rest[4 + len..];
        Ok(part)
    };
    let key = std::str::from_utf8(take()?).map_err(|_| corrupt("event key is not UTF-8"))?;
    let object = take()?;
    let prev = take()?;
    let kind = match kind {
        0 => EventType::Added,
        1 => EventType::Modified,
        2 => EventType::Deleted,
        _ => return Err(corrupt("unknown event kind")),
    };
    Ok(RawEvent { kind, key, object, prev })
}
