//! The parts of idempotency that are plain data: the key's validation, the request's
//! fingerprint, and the recorded response's byte format.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Longest accepted `Idempotency-Key`.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key` of a request: `None` without one, an error when malformed.
pub(crate) fn key(headers: &HeaderMap) -> Option<Result<String, ApiError>> {
    let mut values = headers.get_all("idempotency-key").iter();
    let value = values.next()?;
    let bad = |message: String| {
        Some(Err(ApiError::InvalidHeader {
            header: "Idempotency-Key",
            message,
        }))
    };
    if values.next().is_some() {
        return bad("Send one Idempotency-Key header, not several.".into());
    }
    match valid_key(value.as_bytes()) {
        Ok(key) => Some(Ok(key)),
        Err(message) => bad(message),
    }
}

/// An idempotency key as given (a header's value, a WebSocket message's field), checked: 1 to
/// [`MAX_KEY_LEN`] printable ASCII characters without spaces.
pub(crate) fn valid_key(bytes: &[u8]) -> Result<String, String> {
    if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
        return Err(format!(
            "The Idempotency-Key must be 1 to {MAX_KEY_LEN} characters long (it has {}).",
            bytes.len()
        ));
    }
    if !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(
            "The Idempotency-Key may hold only printable ASCII characters, without spaces.".into(),
        );
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// Hex SHA-256.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The fingerprint of a request: its method, path and body, where a JSON body counts by its
/// content (object keys sorted, whitespace ignored), so a client that re-serialises the same
/// request is not refused.
pub(crate) fn fingerprint(method: &str, path: &str, body: &[u8]) -> Fingerprint {
    let (canonical, keep_content) = match serde_json::from_slice::<Value>(body) {
        Ok(value) => {
            let mut out = Vec::with_capacity(body.len());
            write_canonical(&value, &mut out);
            let keep = value.get("store").and_then(Value::as_bool) != Some(false);
            (out, keep)
        }
        Err(_) => (body.to_vec(), true),
    };
    let mut hasher = Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update(b" ");
    hasher.update(path.as_bytes());
    hasher.update(b"\n");
    hasher.update(&canonical);
    Fingerprint {
        hash: hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        keep_content,
    }
}

/// What a request is known by under its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// The hash of its method, path and canonical body.
    pub hash: String,
    /// Whether its response may be kept for replay: not when the body says `"store": false`.
    pub keep_content: bool,
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// A response as recorded: status, headers, and the body's chunks (an event stream keeps its
/// events apart, so a replay streams as the original did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Recorded {
    /// HTTP status.
    pub status: u16,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body chunks; `None` when the response was too large to keep, or not to be kept.
    pub chunks: Option<Vec<String>>,
    /// The request said `"store": false`: its response was not kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unstored: bool,
}

impl Recorded {
    /// The headers worth replaying (not those of the transport).
    pub(crate) fn keep_headers(headers: &HeaderMap) -> Vec<(String, String)> {
        headers
            .iter()
            .filter(|(name, _)| {
                !matches!(
                    name.as_str(),
                    "content-length" | "transfer-encoding" | "connection" | "date"
                ) && !name.as_str().starts_with("x-ratelimit-")
            })
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect()
    }

    /// The status and headers as HTTP types.
    pub(crate) fn head(&self) -> (StatusCode, HeaderMap) {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(n, v);
            }
        }
        (
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK),
            headers,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_key_order_and_whitespace_only() {
        let a = fingerprint("POST", "/v1/x", br#"{"a":1,"b":[1,{"c":2,"d":3}]}"#);
        let b = fingerprint("POST", "/v1/x", br#"{ "b": [1, {"d":3, "c":2}], "a": 1 }"#);
        assert_eq!(a, b);
        assert_ne!(
            a,
            fingerprint("POST", "/v1/x", br#"{"a":2,"b":[1,{"c":2,"d":3}]}"#)
        );
        assert_ne!(
            a,
            fingerprint("POST", "/v1/y", br#"{"a":1,"b":[1,{"c":2,"d":3}]}"#)
        );
        assert_ne!(
            fingerprint("POST", "/v1/x", br#"{"b":[2,1]}"#),
            fingerprint("POST", "/v1/x", br#"{"b":[1,2]}"#)
        );
    }

    #[test]
    fn store_false_alone_keeps_no_content() {
        assert!(fingerprint("POST", "/v1/x", br#"{"a":1}"#).keep_content);
        assert!(fingerprint("POST", "/v1/x", br#"{"store":true}"#).keep_content);
        assert!(fingerprint("POST", "/v1/x", b"not json").keep_content);
        assert!(!fingerprint("POST", "/v1/x", br#"{"store":false}"#).keep_content);
        // An unstored record says so, and reads back from records written before the flag.
        let old: Recorded =
            serde_json::from_str(r#"{"status":200,"headers":[],"chunks":null}"#).unwrap();
        assert!(!old.unstored);
    }

    #[test]
    fn keys_are_checked() {
        let mut h = HeaderMap::new();
        assert!(key(&h).is_none());
        h.insert("idempotency-key", HeaderValue::from_static("order-42"));
        assert_eq!(key(&h).unwrap().unwrap(), "order-42");
        let long = "k".repeat(MAX_KEY_LEN + 1);
        h.insert("idempotency-key", HeaderValue::from_str(&long).unwrap());
        assert!(key(&h).unwrap().is_err());
        h.insert(
            "idempotency-key",
            HeaderValue::from_bytes(b"a\xffb").unwrap(),
        );
        assert!(key(&h).unwrap().is_err());
        h.insert("idempotency-key", HeaderValue::from_static("with space"));
        assert!(key(&h).unwrap().is_err());
        h.insert("idempotency-key", HeaderValue::from_static("a"));
        h.append("idempotency-key", HeaderValue::from_static("b"));
        assert!(key(&h).unwrap().is_err());
    }

    #[test]
    fn records_round_trip() {
        let r = Recorded {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: Some(vec!["data: {}\n\n".into(), "data: [DONE]\n\n".into()]),
            unstored: false,
        };
        let bytes = serde_json::to_vec(&r).unwrap();
        assert_eq!(serde_json::from_slice::<Recorded>(&bytes).unwrap(), r);
        let (status, headers) = r.head();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "text/event-stream");
    }
}
