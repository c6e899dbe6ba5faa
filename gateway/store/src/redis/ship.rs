//! The usage journal's shipper: one task per journal reads its frames in order and sends them to
//! Redis, up to [`MAX_BATCH`] records per `settle.lua` call, each with the journal's mark (see
//! [`super::journal`]). It starts from the mark Redis holds, so a restart sends only what Redis
//! lacks; a call that fails is sent again after a pause, and the records wait in the file.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::RedisStore;
use super::batch::MAX_BATCH;
use super::journal::{HEADER, Journal};
use super::settle::invocation;
use crate::{Settlement, StoreError};

/// A shipped file starts again once it is this large.
const RESTART_AT: u64 = 4 << 20;
/// Longest pause after a failure.
const MOST_BACKOFF: Duration = Duration::from_secs(5);
/// Longest sleep without an append (a safety net; appends wake the shipper).
const IDLE: Duration = Duration::from_secs(1);

/// Ships `journal` to `store` for the life of the process.
pub(crate) async fn ship(store: RedisStore, journal: Arc<Journal>) {
    let key = journal.mark_key();
    let mut backoff = Backoff::default();
    let mut shipped = loop {
        match store
            .query::<Option<u64>>(redis::cmd("GET").arg(&key).clone(), "journal mark")
            .await
        {
            Ok(mark) => break mark.unwrap_or(0),
            Err(e) => backoff.wait("read the usage journal's mark", &e).await,
        }
    };
    journal.shipped.store(shipped, Ordering::Relaxed);
    let mut pos = HEADER;
    let mut reader = None;
    loop {
        if reader.is_none() {
            match journal.reader() {
                Ok(file) => reader = Some(file),
                Err(e) => {
                    backoff
                        .wait("open the usage journal", &StoreError(e.to_string()))
                        .await;
                    continue;
                }
            }
        }
        let Some(file) = &reader else { continue };
        let (frames, next) = match journal.read(file, pos, MAX_BATCH) {
            Ok(read) => read,
            Err(e) => {
                backoff
                    .wait("read the usage journal", &StoreError(e.to_string()))
                    .await;
                continue;
            }
        };
        let frames: Vec<_> = frames.into_iter().filter(|f| f.0 > shipped).collect();
        if frames.is_empty() {
            if next != pos {
                pos = next;
                continue;
            }
            if let Some(start) = journal.restart_if_shipped(pos, RESTART_AT) {
                (pos, reader) = (start, None);
                continue;
            }
            let _ = tokio::time::timeout(IDLE, journal.wake.notified()).await;
            continue;
        }
        let last = frames.last().map_or(shipped, |f| f.0);
        let batch = frames.into_iter().map(|(seq, record)| {
            let settlement = Settlement {
                record: Some(record),
                ..Settlement::default()
            };
            (settlement, Some((key.clone(), seq)))
        });
        let (keys, args) = invocation(batch);
        match store.run(&store.scripts.settle, &keys, args).await {
            Ok(_) => {
                (pos, shipped) = (next, last);
                journal.shipped.store(shipped, Ordering::Relaxed);
                crate::gauges::usage_journal_waiting(journal.last().saturating_sub(shipped));
                backoff = Backoff::default();
            }
            Err(e) => backoff.wait("ship usage records", &e).await,
        }
    }
}

/// Waits until `journal` has shipped what it held when called, or `within` passes; whether it
/// did.
pub(crate) async fn flush(journal: &Journal, within: Duration) -> bool {
    let target = journal.last();
    let deadline = tokio::time::Instant::now() + within;
    while journal.shipped.load(Ordering::Relaxed) < target {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Pauses after failures, doubling to [`MOST_BACKOFF`].
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(100))
    }
}

impl Backoff {
    async fn wait(&mut self, what: &str, e: &StoreError) {
        tracing::warn!(error = %e, retry_ms = self.0.as_millis() as u64, "cannot {what}; the records wait in the journal");
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(MOST_BACKOFF);
    }
}

impl RedisStore {
    /// The same store, writing usage records to the journal at `path` (at most `max_bytes`)
    /// and shipping them from there; needs a Tokio runtime for the shipper.
    pub fn with_journal(mut self, path: &Path, max_bytes: u64) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError(format!("the usage journal's shipper needs a runtime: {e}")))?;
        let journal = Arc::new(Journal::open(path, max_bytes)?);
        runtime.spawn(ship(self.clone(), Arc::clone(&journal)));
        tracing::info!(journal = %path.display(), last = journal.last(), "usage records go through the journal");
        self.journal = Some(journal);
        Ok(self)
    }

    /// A settlement with its record appended to the journal: the rest (unused tokens and spend)
    /// goes to Redis in the background, since nothing waits on it. The settlement back when
    /// there is no journal, no record or the journal cannot take it.
    pub(super) fn journaled(&self, mut settlement: Settlement) -> Option<Settlement> {
        let (Some(journal), Some(record)) = (&self.journal, &settlement.record) else {
            return Some(settlement);
        };
        if !journal.append(record) {
            return Some(settlement);
        }
        settlement.record = None;
        if !settlement.is_empty() {
            let store = self.clone();
            tokio::spawn(async move {
                if let Err(e) = store.batched::<super::settle::Settles>(settlement).await {
                    tracing::warn!(error = %e, "cannot give back a request's unused tokens or spend");
                }
            });
        }
        None
    }

    /// Waits up to `within` for the journal, if any, to ship what it holds; whether it did.
    pub(super) async fn flush_journal(&self, within: Duration) -> bool {
        match &self.journal {
            Some(journal) => flush(journal, within).await,
            None => true,
        }
    }
}
