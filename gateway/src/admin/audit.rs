//! The audit log: one entry per committed change (who, what, the state's hash before and after,
//! when), stored with the change in one atomic step so the log and the state cannot disagree.
//!
//! The log is tamper-evident. Each entry carries the MAC of the one before it and its own,
//! an HMAC-SHA256 over every field under a secret key from the configuration
//! (`admin.audit_keys`, the first signs, all verify, so a key is rotated by putting a new one
//! first and dropping the old one once no kept entry needs it). Without the secret, an edited
//! entry cannot be given a valid MAC, so it breaks the chain where it is; and the state record
//! anchors the newest entry (its revision and MAC), so dropping the newest entries breaks it
//! too. An entry that cannot be read is a break, reported like the others. The API only
//! appends; reads filter the newest entries the store keeps (`admin.audit_keep`).

use std::io::Write as _;
use std::path::Path;

use hmac::{Hmac, Mac};
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
    /// What: `tenant.put`, `key.create`, `alias.delete`, `state.restore`, ….
    pub action: String,
    /// What it was done to: a tenant, plan, key id or model id.
    pub target: String,
    /// The state's hash before.
    pub before: String,
    /// The state's hash after.
    pub after: String,
    /// The previous entry's MAC (empty for the first).
    pub previous: String,
    /// The id of the key that signed it.
    #[serde(default)]
    pub key_id: String,
    /// This entry's MAC, over every field above.
    pub hash: String,
}

/// The newest entry, as the state record holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    /// Its revision (the record's own).
    pub revision: u64,
    /// Its MAC.
    pub hash: String,
}

impl Anchor {
    /// The anchor of `entry`, the newest one.
    pub fn of(entry: &AuditEntry) -> Self {
        Self {
            revision: entry.revision,
            hash: entry.hash.clone(),
        }
    }
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
    hex(&Sha256::digest(bytes)[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The audit chain's keys: the first signs new entries, every one verifies.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKeys {
    keys: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for AuditKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("AuditKeys").field("ids", &ids).finish()
    }
}

impl AuditKeys {
    /// Keys by id, the signing one first; `None` when there are none.
    pub fn new(keys: Vec<(String, Vec<u8>)>) -> Option<Self> {
        (!keys.is_empty()).then_some(Self { keys })
    }

    fn mac(secret: &[u8], entry: &AuditEntry) -> String {
        let revision = entry.revision.to_string();
        let fields = [
            revision.as_str(),
            &entry.at,
            &entry.actor,
            entry.certificate.as_deref().unwrap_or(""),
            &entry.action,
            &entry.target,
            &entry.before,
            &entry.after,
            &entry.previous,
            &entry.key_id,
        ];
        // HMAC takes a key of any length; this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
            return String::new();
        };
        for field in fields {
            mac.update(field.as_bytes());
            mac.update(b"\x1f");
        }
        hex(&mac.finalize().into_bytes())
    }

    /// Signs `entry` with the first key.
    pub fn sign(&self, entry: &mut AuditEntry) {
        let (id, secret) = &self.keys[0];
        entry.key_id = id.clone();
        entry.hash = Self::mac(secret, entry);
    }

    /// Why `entry`'s MAC is not one of these keys', if it is not.
    fn verify(&self, entry: &AuditEntry) -> Result<(), String> {
        let Some((_, secret)) = self.keys.iter().find(|(id, _)| *id == entry.key_id) else {
            return Err(if entry.key_id.is_empty() {
                "the entry is not signed".into()
            } else {
                format!(
                    "the entry is signed with key `{}`, which is not configured",
                    entry.key_id
                )
            });
        };
        let expected = Self::mac(secret, entry);
        if subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), entry.hash.as_bytes()).into() {
            Ok(())
        } else {
            Err("the entry's MAC does not match its fields (edited)".into())
        }
    }
}

impl AuditEntry {
    /// Whether it matches a query's filters.
    pub fn matches(&self, query: &AuditQuery) -> bool {
        query.after.is_none_or(|after| self.revision > after)
            && query.action.as_ref().is_none_or(|a| *a == self.action)
            && query.actor.as_ref().is_none_or(|a| *a == self.actor)
            && query.target.as_ref().is_none_or(|t| *t == self.target)
    }
}

/// Where the chain of the entries kept is broken, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// The revision of the entry where it breaks (`None` when the entry cannot be read).
    pub revision: Option<u64>,
    /// The kept entry's position, oldest first.
    pub position: usize,
    /// Why.
    pub reason: String,
}

