//! The export of usage records to an append-only JSONL file (`spend.usage_file`): a task takes
//! batches from the store's usage log, appends them and syncs the file, then acknowledges
//! them, so a record leaves the log only once it is on disk. On Redis every replica exports
//! through one consumer group (each record to one replica's file), and records a killed
//! replica took but never acknowledged are taken over after 10 s. Delivery is at least
//! once: a replica killed between its write and its acknowledgement writes those records
//! again (their `request_id` tells the repeats apart).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;

/// Records taken per batch.
const BATCH: usize = 500;
/// The wait when the log is empty or the store failed.
const IDLE: Duration = Duration::from_millis(500);

/// Starts exporting `store`'s usage log to `file`.
pub fn spawn(store: Arc<dyn Store>, file: PathBuf) -> tokio::task::JoinHandle<()> {
    let consumer = format!("{}-{}", std::process::id(), crate::ids::new_id(""));
    tokio::spawn(async move {
        loop {
            let batch = match store.usage_drain(&consumer, BATCH).await {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the usage log for export");
                    tokio::time::sleep(IDLE).await;
                    continue;
                }
            };
            if batch.is_empty() {
                tokio::time::sleep(IDLE).await;
                continue;
            }
            let (ids, lines): (Vec<String>, Vec<Vec<u8>>) = batch.into_iter().unzip();
            let path = file.clone();
            let written = tokio::task::spawn_blocking(move || append(&path, &lines)).await;
            match written {
                Ok(Ok(())) => {
                    if let Err(e) = store.usage_ack(&ids).await {
                        tracing::warn!(error = %e, "cannot acknowledge exported usage records");
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, file = %file.display(), "cannot write usage records");
                    tokio::time::sleep(IDLE).await;
                }
                Err(e) => tracing::warn!(error = %e, "the usage export task failed"),
            }
        }
    })
}

fn append(path: &std::path::Path, lines: &[Vec<u8>]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(&out)?;
    file.sync_data()
}
