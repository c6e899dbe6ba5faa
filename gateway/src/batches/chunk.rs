//! One claimed chunk of a batch: its lines run (each when a permit and the engine's room allow),
//! and every answer is written to the chunk's results as it comes, so a replica that takes the
//! chunk over from one that died runs only the lines that had no answer yet. The chunk is
//! counted done once its last line is answered, or when the batch stops (cancelled, failed,
//! expired) with the lines answered so far.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;

use super::Batches;
use super::line::{self, Answer};
use super::part::{self, Answered};
use super::record::BatchRecord;
use super::state::{self, Counter, Keys};
use super::worker::LEASE;
use crate::error::ApiError;
use crate::files::lines::{InputLine, parse_line, spans};
use crate::tenancy::Caller;

/// How often a claim is renewed.
const RENEW: Duration = Duration::from_secs(3);
/// How often a running chunk checks whether its batch stopped.
const STOP_CHECK: Duration = Duration::from_millis(500);
/// How often a line waiting for room looks again.
const ROOM_CHECK: Duration = Duration::from_millis(5);

/// One claimed chunk of a batch.
pub(super) struct Chunk {
    pub(super) batches: Arc<Batches>,
    pub(super) record: Arc<BatchRecord>,
    pub(super) k: usize,
    pub(super) claim: String,
    pub(super) me: Arc<str>,
    pub(super) permits: Arc<Semaphore>,
}

impl Chunk {
    /// Runs the chunk under its renewed claim; a chunk that cannot finish is given back.
    pub(super) async fn run(self) {
        let work = self.lines();
        tokio::pin!(work);
        let mut renew = tokio::time::interval(RENEW);
        let results = loop {
            tokio::select! {
                results = &mut work => break results,
                _ = renew.tick() => {
                    let _ = self.batches.store.keep(&self.claim, &self.me, LEASE).await;
                }
            }
        };
        let outcome = match results {
            Ok(results) => self.finish(&results).await,
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            tracing::warn!(batch = %self.record.id, chunk = self.k, error = %e, "batch: a chunk is left for another try");
            let _ = self.batches.store.abandon(&self.claim, &self.me).await;
        }
    }

