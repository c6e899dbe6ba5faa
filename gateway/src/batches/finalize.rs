//! A batch's end: one replica claims the finish, waits for chunks still running, marks the
//! chunks that never ran (a cancelled, failed or expired batch), and writes the output and
//! error files from the chunks' results in line order. Lines an expired batch never ran are
//! written to the error file as `batch_expired`, as OpenAI does; a batch whose input file was
//! deleted under it fails, with `errors` saying so.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;

use super::Batches;
use super::line::expired_line;
use super::part;
use super::record::{BatchRecord, Ending};
use super::state::{self, EndValue, Keys};
use super::worker::{CLAIM, LEASE};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::files::lines::{parse_line, spans};
use crate::store::Begin;

/// What a chunk that never ran is marked with.
const SKIPPED: &str = r#"{"skipped":true}"#;

/// Ends `record` if no other replica is ending it; `me` names this replica on the claim.
pub(super) async fn finalize(
    batches: &Batches,
    record: &BatchRecord,
    me: &str,
) -> Result<(), ApiError> {
    let store = &*batches.store;
    let keys = Keys::new(record);
    let unavailable = |e: crate::store::StoreError| batches.unavailable(e);
    if store
        .begin(&keys.finisher, CLAIM, me, LEASE)
        .await
        .map_err(unavailable)?
        != Begin::Started
    {
        return Ok(());
    }
    let result = write_results(batches, record, &keys, me).await;
    if result.is_err() {
        let _ = store.abandon(&keys.finisher, me).await;
    }
    result
}

