//! API keys: `tp-<id>-<secret>`, where `<id>` is 12 hex digits (public: it names the key in
//! logs, the keys file and the audit log) and `<secret>` is 32 random bytes in unpadded
//! base64url. The gateway keeps only the SHA-256 of the whole key and compares hashes in
//! constant time. A fast hash is enough here: the secret carries 256 bits of entropy, so there
//! is nothing to brute-force that a slow password hash would protect.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Scopes;

/// Length of the public id, in hex digits.
pub const ID_LEN: usize = 12;
/// Length of the secret, in base64url characters (32 bytes).
pub const SECRET_LEN: usize = 43;
/// Length of a whole key.
pub const KEY_LEN: usize = 3 + ID_LEN + 1 + SECRET_LEN;

/// A stored key: its hash, never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Public id.
    pub id: String,
    /// SHA-256 of the whole key.
    pub hash: [u8; 32],
    /// The tenant it belongs to.
    pub tenant: String,
    /// Unix seconds after which it stops working (rotation sets this to the end of the grace).
    pub expires_at: Option<i64>,
    /// What it may do.
    pub scopes: Scopes,
    /// Revoked keys fail at once.
    pub revoked: bool,
}

/// Why a presented key is refused (the message is shown to the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not shaped like a Turnpike key.
    #[error(
        "Malformed API key: Turnpike keys look like tp-<12 hex digits>-<43 characters> ({KEY_LEN} characters)."
    )]
    Malformed,
    /// Unknown id or wrong secret.
    #[error("Incorrect API key provided.")]
    Unknown,
    /// Past its expiry (or its rotation grace).
    #[error("The API key has expired.")]
    Expired,
    /// Revoked.
    #[error("The API key has been revoked.")]
    Revoked,
}

/// A new key and its public id, from the operating system's random source.
pub fn generate() -> Result<(String, String), getrandom::Error> {
    let mut id = [0u8; ID_LEN / 2];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id)?;
    getrandom::fill(&mut secret)?;
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let key = format!("tp-{id}-{}", URL_SAFE_NO_PAD.encode(secret));
    Ok((key, id))
}

/// The public id of a well-formed key.
pub fn parse_id(key: &str) -> Result<&str, KeyError> {
    if key.len() != KEY_LEN || !key.is_ascii() {
        return Err(KeyError::Malformed);
    }
    let rest = key.strip_prefix("tp-").ok_or(KeyError::Malformed)?;
    let (id, secret) = rest.split_at(ID_LEN);
    let secret = secret.strip_prefix('-').ok_or(KeyError::Malformed)?;
    let id_ok = id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let secret_ok = secret
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if id_ok && secret_ok && secret.len() == SECRET_LEN {
        Ok(id)
    } else {
        Err(KeyError::Malformed)
    }
}

/// SHA-256 of a key.
pub fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// `sha256:<hex>`, as the keys file stores it.
pub fn hash_text(hash: &[u8; 32]) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Parses `sha256:<64 hex digits>`.
pub fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Checks a presented key against its record at time `now` (Unix seconds).
pub fn verify(record: &KeyRecord, key: &str, now: i64) -> Result<(), KeyError> {
    let presented = hash(key);
    if !bool::from(presented.ct_eq(&record.hash)) {
        return Err(KeyError::Unknown);
    }
    if record.revoked {
        return Err(KeyError::Revoked);
    }
    if record.expires_at.is_some_and(|at| now >= at) {
        return Err(KeyError::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str) -> KeyRecord {
        KeyRecord {
            id: parse_id(key).map(str::to_string).unwrap_or_default(),
            hash: hash(key),
            tenant: "acme".into(),
            expires_at: None,
            scopes: Scopes::default(),
            revoked: false,
        }
    }

    #[test]
    fn generated_keys_parse_and_verify() {
        let (key, id) = generate().unwrap();
        assert_eq!(key.len(), KEY_LEN);
        assert_eq!(parse_id(&key).unwrap(), id);
        let rec = record(&key);
        assert_eq!(verify(&rec, &key, 0), Ok(()));
        let (other, _) = generate().unwrap();
        assert_ne!(key, other);
        assert_eq!(verify(&rec, &other, 0), Err(KeyError::Unknown));
    }

    #[test]
    fn malformed_keys_are_named_so() {
        let (key, _) = generate().unwrap();
        for bad in [
            "",
            "sk-abc",
            &key[..KEY_LEN - 1],
            &format!("{key}x"),
            &key.replacen("tp-", "tq-", 1),
            &key.replacen('-', "_", 1),
            &format!("tp-ABCDEF012345-{}", &key[16..]),
            &format!("{}é", &key[..KEY_LEN - 2]),
        ] {
            assert_eq!(parse_id(bad), Err(KeyError::Malformed), "{bad}");
        }
    }

    #[test]
    fn expiry_and_revocation() {
        let (key, _) = generate().unwrap();
        let mut rec = record(&key);
        rec.expires_at = Some(100);
        assert_eq!(verify(&rec, &key, 99), Ok(()));
        assert_eq!(verify(&rec, &key, 100), Err(KeyError::Expired));
        rec.revoked = true;
        assert_eq!(verify(&rec, &key, 0), Err(KeyError::Revoked));
    }

    #[test]
    fn hashes_round_trip_as_text() {
        let h = hash("x");
        assert_eq!(parse_hash(&hash_text(&h)), Some(h));
        assert_eq!(parse_hash("sha256:zz"), None);
        assert_eq!(parse_hash("md5:00"), None);
    }
}
