//! Where a batch's pieces live in the state store, and reading its state back: the record, the
//! cancel mark, the live counts (tallies), each chunk's claim, and the end.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record::{BatchRecord, Counts, Ending, Phase};
use crate::clock::unix_now;
use crate::store::{Store, StoreError, Tally};

/// How long a batch is kept after its window closes.
const KEEP_AFTER: u64 = 30 * 86_400;

/// The key of a tenant's batch record.
pub(crate) fn record_key(tenant: &str, id: &str) -> String {
    format!("turnpike:batch:{tenant}:{id}")
}

/// How long a batch's pieces are kept from now.
pub(crate) fn keep_for(record: &BatchRecord) -> Duration {
    Duration::from_secs(
        (record.expires_at + KEEP_AFTER)
            .saturating_sub(unix_now())
            .max(1),
    )
}

/// The keys of one batch's pieces.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    id: String,
    lapses_at: u64,
    /// Its end (finalizing, then how it ended).
    pub end: String,
    /// The cancel mark.
    pub cancel: String,
    /// Why the batch failed as a whole, when it did.
    pub failed: String,
    /// The finisher's claim.
    pub finisher: String,
}

/// The counters of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    /// Lines answered.
    Completed,
    /// Lines failed.
    Failed,
    /// Chunks handed out.
    Cursor,
    /// Chunks done.
    Done,
}

impl Keys {
    pub(crate) fn new(record: &BatchRecord) -> Self {
        let id = &record.id;
        Self {
            id: id.clone(),
            lapses_at: record.expires_at + KEEP_AFTER,
            end: format!("turnpike:batch-end:{id}"),
            cancel: format!("turnpike:batch-cancel:{id}"),
            failed: format!("turnpike:batch-failed:{id}"),
            finisher: format!("turnpike:batch-finisher:{id}"),
        }
    }

    /// The claim of chunk `k`.
    pub(crate) fn chunk(&self, k: usize) -> String {
        format!("turnpike:batch-chunk:{}:{k}", self.id)
    }

    /// A counter, limited to `limit`.
    pub(crate) fn tally(&self, counter: Counter, limit: Option<u64>) -> Tally {
        let name = match counter {
            Counter::Completed => "completed",
            Counter::Failed => "failed",
            Counter::Cursor => "cursor",
            Counter::Done => "done",
        };
        Tally {
            key: format!("turnpike:batch-n:{}:{name}", self.id),
            limit,
            lapses_at: Some(self.lapses_at),
        }
    }
}

/// What the end key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EndValue {
    /// The result files are being written.
    Finalizing,
    /// Over.
    Ended(Ending),
}

/// A batch's state now.
#[derive(Debug, Clone)]
pub(crate) struct Now {
    pub phase: Phase,
    pub counts: Counts,
    pub cancelled_at: Option<u64>,
}

/// The JSON value under `key` (`what`, for errors), if any.
async fn get_json<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    key: &str,
    what: &str,
) -> Result<Option<T>, StoreError> {
    match store.get(key).await? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError(format!("{what} cannot be read: {e}"))),
    }
}

/// A tenant's batch record, if kept.
pub(crate) async fn load_record(
    store: &dyn Store,
    tenant: &str,
    id: &str,
) -> Result<Option<BatchRecord>, StoreError> {
    get_json(store, &record_key(tenant, id), &format!("batch {id}")).await
}

/// The end, if one was written.
pub(crate) async fn read_end(
    store: &dyn Store,
    keys: &Keys,
) -> Result<Option<EndValue>, StoreError> {
    get_json(store, &keys.end, "a batch's end").await
}

/// Writes the end.
pub(crate) async fn write_end(
    store: &dyn Store,
    record: &BatchRecord,
    value: &EndValue,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(value).map_err(|e| StoreError(e.to_string()))?;
    store
        .put(&Keys::new(record).end, bytes, keep_for(record))
        .await
}

/// When the batch was cancelled, if it was.
pub(crate) async fn cancelled_at(
    store: &dyn Store,
    keys: &Keys,
) -> Result<Option<u64>, StoreError> {
    Ok(store
        .get(&keys.cancel)
        .await?
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| t.parse().ok()))
}

/// Marks a batch cancelled.
pub(crate) async fn mark_cancelled(
    store: &dyn Store,
    record: &BatchRecord,
) -> Result<(), StoreError> {
    let keys = Keys::new(record);
    store
        .put(
            &keys.cancel,
            unix_now().to_string().into_bytes(),
            keep_for(record),
        )
        .await
}

/// Marks a batch failed as a whole: `code` and `message` become its `errors`.
pub(crate) async fn mark_failed(
    store: &dyn Store,
    record: &BatchRecord,
    code: &str,
    message: &str,
) -> Result<(), StoreError> {
    let errors = serde_json::json!({
        "object": "list",
        "data": [{"code": code, "message": message, "param": null, "line": null}],
    });
    store
        .put(
            &Keys::new(record).failed,
            errors.to_string().into_bytes(),
            keep_for(record),
        )
        .await
}

/// Why the batch failed as a whole, if it did (OpenAI's `errors` object).
pub(crate) async fn failure(
    store: &dyn Store,
    keys: &Keys,
) -> Result<Option<serde_json::Value>, StoreError> {
    get_json(store, &keys.failed, "a batch's failure").await
}

/// Whether lines should stop: the batch was cancelled, failed or expired.
pub(crate) async fn stopping(
    store: &dyn Store,
    record: &BatchRecord,
    keys: &Keys,
) -> Result<bool, StoreError> {
    Ok(record.expires_at <= unix_now()
        || cancelled_at(store, keys).await?.is_some()
        || failure(store, keys).await?.is_some())
}

/// The live counts.
pub(crate) async fn counts(store: &dyn Store, keys: &Keys) -> Result<Counts, StoreError> {
    let tallies = [
        keys.tally(Counter::Completed, None),
        keys.tally(Counter::Failed, None),
        keys.tally(Counter::Cursor, None),
    ];
    let charge = store.charge(&tallies, 0).await?;
    let total = |i: usize| charge.totals.get(i).copied().unwrap_or(0);
    Ok(Counts {
        completed: total(0),
        failed: total(1),
        started: total(2) > 0,
    })
}

/// A batch's state as it stands.
pub(crate) async fn read(store: &dyn Store, keys: &Keys) -> Result<Now, StoreError> {
    let cancelled_at = cancelled_at(store, keys).await?;
    let phase = match read_end(store, keys).await? {
        Some(EndValue::Ended(ending)) => Phase::Ended(ending),
        _ if cancelled_at.is_some() => Phase::Cancelling,
        Some(EndValue::Finalizing) => Phase::Finalizing,
        None => Phase::InProgress,
    };
    let counts = match &phase {
        Phase::Ended(_) => Counts::default(),
        _ => counts(store, keys).await?,
    };
    Ok(Now {
        phase,
        counts,
        cancelled_at,
    })
}
