//! The audit log: one entry per committed change (who, what, the state's hash before and after,
//! when), stored with the change in one atomic step so the log and the state cannot disagree,
//! and chained: each entry carries the hash of the one before it, so an edited or removed entry
//! breaks the chain where it was. The API only appends; reads filter the newest entries the store
//! keeps (`admin.audit_keep`).

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The state's revision this change made.
    pub revision: u64,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Who: `key:<id>` or `token:<subject>`, with their tenant.
    pub actor: String,
    /// The SHA-256 of the client certificate the call came with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// What: `tenant.put`, `key.create`, `alias.delete`, ….
    pub action: String,
    /// What it was done to: a tenant, plan, key id or model id.
    pub target: String,
    /// The state's hash before.
    pub before: String,
    /// The state's hash after.
    pub after: String,
    /// The previous entry's hash (empty for the first).
    pub previous: String,
    /// This entry's hash, over every field above.
    pub hash: String,
}

/// What an audit read asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only entries of revisions after this one.
    pub after: Option<u64>,
    /// Only this action.
    pub action: Option<String>,
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this target.
    pub target: Option<String>,
    /// At most this many (the oldest that match first); 100 by default, 1000 at most.
    pub limit: Option<usize>,
}

/// A short SHA-256 of bytes, as hex.
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl AuditEntry {
    /// The hash of every field but `hash`.
    pub fn compute_hash(&self) -> String {
        let fields = [
            self.revision.to_string().as_str(),
            &self.at,
            &self.actor,
            self.certificate.as_deref().unwrap_or(""),
            &self.action,
            &self.target,
            &self.before,
            &self.after,
            &self.previous,
        ]
        .join("\u{1f}");
        digest(fields.as_bytes())
    }

    /// Whether it matches a query's filters.
    pub fn matches(&self, query: &AuditQuery) -> bool {
        query.after.is_none_or(|after| self.revision > after)
            && query.action.as_ref().is_none_or(|a| *a == self.action)
            && query.actor.as_ref().is_none_or(|a| *a == self.actor)
            && query.target.as_ref().is_none_or(|t| *t == self.target)
    }
}

/// Whether each entry's hash is its own and each names the one before it.
pub fn chain_intact(entries: &[AuditEntry]) -> bool {
    entries.iter().all(|e| e.hash == e.compute_hash())
        && entries.windows(2).all(|pair| {
            pair[1].previous == pair[0].hash && pair[1].revision == pair[0].revision + 1
        })
}

/// Appends `entry` as one JSON line to `path`.
pub fn append_to_file(path: &Path, entry: &AuditEntry) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(revision: u64, previous: &str) -> AuditEntry {
        let mut e = AuditEntry {
            revision,
            at: "2026-11-27T00:00:00Z".into(),
            actor: "key:0123456789ab".into(),
            certificate: None,
            action: "tenant.put".into(),
            target: "acme".into(),
            before: "a".into(),
            after: "b".into(),
            previous: previous.into(),
            hash: String::new(),
        };
        e.hash = e.compute_hash();
        e
    }

    #[test]
    fn an_edited_entry_breaks_the_chain() {
        let first = entry(1, "");
        let second = entry(2, &first.hash);
        assert!(chain_intact(&[first.clone(), second.clone()]));
        let mut edited = first.clone();
        edited.actor = "key:ffffffffffff".into();
        assert!(!chain_intact(&[edited, second.clone()]));
        let third = entry(3, &second.hash);
        assert!(!chain_intact(&[first, third]), "a removed entry shows");
    }

    #[test]
    fn queries_filter_by_every_field() {
        let e = entry(5, "");
        assert!(e.matches(&AuditQuery::default()));
        assert!(e.matches(&AuditQuery {
            after: Some(4),
            action: Some("tenant.put".into()),
            ..AuditQuery::default()
        }));
        assert!(!e.matches(&AuditQuery {
            after: Some(5),
            ..AuditQuery::default()
        }));
        assert!(!e.matches(&AuditQuery {
            target: Some("other".into()),
            ..AuditQuery::default()
        }));
    }
}
