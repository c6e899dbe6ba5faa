//! The keys file: API keys (their hashes) and, optionally, more plans and tenants, read at
//! start and again whenever it changes, without a restart. `turnpike keys` writes it. The admin
//! API keeps the same document ([`KeysDoc`]) in the state store, and [`compose`] validates all
//! three layers (configuration, keys file, admin) one way.
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

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::settings::{RawLimits, TenancyConfig, scopes, tenants};
use super::{Directory, KeyRecord, Scopes, keys};
use crate::spend::settings::RawBudget;

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
    /// The key's own spend budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RawBudget>,
}

/// Plans, tenants and keys as a keys file (or the admin API's state) holds them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeysDoc {
    /// Plans by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plans: BTreeMap<String, RawLimits>,
    /// Tenants by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, RawLimits>,
    /// Keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<StoredKey>,
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
    let raw: KeysDoc = toml::from_str(text).map_err(|e| e.to_string())?;
    Ok(raw.keys)
}

/// The keys file's document (empty without one).
pub fn read(config: &TenancyConfig) -> Result<KeysDoc, String> {
    let Some(path) = &config.keys_file else {
        return Ok(KeysDoc::default());
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The directory: the configuration's tenants and keys, plus the keys file's.
pub fn directory(config: &TenancyConfig) -> Result<Directory, String> {
    compose(config, &read(config)?, None)
}

/// The directory of the configuration, its keys file's document `file`, and `managed` (the
/// admin API's state, named `admin` in errors), each validated the same way. A plan of an
/// earlier layer is usable in a later one; a name defined twice is an error.
pub fn compose(
    config: &TenancyConfig,
    file: &KeysDoc,
    managed: Option<&KeysDoc>,
) -> Result<Directory, String> {
    let mut directory = config.directory.clone();
    let mut plans = config.plans.clone();
    let file_name = config
        .keys_file
        .as_deref()
        .map_or_else(|| "keys file".to_string(), |p| p.display().to_string());
    merge(file, &file_name, &mut plans, &mut directory)?;
    if let Some(managed) = managed {
        merge(managed, "admin", &mut plans, &mut directory)?;
    }
    Ok(directory)
}

fn merge(
    doc: &KeysDoc,
    source: &str,
    plans: &mut BTreeMap<String, RawLimits>,
    directory: &mut Directory,
) -> Result<(), String> {
    let at = |e: String| format!("{source}: {e}");
    for (name, plan) in &doc.plans {
        if plans.insert(name.clone(), plan.clone()).is_some() {
            return Err(at(format!("plans.{name}: plan defined twice")));
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    tenants(plans, &doc.tenants, &env, directory).map_err(at)?;
    for (i, k) in doc.keys.iter().enumerate() {
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
                budget: k
                    .budget
                    .as_ref()
                    .map(|b| b.validate(&format!("{place}.budget")))
                    .transpose()
                    .map_err(at)?,
                ..scopes(k.models.as_deref(), k.endpoints.as_deref(), &place).map_err(at)?
            },
            revoked: k.revoked,
            id: k.id.clone(),
            tenant: k.tenant.clone(),
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