async fn write_results(
    batches: &Batches,
    record: &BatchRecord,
    keys: &Keys,
    me: &str,
) -> Result<(), ApiError> {
    let store = &*batches.store;
    let unavailable = |e: crate::store::StoreError| batches.unavailable(e);
    let (mut completed, mut failed, mut unrun) = (0u64, 0u64, 0u64);
    let stopping = state::stopping(store, record, keys)
        .await
        .map_err(unavailable)?;
    for k in 0..record.chunks.len() {
        let lines = chunk_lines(record, k);
        loop {
            match store
                .begin(&keys.chunk(k), CLAIM, me, LEASE)
                .await
                .map_err(unavailable)?
            {
                Begin::Started if !stopping => {
                    // A chunk no one runs (its replica died after another counted it done):
                    // it is left for the workers, and the batch is finished later.
                    let _ = store.abandon(&keys.chunk(k), me).await;
                    let _ = store.abandon(&keys.finisher, me).await;
                    return Ok(());
                }
                Begin::Started => {
                    // Never run, or its replica died: no one runs it now. Lines its replica
                    // answered before it died are kept.
                    store
                        .finish(&keys.chunk(k), me, SKIPPED.into(), state::keep_for(record))
                        .await
                        .map_err(unavailable)?;
                    let (ok, not_ok) = answered(batches, record, k).await?;
                    (completed, failed) = (completed + ok, failed + not_ok);
                    unrun += lines.saturating_sub(ok + not_ok);
                    break;
                }
                Begin::Done(body) => {
                    let summary: Summary = serde_json::from_slice(&body).unwrap_or_default();
                    let (ok, not_ok) = if summary.skipped {
                        answered(batches, record, k).await?
                    } else {
                        (summary.completed, summary.failed)
                    };
                    (completed, failed) = (completed + ok, failed + not_ok);
                    unrun += lines.saturating_sub(ok + not_ok);
                    break;
                }
                Begin::Running | Begin::Conflict => {
                    // A replica is still running it: wait for its results.
                    store
                        .keep(&keys.finisher, me, LEASE)
                        .await
                        .map_err(unavailable)?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    let cancelled = state::cancelled_at(store, keys)
        .await
        .map_err(unavailable)?;
    let failure = state::failure(store, keys).await.map_err(unavailable)?;
    let expired =
        cancelled.is_none() && failure.is_none() && (unrun > 0 || record.expires_at <= unix_now());
    if cancelled.is_none() {
        state::write_end(store, record, &EndValue::Finalizing)
            .await
            .map_err(unavailable)?;
    }
    // An expired batch's lines that never ran are errors; a cancelled one's are left out.
    let failed = if expired { failed + unrun } else { failed };
    let output_file_id = write_file(batches, record, Kind::Output, completed).await?;
    store
        .keep(&keys.finisher, me, LEASE)
        .await
        .map_err(unavailable)?;
    let errors = Kind::Errors { expired };
    let error_file_id = write_file(batches, record, errors, failed).await?;
    let status = match (cancelled.is_some(), failure.is_some(), expired) {
        (true, _, _) => "cancelled",
        (false, true, _) => "failed",
        (false, false, true) => "expired",
        (false, false, false) => "completed",
    };
    let ending = Ending {
        status: status.into(),
        at: unix_now(),
        output_file_id,
        error_file_id,
        completed,
        failed,
        errors: failure,
    };
    state::write_end(store, record, &EndValue::Ended(ending))
        .await
        .map_err(unavailable)?;
    store
        .finish(
            &keys.finisher,
            me,
            status.as_bytes().to_vec(),
            state::keep_for(record),
        )
        .await
        .map_err(unavailable)?;
    metrics::counter!("turnpike_batches_ended_total", "status" => status).increment(1);
    let tenant = &record.owner.tenant;
    tracing::info!(batch = %record.id, tenant = %tenant, status, completed, failed, "batch ended");
    batches.forget(tenant, &record.id).await;
    batches
        .files
        .delete_parts(tenant, &record.id, record.chunks.len())
        .await;
    Ok(())
}

/// What a done chunk's claim holds.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Summary {
    completed: u64,
    failed: u64,
    skipped: bool,
}

/// The lines of chunk `k` its results hold: (answered, failed).
async fn answered(
    batches: &Batches,
    record: &BatchRecord,
    k: usize,
) -> Result<(u64, u64), ApiError> {
    let tenant = &record.owner.tenant;
    let answers = part::decode(&batches.files.read_part(tenant, &record.id, k).await?);
    let ok = answers.iter().filter(|a| a.ok).count() as u64;
    Ok((ok, answers.len() as u64 - ok))
}

/// The lines of chunk `k`.
fn chunk_lines(record: &BatchRecord, k: usize) -> u64 {
    let size = record.chunk_lines as u64;
    record.total.saturating_sub(k as u64 * size).min(size)
}

/// Which result file.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Answered lines.
    Output,
    /// Failed lines, with the lines never run when the batch expired.
    Errors { expired: bool },
}

/// One chunk's lines of one result file.
async fn piece(
    batches: &Batches,
    record: &BatchRecord,
    k: usize,
    kind: Kind,
) -> Result<Bytes, ApiError> {
    let tenant = &record.owner.tenant;
    let answers = part::decode(&batches.files.read_part(tenant, &record.id, k).await?);
    let want_ok = matches!(kind, Kind::Output);
    let mut out = Vec::new();
    for answer in answers.iter().filter(|a| a.ok == want_ok) {
        out.extend_from_slice(&answer.text);
        out.push(b'\n');
    }
    let answered: HashSet<usize> = answers.iter().map(|a| a.index).collect();
    if let Kind::Errors { expired: true } = kind {
        let (start, end) = record.chunks[k];
        let input = batches
            .files
            .range(tenant, &record.input_file_id, start, end)
            .await?;
        for (i, (s, e)) in spans(&input).enumerate() {
            if !answered.contains(&i) {
                let custom_id = parse_line(&input[s..e], 0)
                    .map(|l| l.custom_id)
                    .unwrap_or_default();
                out.extend_from_slice(&expired_line(&custom_id));
                out.push(b'\n');
            }
        }
    }
    Ok(Bytes::from(out))
}

/// Writes a result file of `lines` lines, chunk by chunk in line order (one chunk's results
/// in memory at a time); none when there are no lines.
async fn write_file(
    batches: &Batches,
    record: &BatchRecord,
    kind: Kind,
    lines: u64,
) -> Result<Option<String>, ApiError> {
    if lines == 0 {
        return Ok(None);
    }
    let name = match kind {
        Kind::Output => "output",
        Kind::Errors { .. } => "error",
    };
    let name = format!("{}_{name}.jsonl", record.id);
    let parts = futures_util::stream::unfold(0usize, |k| async move {
        if k >= record.chunks.len() {
            return None;
        }
        Some((piece(batches, record, k, kind).await, k + 1))
    });
    let meta = batches
        .files
        .write(&record.owner.tenant, &name, "batch_output", parts)
        .await?;
    Ok(Some(meta.id))
}
