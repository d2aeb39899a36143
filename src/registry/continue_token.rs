//! The opaque `continue` token of a paged list, in kube-apiserver's format: base64 of
//! `{"v":"meta.k8s.io/v1","rv":<revision>,"start":<key after the namespace root>}`.

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};

const VERSION: &str = "meta.k8s.io/v1";

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ContinueToken {
    v: String,
    /// The revision the first page was read at; -1 when the snapshot is gone (a new list starts there).
    pub rv: i64,
    /// The first key of the next page, relative to the list's prefix.
    pub start: String,
}

pub(crate) fn encode(rv: i64, start: &str) -> String {
    let t = ContinueToken { v: VERSION.into(), rv, start: start.to_owned() };
    base64::engine::general_purpose::URL_SAFE.encode(serde_json::to_vec(&t).unwrap_or_default())
}

pub(crate) fn decode(token: &str) -> Result<ContinueToken> {
    let bad = || {
        Error::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE.decode(token).map_err(|_| bad())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    // A token must not reach outside the prefix the list was asked for.
    if t.v != VERSION || t.start.contains("..") || t.start.starts_with('/') {
        return Err(bad());
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = decode(&encode(42, "ns/b\u{0}")).unwrap();
        assert_eq!((t.rv, t.start.as_str()), (42, "ns/b\u{0}"));
        assert!(matches!(decode("not base64!"), Err(Error::BadRequest(_))));
        let sneaky =
            base64::engine::general_purpose::URL_SAFE.encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../x"}"#);
        assert!(matches!(decode(&sneaky), Err(Error::BadRequest(_))));
    }
}
