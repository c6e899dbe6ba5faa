//! The admin state as it is kept: the store's record (the document and the anchor of the audit
//! chain, its newest entry's revision and MAC) and this replica's own copy on disk
//! (`admin.state_file`), written on every install so a replica that starts against a store that
//! lost the state still holds the newest one it saw and puts it back.

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::audit::{Anchor, AuditEntry};
use super::changes::AdminDoc;

/// The store's record of the admin state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRecord {
    /// The state.
    pub doc: AdminDoc,
    /// The audit chain's newest entry (absent in records written before the chain had one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Anchor>,
}

impl StateRecord {
    /// `doc`, anchored at `entry`, the audit entry that makes it.
    pub fn anchored(doc: AdminDoc, entry: &AuditEntry) -> Self {
        Self {
            doc,
            audit: Some(Anchor {
                revision: entry.revision,
                hash: entry.hash.clone(),
            }),
        }
    }

    /// Reads a stored record; a bare document (as records were first written) has no anchor.
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice::<Self>(bytes).or_else(|first| {
            serde_json::from_slice::<AdminDoc>(bytes)
                .map(|doc| Self { doc, audit: None })
                .map_err(|_| first)
        })
    }

    /// The stored form.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// The state file: a record and its revision.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    revision: u64,
    doc: AdminDoc,
    #[serde(default)]
    audit: Option<Anchor>,
}

/// The revision and record `path` holds; `None` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<(u64, StateRecord)>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let file: StateFile =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let record = StateRecord {
        doc: file.doc,
        audit: file.audit,
    };
    Ok(Some((file.revision, record)))
}

/// Writes `record` at `revision` to `path` whole: a new file (readable by this user only: it
/// holds the keys' hashes) renamed over the old one, so a crash leaves the old state or the new
/// one, never part of one.
pub fn save(path: &Path, revision: u64, record: &StateRecord) -> std::io::Result<()> {
    let file = StateFile {
        revision,
        doc: record.doc.clone(),
        audit: record.audit.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    let temporary = std::path::PathBuf::from(name);
    let mut out = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?
    };
    out.write_all(&bytes)?;
    out.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_with_or_without_their_anchor() {
        let anchored = StateRecord {
            doc: AdminDoc::default(),
            audit: Some(Anchor {
                revision: 3,
                hash: "ab".into(),
            }),
        };
        let bytes = anchored.encode().unwrap();
        assert_eq!(StateRecord::decode(&bytes).unwrap(), anchored);
        let bare = serde_json::to_vec(&AdminDoc::default()).unwrap();
        assert_eq!(StateRecord::decode(&bare).unwrap(), StateRecord::default());
        assert!(StateRecord::decode(b"{\"doc\": 1}").is_err());
    }

    #[test]
    fn the_state_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-state.json");
        assert_eq!(load(&path).unwrap(), None);
        save(&path, 7, &StateRecord::default()).unwrap();
        save(&path, 8, &StateRecord::default()).unwrap();
        assert_eq!(load(&path).unwrap(), Some((8, StateRecord::default())));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "it holds the keys' hashes");
        std::fs::write(&path, b"{").unwrap();
        assert!(load(&path).is_err());
    }
}
