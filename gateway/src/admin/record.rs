//! The admin state as it is kept: the store's record (the document and the anchor of the audit
//! chain, its newest entry's revision and MAC; the revision is the store's) and this replica's
//! own copy on disk (`admin.state_file`: a [`Snapshot`] as it is), written on every install so
//! a replica that starts against a store that lost the state still holds the newest one it saw
//! and puts it back.

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Snapshot;
use super::audit::Anchor;
use super::changes::AdminDoc;

/// The store's record, as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    doc: AdminDoc,
    /// Absent in records written before the chain had an anchor.
    #[serde(default)]
    audit: Option<Anchor>,
}

/// The store's record, as written.
#[derive(Serialize)]
struct StoredRef<'a> {
    doc: &'a AdminDoc,
    #[serde(skip_serializing_if = "Option::is_none")]
    audit: Option<&'a Anchor>,
}

/// The snapshot a record of revision `revision` holds; a bare document (as records were first
/// written) has no anchor.
pub fn decode(revision: u64, bytes: &[u8]) -> Result<Snapshot, serde_json::Error> {
    let stored = serde_json::from_slice::<Stored>(bytes).or_else(|first| {
        serde_json::from_slice::<AdminDoc>(bytes)
            .map(|doc| Stored { doc, audit: None })
            .map_err(|_| first)
    })?;
    Ok(Snapshot {
        revision,
        doc: stored.doc,
        audit: stored.audit,
    })
}

/// The record of `snapshot` (its revision is the store's own).
pub fn encode(snapshot: &Snapshot) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&StoredRef {
        doc: &snapshot.doc,
        audit: snapshot.audit.as_ref(),
    })
}

/// The snapshot `path` holds; `None` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<Snapshot>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `snapshot` to `path` whole: a new file (readable by this user only: it holds the
/// keys' hashes) renamed over the old one, so a crash leaves the old state or the new one,
/// never part of one.
pub fn save(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(snapshot).map_err(std::io::Error::other)?;
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
        let anchored = Snapshot {
            revision: 3,
            doc: AdminDoc::default(),
            audit: Some(Anchor {
                revision: 3,
                hash: "ab".into(),
            }),
        };
        let bytes = encode(&anchored).unwrap();
        assert_eq!(decode(3, &bytes).unwrap(), anchored);
        let bare = serde_json::to_vec(&AdminDoc::default()).unwrap();
        assert_eq!(
            decode(2, &bare).unwrap(),
            Snapshot {
                revision: 2,
                ..Snapshot::default()
            }
        );
        assert!(decode(1, b"{\"doc\": 1}").is_err());
    }

    #[test]
    fn the_state_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-state.json");
        assert_eq!(load(&path).unwrap(), None);
        let at = |revision| Snapshot {
            revision,
            ..Snapshot::default()
        };
        save(&path, &at(7)).unwrap();
        save(&path, &at(8)).unwrap();
        assert_eq!(load(&path).unwrap(), Some(at(8)));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "it holds the keys' hashes");
        std::fs::write(&path, b"{").unwrap();
        assert!(load(&path).is_err());
    }
}
