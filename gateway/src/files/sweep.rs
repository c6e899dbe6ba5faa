//! Sweeping bytes nothing refers to: a file's metadata lapses in the state store after
//! `keep_days` (or was lost with a memory store's process), but its object stays in the
//! directory or bucket until something deletes it. Each replica's batch worker sweeps now and
//! then; deleting is idempotent, so replicas sweeping one store at once do no harm.

use std::time::Duration;

use futures_util::StreamExt;
use object_store::ObjectStoreExt;

use super::Files;
use crate::clock::unix_now;
use crate::error::ApiError;

/// How long an object may exist before its metadata does (an upload writes the bytes first).
const GRACE: Duration = Duration::from_secs(3600);

impl Files {
    /// Deletes objects whose file is gone, and chunk results older than `keep` (a batch's are
    /// deleted when it ends; these are a dead replica's leftovers). Returns how many went.
    pub(crate) async fn sweep(&self) -> Result<usize, ApiError> {
        self.sweep_as_of(i64::try_from(unix_now()).unwrap_or(i64::MAX))
            .await
    }

    /// [`Files::sweep`] as if it were `now` (Unix seconds).
    async fn sweep_as_of(&self, now: i64) -> Result<usize, ApiError> {
        let Some(objects) = self.objects.as_ref() else {
            return Ok(0);
        };
        let grace = GRACE.as_secs() as i64;
        let keep = self.settings.keep.as_secs() as i64;
        let mut listing = objects.list(None);
        let mut deleted = 0;
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| self.unavailable(e))?;
            let age = now.saturating_sub(meta.last_modified.timestamp());
            let parts: Vec<String> = meta
                .location
                .parts()
                .map(|p| p.as_ref().to_string())
                .collect();
            let orphan = match parts.as_slice() {
                [tenant, id] => age > grace && self.find(tenant, id).await?.is_none(),
                [_, _, _] => age > keep,
                _ => false,
            };
            if orphan {
                match objects.delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                    Err(e) => return Err(self.unavailable(e)),
                }
            }
        }
        if deleted > 0 {
            metrics::counter!("turnpike_files_swept_total").increment(deleted as u64);
            tracing::info!(deleted, "files: swept objects whose files lapsed");
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use super::*;
    use crate::files::settings::{FilesSettings, Storage};
    use crate::store::Store;
    use crate::store::memory::{MemoryLimits, MemoryStore};

    const LINE: &str = r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{}}"#;

    #[tokio::test]
    async fn only_bytes_whose_file_lapsed_are_swept_and_only_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryLimits {
            max_records: 100,
            max_bytes: 1 << 20,
        }));
        let settings = FilesSettings {
            storage: Storage::Dir(dir.path().to_path_buf()),
            ..FilesSettings::default()
        };
        let files = Files::new(settings, Arc::clone(&store), Duration::from_secs(1)).unwrap();
        let kept = files
            .upload("acme", "a.jsonl", "batch", LINE.into())
            .await
            .unwrap();
        let lapsed = files
            .upload("acme", "b.jsonl", "batch", LINE.into())
            .await
            .unwrap();
        // Its metadata lapses (here: is removed) while its bytes stay.
        store
            .delete(&super::super::meta_key("acme", &lapsed.id))
            .await
            .unwrap();
        let now = i64::try_from(unix_now()).unwrap();
        assert_eq!(files.sweep_as_of(now).await.unwrap(), 0, "within the grace");
        let later = now + GRACE.as_secs() as i64 + 10;
        assert_eq!(files.sweep_as_of(later).await.unwrap(), 1);
        assert!(files.read("acme", &lapsed.id).await.is_err());
        assert_eq!(files.read("acme", &kept.id).await.unwrap(), LINE.as_bytes());
        assert_eq!(files.sweep_as_of(later).await.unwrap(), 0);
    }
}
