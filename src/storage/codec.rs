//! On-disk layout of the sled backend, in one tree so a write group is one atomic batch:
//! `o/<key>` → object record, `e/<revision BE><kind><key>` → previous object record, `m/revision`, `m/compacted`,
//! `m/format`, `m/probe`.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use sled::IVec;

use super::value::{Read, Transformer};
use super::{Draft, EventType, Object, Result, Revision, StorageError};

pub const OBJECT_PREFIX: &[u8] = b"o/";
pub const EVENT_PREFIX: &[u8] = b"e/";
/// The first key after the event log.
pub const EVENT_END: &[u8] = b"e0";
pub const META_REVISION: &[u8] = b"m/revision";
pub const META_COMPACTED: &[u8] = b"m/compacted";
/// The layout's version; a store without it has format 1, whose events held their object and previous state.
pub const META_FORMAT: &[u8] = b"m/format";
pub const FORMAT: u64 = 2;
/// Written to prove the disk takes writes again after a failure.
pub const META_PROBE: &[u8] = b"m/probe";

pub fn object_key(key: &str) -> Vec<u8> {
    [OBJECT_PREFIX, key.as_bytes()].concat()
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

/// The draft stamped with `revision`, and its object record `[mod_revision u64][value]`. In a plain store the value
/// is the object's JSON, and the object's bytes are the record's, not a copy: sled keeps the value it is given in
/// its page cache, and the cache above keeps the object, so the two share it. Otherwise the value is the JSON as
/// the encryption's writing provider transforms it, bound to the object's key.
pub fn stamp(key: &str, draft: Draft, revision: Revision, values: &Transformer) -> Result<(Object, IVec)> {
    let header = revision.to_be_bytes();
    if values.is_plain() {
        let (record, meta) = draft.stamp(revision, &header);
        let record = IVec::from(record);
        let json = Bytes::from_owner(record.clone()).slice(8..);
        return Ok((Object::from_parts(key, meta, json, revision), record));
    }
    let (json, meta) = draft.stamp(revision, &[]);
    let (value, provider) = values.seal(key, &json, key.as_bytes())?;
    let record = IVec::from([&header[..], &value].concat());
    Ok((Object::from_parts(key, meta, Bytes::from(json), revision).stored_with(provider), record))
}

/// The revision of an object record, without decoding the rest.
pub fn record_revision(record: &[u8]) -> Result<Revision> {
    record.get(..8).ok_or_else(|| corrupt("object record too short")).and_then(decode_u64)
}

/// Decodes an object record. In a plain store its bytes are shared, not copied: after a restart, sled's page cache
/// holds every value the load read (it evicts lazily), and the cache above holds the same objects. A value no
/// provider reads becomes an unreadable object, so the load goes on and reads of that one key fail.
pub fn decode_object(key: &str, record: &IVec, values: &Transformer) -> Result<Object> {
    let mod_revision = record_revision(record)?;
    match values.read(key, &record[8..], key.as_bytes()) {
        Ok(Read::AsStored(_)) => Object::from_json(key, Bytes::from_owner(record.clone()).slice(8..), mod_revision),
        Ok(Read::Plain(p)) => Ok(Object::from_json(key, Bytes::from(p.bytes), mod_revision)?.stored_with(p.provider)),
        Err(e) => Ok(Object::unreadable(key, mod_revision, &e)),
    }
}

/// What a delete at `revision` reports: the last state, `last`, stamped with the delete's revision. Made when the
/// delete is written, and made again the same way when the log is read.
pub fn deletion(last: &Object, revision: Revision) -> Result<Object> {
    if let Some(gone) = last.unreadable_at(revision) {
        return Ok(gone);
    }
    let key = &last.key;
    let value =
        serde_json::from_slice(&last.bytes).map_err(|e| StorageError::Corrupt(format!("object {key:?}: {e}")))?;
    Ok(Object::new(key, value, revision)?.stored_with(last.stored_with.clone()))
}

/// The key of the event at `revision`: `e/<revision BE><kind u8><object key>`. Its value is the record of the
/// key's previous state as it was stored (empty for an added key), and its new state is the key's next record (the
/// next event's previous state, or the current object): so every state is on disk once, and a value sled keeps in
/// its page cache is the very buffer an object in the cache above shares.
pub fn event_key(revision: Revision, kind: EventType, key: &str) -> Vec<u8> {
    let kind = match kind {
        EventType::Added => 0u8,
        EventType::Modified => 1,
        EventType::Deleted => 2,
    };
    [&event_prefix(revision)[..], &[kind], key.as_bytes()].concat()
}

/// Where the events of `revision` start: a bound for ranges of the log.
pub fn event_prefix(revision: Revision) -> Vec<u8> {
    [EVENT_PREFIX, &revision.to_be_bytes()].concat()
}

/// An event key, decoded.
pub struct EventKey<'a> {
    pub revision: Revision,
    pub kind: EventType,
    pub key: &'a str,
}

pub fn split_event_key(raw: &[u8]) -> Result<EventKey<'_>> {
    let rest = raw.strip_prefix(EVENT_PREFIX).ok_or_else(|| corrupt("not an event key"))?;
    if rest.len() < 9 {
        return Err(corrupt("event key too short"));
    }
    let revision = decode_u64(&rest[..8])?;
    let kind = match rest[8] {
        0 => EventType::Added,
        1 => EventType::Modified,
        2 => EventType::Deleted,
        _ => return Err(corrupt("unknown event kind")),
    };
    let key = std::str::from_utf8(&rest[9..]).map_err(|_| corrupt("event key is not UTF-8"))?;
    Ok(EventKey { revision, kind, key })
}

/// Gives each event its new state, walking the log newest first: the state after an event is the previous state
/// held by the key's next event, or, for the key's last event, its current record.
pub struct Unwind<'v, F> {
    after: HashMap<String, Option<Arc<Object>>>,
    current: F,
    values: &'v Transformer,
}

impl<'v, F: FnMut(&str) -> Result<Option<Arc<Object>>>> Unwind<'v, F> {
    /// `current` reads a key's current object.
    pub fn new(current: F, values: &'v Transformer) -> Self {
        Self { after: HashMap::new(), current, values }
    }

    /// The new and the previous state of the event `event` with value `value`; events must come newest first.
    pub fn event(&mut self, event: &EventKey<'_>, value: &IVec) -> Result<(Arc<Object>, Option<Arc<Object>>)> {
        let after = match self.after.remove(event.key) {
            Some(state) => state,
            None => (self.current)(event.key)?,
        };
        let prev = match value.is_empty() {
            true => None,
            false => Some(Arc::new(decode_object(event.key, value, self.values)?)),
        };
        let object = match (event.kind, after, &prev) {
            (EventType::Deleted, None, Some(p)) => Arc::new(deletion(p, event.revision)?),
            (EventType::Added, Some(o), None) | (EventType::Modified, Some(o), Some(_))
                if o.mod_revision == event.revision =>
            {
                o
            }
            _ => {
                return Err(StorageError::Corrupt(format!(
                    "the event log and the objects disagree at revision {} ({:?} of {:?})",
                    event.revision, event.kind, event.key
                )))
            }
        };
        self.after.insert(event.key.to_owned(), prev.clone());
        Ok((object, prev))
    }
}
