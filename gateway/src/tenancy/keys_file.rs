//! The keys file: API keys (their hashes) and, optionally, more plans and tenants, read at
//! start and again whenever it changes, without a restart. `turnpike keys` writes it.
//!
//! ```toml
//! [[keys]]
//! id = "3f9a1c2b7d4e"
//! hash = "sha256:…"
//! tenant = "acme"
//! created = "2026-11-22T10:00:00Z"
//! expires = "2027-01-01T00:00:00Z"   # optional; rotation sets it to the end of the grace
//! models = ["sim"]                   # optional scopes
//! endpoints = ["chat"]
//! revoked = false
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::settings::{RawLimits, TenancyConfig, endpoints, tenants};
use super::{Directory, KeyRecord, NameSet, Scopes, keys};

/// One stored key as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredKey {
    /// Public id.
    pub id: String,
    /// `sha256:<hex>` of the key.
    pub hash: String,
    /// Owning tenant.
    pub tenant: String,
    /// When it was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// When it stops working (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Model scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Endpoint scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    /// Revoked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeysFile {
    #[serde(default)]
    plans: BTreeMap<String, RawLimits>,
    #[serde(default)]
    tenants: BTreeMap<String, RawLimits>,
    #[serde(default)]
    keys: Vec<StoredKey>,
}

/// RFC 3339 text as Unix seconds.
pub fn parse_time(text: &str, at: &str) -> Result<i64, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map(OffsetDateTime::unix_timestamp)
        .map_err(|e| {
            format!("{at}: `{text}` is not an RFC 3339 time like 2027-01-01T00:00:00Z ({e})")
        })
}

/// Unix seconds as RFC 3339 text.
pub fn format_time(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// The keys of a keys file's text.
pub fn parse_keys(text: &str) -> Result<Vec<StoredKey>, String> {
    let raw: RawKeysFile = toml::from_str(text).map_err(|e| e.to_string())?;
    Ok(raw.keys)
}

/// The directory: the configuration's tenants and keys, plus the keys file's.
pub fn directory(config: &TenancyConfig) -> Result<Directory, String> {
    let mut directory = config.directory.clone();
    let Some(path) = &config.keys_file else {
        return Ok(directory);
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    merge(&text, path, config, &mut directory)?;
    Ok(directory)
}

fn merge(
    text: &str,
    path: &Path,
    config: &TenancyConfig,
    directory: &mut Directory,
) -> Result<(), String> {
    let at = |e: String| format!("{}: {e}", path.display());
    let raw: RawKeysFile = toml::from_str(text).map_err(|e| at(e.to_string()))?;
    let mut plans = config.plans.clone();
    for (name, plan) in raw.plans {
        if plans.insert(name.clone(), plan).is_some() {
            return Err(at(format!("plans.{name}: plan defined twice")));
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    tenants(&plans, &raw.tenants, &env, directory).map_err(at)?;
    for (i, k) in raw.keys.into_iter().enumerate() {
        let place = format!("keys[{i}]");
        let record = KeyRecord {
            hash: keys::parse_hash(&k.hash)
                .ok_or_else(|| at(format!("{place}.hash: not sha256:<64 hex digits>")))?,
            expires_at: k
                .expires
                .as_deref()
                .map(|t| parse_time(t, &format!("{place}.expires")))
                .transpose()
                .map_err(at)?,
            scopes: Scopes {
                models: k.models.as_deref().map_or(NameSet::All, NameSet::from_list),
                endpoints: endpoints(k.endpoints.as_deref(), &place).map_err(at)?,
            },
            revoked: k.revoked,
            id: k.id,
            tenant: k.tenant,
        };
        let id_ok = record.id.len() == keys::ID_LEN
            && record
                .id
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !id_ok {
            return Err(at(format!("{place}.id: not {} hex digits", keys::ID_LEN)));
        }
        if !directory.tenants.contains_key(&record.tenant) {
            return Err(at(format!("{place}.tenant: no tenant `{}`", record.tenant)));
        }
        let id = record.id.clone();
        if directory.keys.insert(id.clone(), record).is_some() {
            return Err(at(format!("{place}.id: key id {id} is used twice")));
        }
    }
    Ok(())
}
