//! The batch worker each replica runs: it finds open batches in the shared list, claims their
//! chunks while it has room, runs each chunk's lines at the lowest priority (the engine holds
//! them back while interactive work waits or is in its prompt) and only while the model's
//! engine queue is short (fewer waiting than `concurrency`), and hands a batch whose chunks are all done (or
//! that was cancelled or expired) to [`super::finalize`].
//!
//! Bounded: at most `concurrency` lines run at once (a semaphore) and at most a few chunks are
//! claimed beyond them; the gauge `turnpike_batch_lines_running` shows the lines under way.
//! A claimed chunk runs in [`super::chunk`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Batches;
use super::chunk::Chunk;
use super::record::BatchRecord;
use super::state::{self, Counter, EndValue, Keys};
use crate::lifecycle::Lifecycle;
use crate::store::Begin;

/// How long a claim holds without renewal (a dead replica's chunk is free again after it).
pub(super) const LEASE: Duration = Duration::from_secs(10);
/// How often the worker looks for work when nothing wakes it.
const POLL: Duration = Duration::from_millis(500);
/// How often a batch whose chunks were all handed out is searched for chunks that lapsed.
const SWEEP: Duration = Duration::from_secs(5);

/// How long after start the first sweep of lapsed files runs, and how often after.
const FIRST_SWEEP: Duration = Duration::from_secs(60);
const SWEEP_FILES: Duration = Duration::from_secs(3600);

/// The fingerprint of every claim (a claim's key says what it claims).
pub(super) const CLAIM: &str = "batch-claim";

/// Starts the worker of this replica; it stops when the server is cut.
pub(crate) fn spawn(batches: Arc<Batches>, lifecycle: Lifecycle) {
    tokio::spawn(run(batches, lifecycle));
}

struct Worker {
    batches: Arc<Batches>,
    lifecycle: Lifecycle,
    /// This replica's name on its claims.
    me: Arc<str>,
    permits: Arc<Semaphore>,
    chunks: JoinSet<()>,
    finishing: JoinSet<()>,
    records: HashMap<String, Arc<BatchRecord>>,
    swept: HashMap<String, Instant>,
    open: (u64, Vec<(String, String)>),
}