/// The readable entries of a log (oldest first) and the breaks of its chain: each entry's MAC
/// is a configured key's over its own fields, names the one before, and the newest is the one
/// the state record anchors (`anchor`, when the record has one).
pub fn check_chain(
    raw: &[Vec<u8>],
    keys: &AuditKeys,
    anchor: Option<&Anchor>,
) -> (Vec<AuditEntry>, Vec<ChainBreak>) {
    let mut entries = Vec::with_capacity(raw.len());
    let mut breaks = Vec::new();
    let mut before: Option<AuditEntry> = None;
    for (position, bytes) in raw.iter().enumerate() {
        let entry: AuditEntry = match serde_json::from_slice(bytes) {
            Ok(entry) => entry,
            Err(e) => {
                breaks.push(ChainBreak {
                    revision: None,
                    position,
                    reason: format!("the entry cannot be read: {e}"),
                });
                before = None;
                continue;
            }
        };
        let mut broke = |reason: String| {
            breaks.push(ChainBreak {
                revision: Some(entry.revision),
                position,
                reason,
            });
        };
        if let Err(why) = keys.verify(&entry) {
            broke(why);
        }
        if let Some(prior) = &before {
            if entry.previous != prior.hash {
                broke(format!(
                    "it does not follow revision {}'s entry",
                    prior.revision
                ));
            } else if entry.revision != prior.revision + 1 {
                broke(format!("its revision does not follow {}", prior.revision));
            }
        }
        before = Some(entry.clone());
        entries.push(entry);
    }
    if let Some(anchor) = anchor {
        let newest = raw.last().and(before.as_ref());
        let anchored =
            newest.is_some_and(|e| e.revision == anchor.revision && e.hash == anchor.hash);
        if !anchored {
            breaks.push(ChainBreak {
                revision: Some(anchor.revision),
                position: raw.len(),
                reason: format!(
                    "the state is at revision {}, but the newest entry kept is {}: entries are missing or replaced",
                    anchor.revision,
                    newest.map_or_else(|| "none".to_string(), |e| e.revision.to_string())
                ),
            });
        }
    }
    (entries, breaks)
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

    fn keys() -> AuditKeys {
        AuditKeys::new(vec![
            ("k2".into(), b"new secret".to_vec()),
            ("k1".into(), b"old secret".to_vec()),
        ])
        .unwrap()
    }

    fn entry(revision: u64, previous: &str, keys: &AuditKeys) -> AuditEntry {
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
            key_id: String::new(),
            hash: String::new(),
        };
        keys.sign(&mut e);
        e
    }

    fn raw(entries: &[&AuditEntry]) -> Vec<Vec<u8>> {
        entries
            .iter()
            .map(|e| serde_json::to_vec(e).unwrap())
            .collect()
    }

    fn anchor(e: &AuditEntry) -> Anchor {
        Anchor {
            revision: e.revision,
            hash: e.hash.clone(),
        }
    }

    #[test]
    fn an_intact_chain_has_no_breaks_and_old_keys_still_verify() {
        let k = keys();
        let old = AuditKeys::new(vec![("k1".into(), b"old secret".to_vec())]).unwrap();
        let first = entry(1, "", &old);
        let second = entry(2, &first.hash, &k);
        assert_eq!(second.key_id, "k2");
        let (entries, breaks) = check_chain(&raw(&[&first, &second]), &k, Some(&anchor(&second)));
        assert_eq!((entries.len(), breaks), (2, vec![]));
    }

    #[test]
    fn an_edited_entry_with_recomputed_hashes_breaks_the_chain() {
        let k = keys();
        let first = entry(1, "", &k);
        let second = entry(2, &first.hash, &k);
        let mut edited = first.clone();
        edited.actor = "key:ffffffffffff".into();
        // What an editor without the key can do: recompute a plain hash.
        edited.hash = digest(edited.actor.as_bytes());
        let mut relinked = second.clone();
        relinked.previous = edited.hash.clone();
        let (_, breaks) = check_chain(&raw(&[&edited, &relinked]), &k, Some(&anchor(&second)));
        assert_eq!(
            breaks.iter().map(|b| b.revision).collect::<Vec<_>>(),
            [Some(1), Some(2)]
        );
        let forged = AuditKeys::new(vec![("k2".into(), b"a guess".to_vec())]).unwrap();
        let signed_elsewhere = entry(1, "", &forged);
        let (_, breaks) = check_chain(&raw(&[&signed_elsewhere]), &k, None);
        assert!(breaks[0].reason.contains("edited"), "{breaks:?}");
    }

    #[test]
    fn dropped_newest_entries_and_unreadable_ones_are_breaks() {
        let k = keys();
        let first = entry(1, "", &k);
        let second = entry(2, &first.hash, &k);
        let (_, breaks) = check_chain(&raw(&[&first]), &k, Some(&anchor(&second)));
        assert_eq!(breaks.len(), 1);
        assert!(breaks[0].reason.contains("missing"), "{breaks:?}");
        let mut unreadable = raw(&[&first, &second]);
        unreadable[0] = b"{not json".to_vec();
        let (entries, breaks) = check_chain(&unreadable, &k, Some(&anchor(&second)));
        assert_eq!(entries, vec![second.clone()]);
        assert_eq!(breaks.len(), 1);
        assert_eq!((breaks[0].revision, breaks[0].position), (None, 0));
        let third = entry(3, &first.hash, &k);
        let (_, breaks) = check_chain(&raw(&[&first, &third]), &k, None);
        assert_eq!(breaks.len(), 1, "a revision skipped: {breaks:?}");
        let unsigned = AuditEntry {
            key_id: String::new(),
            ..first.clone()
        };
        let (_, breaks) = check_chain(&raw(&[&unsigned]), &k, None);
        assert!(breaks[0].reason.contains("not signed"));
    }

    #[test]
    fn queries_filter_by_every_field() {
        let e = entry(5, "", &keys());
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