    /// The chunk's input lines; none when the input file is gone (the batch then fails).
    async fn input(&self) -> Result<bytes::Bytes, String> {
        let record = &*self.record;
        let (start, end) = record.chunks.get(self.k).copied().unwrap_or((0, 0));
        let files = &self.batches.files;
        match files
            .range(&record.owner.tenant, &record.input_file_id, start, end)
            .await
        {
            Ok(bytes) => Ok(bytes),
            Err(ApiError::NotFound { .. }) => {
                let message = format!("The input file '{}' was deleted.", record.input_file_id);
                state::mark_failed(&*self.batches.store, record, "file_not_found", &message)
                    .await
                    .map_err(|e| e.to_string())?;
                self.batches.wake.notify_one();
                Ok(bytes::Bytes::new())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs the lines not answered yet until all are, or the batch stops; every answer so far.
    async fn lines(&self) -> Result<Vec<Answered>, String> {
        let record = &*self.record;
        let tenant = &record.owner.tenant;
        let bytes = self.input().await?;
        // What a replica that held this chunk before wrote.
        let earlier = self
            .batches
            .files
            .read_part(tenant, &record.id, self.k)
            .await
            .map_err(|e| e.to_string())?;
        let mut results = part::decode(&earlier);
        let answered: HashSet<usize> = results.iter().map(|a| a.index).collect();
        let caller = line::caller(&self.batches, &record.owner, &record.id);
        let first = self.k * record.chunk_lines;
        let mut pending = FuturesUnordered::new();
        for (i, (s, e)) in spans(&bytes).enumerate() {
            if answered.contains(&i) {
                continue;
            }
            let parsed = parse_line(&bytes[s..e], (first + i + 1) as u64);
            let caller = caller.clone();
            pending.push(async move {
                let (ok, text) = match (parsed, caller) {
                    (Err(m), _) => (false, line::error_line("", &ApiError::invalid("file", m))),
                    (Ok(l), Err(e)) => (false, line::error_line(&l.custom_id, &e)),
                    (Ok(l), Ok(caller)) => self.run_line(&caller, l).await,
                };
                Answered { index: i, ok, text }
            });
        }
        let mut check = tokio::time::interval(STOP_CHECK);
        loop {
            tokio::select! {
                next = pending.next() => match next {
                    Some(answer) => {
                        results.push(answer);
                        // Written as it comes: a replica that takes over does not run it again.
                        let body = part::encode(&results);
                        let files = &self.batches.files;
                        if let Err(e) = files.put_part(tenant, &record.id, self.k, body.into()).await {
                            tracing::warn!(batch = %record.id, error = %e, "batch: an answer is kept in memory until the chunk ends");
                        }
                    }
                    None => break,
                },
                _ = check.tick() => {
                    if self.stopped().await {
                        // Lines under way are dropped, which cancels their engine work.
                        break;
                    }
                }
            }
        }
        Ok(results)
    }

    async fn stopped(&self) -> bool {
        let keys = Keys::new(&self.record);
        matches!(
            state::stopping(&*self.batches.store, &self.record, &keys).await,
            Ok(true)
        )
    }

    /// Runs one line when a permit and the engine's room allow, again after a limit's wait.
    async fn run_line(&self, caller: &Caller, line: InputLine) -> (bool, Vec<u8>) {
        let batches = &self.batches;
        let endpoint = &self.record.endpoint;
        let model = line
            .body
            .get("model")
            .and_then(|m| m.as_str())
            .unwrap_or("")
            .to_string();
        loop {
            let Ok(permit) = self.permits.acquire().await else {
                return (false, Vec::new());
            };
            // A queue as long as this replica's own batch lines is one interactive work made.
            let short = batches.settings.concurrency as u64;
            while !batches.generator.has_room(&model, short) {
                tokio::time::sleep(ROOM_CHECK).await;
            }
            let running = Running::start();
            let answer = line::run(batches, caller, endpoint, line.clone()).await;
            drop(running);
            match answer {
                Answer::Line { ok, text } => {
                    let outcome = if ok { "ok" } else { "failed" };
                    metrics::counter!("turnpike_batch_lines_total", "outcome" => outcome)
                        .increment(1);
                    return (ok, text);
                }
                Answer::Later(wait) => {
                    drop(permit);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Writes the chunk's results, counts them and marks the chunk done.
    async fn finish(&self, results: &[Answered]) -> Result<(), String> {
        let record = &*self.record;
        let body = part::encode(results);
        let completed = results.iter().filter(|a| a.ok).count() as u64;
        let failed = results.len() as u64 - completed;
        let files = &self.batches.files;
        files
            .put_part(&record.owner.tenant, &record.id, self.k, body.into())
            .await
            .map_err(|e| e.to_string())?;
        let store = &self.batches.store;
        let keys = Keys::new(record);
        let tallies = [
            keys.tally(Counter::Completed, None),
            keys.tally(Counter::Failed, None),
        ];
        // Counts are live progress; the final counts come from the results themselves.
        let _ = store.charge(&tallies[..1], completed).await;
        let _ = store.charge(&tallies[1..], failed).await;
        let summary = serde_json::json!({"completed": completed, "failed": failed}).to_string();
        store
            .finish(
                &self.claim,
                &self.me,
                summary.into_bytes(),
                state::keep_for(record),
            )
            .await
            .map_err(|e| e.to_string())?;
        let _ = store.charge(&[keys.tally(Counter::Done, None)], 1).await;
        self.batches.wake.notify_one();
        Ok(())
    }
}

/// One line under way, counted by the gauge until it ends or is dropped.
struct Running;

impl Running {
    fn start() -> Self {
        metrics::gauge!("turnpike_batch_lines_running").increment(1.0);
        Self
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        metrics::gauge!("turnpike_batch_lines_running").decrement(1.0);
    }
}