async fn run(batches: Arc<Batches>, lifecycle: Lifecycle) {
    let permits = Arc::new(Semaphore::new(batches.settings.concurrency));
    let mut worker = Worker {
        me: Arc::from(crate::ids::new_id("replica-")),
        batches,
        lifecycle,
        permits,
        chunks: JoinSet::new(),
        finishing: JoinSet::new(),
        records: HashMap::new(),
        swept: HashMap::new(),
        open: (u64::MAX, Vec::new()),
    };
    let cut = worker.lifecycle.cut_signal();
    tokio::pin!(cut);
    let mut sweep_at = Instant::now() + FIRST_SWEEP;
    loop {
        tokio::select! {
            () = &mut cut => break,
            () = worker.batches.wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
        while worker.chunks.try_join_next().is_some() {}
        while worker.finishing.try_join_next().is_some() {}
        if worker.lifecycle.is_draining() {
            continue;
        }
        if Instant::now() >= sweep_at {
            sweep_at = Instant::now() + SWEEP_FILES;
            let batches = Arc::clone(&worker.batches);
            worker.finishing.spawn(async move {
                if let Err(e) = batches.files.sweep().await {
                    tracing::warn!(error = %e, "files: sweeping lapsed objects failed");
                }
            });
        }
        if let Err(e) = worker.round().await {
            tracing::warn!(error = %e, "batch worker: the state store failed; trying again");
        }
    }
    // Claims of chunks cut short lapse and are run again by another replica.
    worker.chunks.abort_all();
    worker.finishing.abort_all();
}

impl Worker {
    /// Chunks claimed at once: enough that lines waiting for a permit are always at hand
    /// while other chunks finish their last lines.
    fn max_chunks(&self) -> usize {
        let s = self.batches.settings;
        2 * s.concurrency.div_ceil(s.chunk_lines) + 1
    }

    async fn round(&mut self) -> Result<(), String> {
        let revision = self
            .batches
            .open
            .revision()
            .await
            .map_err(|e| e.to_string())?;
        if revision != self.open.0 {
            self.open = self.batches.open.read().await.map_err(|e| e.to_string())?;
            let live: std::collections::HashSet<&String> =
                self.open.1.iter().map(|(_, id)| id).collect();
            self.records.retain(|id, _| live.contains(id));
            self.swept.retain(|id, _| live.contains(id));
        }
        for (tenant, id) in self.open.1.clone() {
            if self.chunks.len() >= self.max_chunks() {
                break;
            }
            self.step(&tenant, &id).await?;
        }
        Ok(())
    }

    async fn record(&mut self, tenant: &str, id: &str) -> Result<Option<Arc<BatchRecord>>, String> {
        if let Some(record) = self.records.get(id) {
            return Ok(Some(Arc::clone(record)));
        }
        let store = &*self.batches.store;
        let Some(record) = state::load_record(store, tenant, id)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let record = Arc::new(record);
        self.records.insert(id.to_string(), Arc::clone(&record));
        Ok(Some(record))
    }

    /// Claims what there is to do of one batch.
    async fn step(&mut self, tenant: &str, id: &str) -> Result<(), String> {
        let Some(record) = self.record(tenant, id).await? else {
            // Its record lapsed: nothing is left to run or to read.
            self.batches.forget(tenant, id).await;
            return Ok(());
        };
        let store = Arc::clone(&self.batches.store);
        let keys = Keys::new(&record);
        if let Some(EndValue::Ended(_)) = state::read_end(&*store, &keys)
            .await
            .map_err(|e| e.to_string())?
        {
            self.batches.forget(tenant, id).await;
            return Ok(());
        }
        let stopped = state::stopping(&*store, &record, &keys)
            .await
            .map_err(|e| e.to_string())?;
        let total = record.chunks.len() as u64;
        if !stopped {
            while self.chunks.len() < self.max_chunks() {
                let cursor = keys.tally(Counter::Cursor, Some(total));
                let charge = store
                    .charge(&[cursor], 1)
                    .await
                    .map_err(|e| e.to_string())?;
                if !charge.allowed {
                    break;
                }
                let k = charge
                    .totals
                    .first()
                    .copied()
                    .unwrap_or(1)
                    .saturating_sub(1) as usize;
                self.try_claim(&record, &keys, k).await?;
            }
            if self.chunks.len() < self.max_chunks() && self.sweep_due(id) {
                for k in 0..record.chunks.len() {
                    if self.chunks.len() >= self.max_chunks() {
                        break;
                    }
                    self.try_claim(&record, &keys, k).await?;
                }
            }
        }
        let done = store
            .charge(&[keys.tally(Counter::Done, None)], 0)
            .await
            .map_err(|e| e.to_string())?
            .totals
            .first()
            .copied()
            .unwrap_or(0);
        if (stopped || done >= total) && self.finishing.len() < self.max_chunks() {
            let batches = Arc::clone(&self.batches);
            let me = Arc::clone(&self.me);
            self.finishing.spawn(async move {
                if let Err(e) = super::finalize::finalize(&batches, &record, &me).await {
                    tracing::warn!(batch = %record.id, error = %e, "batch: writing the results failed; trying again");
                }
            });
        }
        Ok(())
    }

    fn sweep_due(&mut self, id: &str) -> bool {
        let now = Instant::now();
        match self.swept.get(id) {
            Some(at) if now.duration_since(*at) < SWEEP => false,
            _ => {
                self.swept.insert(id.to_string(), now);
                true
            }
        }
    }

    async fn try_claim(
        &mut self,
        record: &Arc<BatchRecord>,
        keys: &Keys,
        k: usize,
    ) -> Result<(), String> {
        let claim = keys.chunk(k);
        let begun = self
            .batches
            .store
            .begin(&claim, CLAIM, &self.me, LEASE)
            .await
            .map_err(|e| e.to_string())?;
        if begun == Begin::Started {
            let chunk = Chunk {
                batches: Arc::clone(&self.batches),
                record: Arc::clone(record),
                k,
                claim,
                me: Arc::clone(&self.me),
                permits: Arc::clone(&self.permits),
            };
            self.chunks.spawn(chunk.run());
        }
        Ok(())
    }
}
