//! `[admin]`: the admin API's own settings, validated here; the configuration only composes
//! them.
//!
//! ```toml
//! [admin]
//! enabled = true
//! client_certificate = "required"   # admin calls only over TLS with a verified client certificate
//! sync_interval_ms = 250            # how often each replica checks the shared state
//! audit_keep = 10000                # audit entries kept in the state store (newest)
//! audit_file = "audit.jsonl"        # optional: every change this replica makes, appended
//! # The audit chain's HMAC keys, from the environment: the first signs, all verify.
//! audit_keys = [{ id = "2026-11", env = "TURNPIKE_AUDIT_KEY" }]
//! state_file = "admin-state.json"   # optional: the newest admin state here, kept on disk
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::audit::AuditKeys;

/// The admin API's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    /// Whether a call must come over a TLS connection whose client certificate verified.
    pub client_certificate_required: bool,
    /// How often each replica reads the shared state's revision.
    pub sync_interval: Duration,
    /// Audit entries kept in the state store.
    pub audit_keep: usize,
    /// A local append-only copy of the changes made through this replica.
    pub audit_file: Option<PathBuf>,
    /// The audit chain's keys.
    pub audit_keys: AuditKeys,
    /// Where this replica keeps the newest admin state it holds, so a replica that starts
    /// against a store that lost the state puts it back.
    pub state_file: Option<PathBuf>,
}

/// An audit key as written: its id and the environment variable holding its secret.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuditKey {
    id: String,
    env: String,
}

/// The shortest audit secret taken, in bytes.
const MIN_SECRET: usize = 32;

/// `[admin]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    #[serde(default)]
    enabled: bool,
    client_certificate: Option<String>,
    sync_interval_ms: Option<u64>,
    audit_keep: Option<usize>,
    audit_file: Option<String>,
    audit_keys: Option<Vec<RawAuditKey>>,
    state_file: Option<String>,
}

impl RawAdmin {
    /// Validates: `None` when the admin API is off. `auth_required` and `client_ca` say
    /// whether the server authenticates callers and verifies client certificates; `vars`
    /// reads the environment.
    pub fn validate(
        self,
        base: &Path,
        auth_required: bool,
        client_ca: bool,
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<AdminSettings>, String> {
        if !self.enabled {
            let set = self.client_certificate.is_some()
                || self.sync_interval_ms.is_some()
                || self.audit_keep.is_some()
                || self.audit_file.is_some()
                || self.audit_keys.is_some()
                || self.state_file.is_some();
            if set {
                return Err("admin: settings given but enabled is not true".into());
            }
            return Ok(None);
        }
        if !auth_required {
            return Err("admin: the admin API needs authentication; configure [tenants] or [auth] with an admin key (endpoints = [\"admin\"]) or JWTs with an `admin` scope".into());
        }
        let client_certificate_required = match self.client_certificate.as_deref() {
            None | Some("optional") => false,
            Some("required") if client_ca => true,
            Some("required") => {
                return Err("admin.client_certificate: \"required\" needs [server.tls] with client_ca_file, so client certificates are verified".into());
            }
            Some(other) => {
                return Err(format!(
                    "admin.client_certificate: `{other}` is not \"optional\" or \"required\""
                ));
            }
        };
        let sync_ms = self.sync_interval_ms.unwrap_or(250);
        if !(10..=60_000).contains(&sync_ms) {
            return Err("admin.sync_interval_ms must be 10 to 60000".into());
        }
        let audit_keep = self.audit_keep.unwrap_or(10_000);
        if !(1..=10_000_000).contains(&audit_keep) {
            return Err("admin.audit_keep must be 1 to 10000000".into());
        }
        let audit_keys = audit_keys(self.audit_keys.unwrap_or_default(), vars)?;
        Ok(Some(AdminSettings {
            client_certificate_required,
            sync_interval: Duration::from_millis(sync_ms),
            audit_keep,
            audit_file: self.audit_file.map(|f| base.join(f)),
            audit_keys,
            state_file: self.state_file.map(|f| base.join(f)),
        }))
    }
}

/// The audit keys, their secrets read from the environment.
fn audit_keys(
    raw: Vec<RawAuditKey>,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<AuditKeys, String> {
    let mut keys: Vec<(String, Vec<u8>)> = Vec::with_capacity(raw.len());
    for key in raw {
        let at = format!("admin.audit_keys.{}", key.id);
        let id_ok = !key.id.is_empty()
            && key.id.len() <= 64
            && key
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !id_ok {
            return Err(format!(
                "{at}: an id is 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        if keys.iter().any(|(id, _)| *id == key.id) {
            return Err(format!("{at}: the id is used twice"));
        }
        let secret = vars(&key.env)
            .ok_or_else(|| format!("{at}: environment variable {} is not set", key.env))?;
        if secret.len() < MIN_SECRET {
            return Err(format!(
                "{at}: {} must hold at least {MIN_SECRET} bytes",
                key.env
            ));
        }
        keys.push((key.id, secret.into_bytes()));
    }
    AuditKeys::new(keys).ok_or_else(|| {
        "admin.audit_keys: the audit chain needs a secret key, e.g. audit_keys = [{ id = \"k1\", env = \"TURNPIKE_AUDIT_KEY\" }] with 32 random bytes or more in TURNPIKE_AUDIT_KEY (`openssl rand -base64 48`)".to_string()
    })
}
