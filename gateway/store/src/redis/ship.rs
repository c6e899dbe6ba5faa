//! The usage journal's shipper: one task per journal reads its frames in order and sends them to
//! Redis, up to [`MOST_FRAMES`] requests' ends per `settle.lua` call, merged ([`merge`]) and
//! guarded by the journal's mark (see [`super::journal`]). It starts from the mark Redis holds,
//! so a restart sends only what Redis lacks; a call that fails is sent again after a pause, and
//! the frames wait in the file. Woken by an append, it lingers a moment so that a burst ships
//! in one call.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::journal::merge::merge;
use super::journal::{HEADER, Journal};
use super::settle::{Guard, invocation};
use super::{RedisStore, integer};
use crate::{Settlement, StoreError};

/// Most frames in one call.
const MOST_FRAMES: usize = 512;
/// A shipped file starts again once it is this large.
const RESTART_AT: u64 = 4 << 20;
/// Longest pause after a failure.
const MOST_BACKOFF: Duration = Duration::from_secs(5);
/// Longest sleep without an append (a safety net; appends wake the shipper).
const IDLE: Duration = Duration::from_secs(1);
/// The wait after a wake-up, for the appends that follow it: at most one call per 20 ms while
/// requests trickle in (a call per few requests cost the gateway more CPU time than the records
/// themselves), at the price of sums and refunds that reach Redis up to that much later.
const LINGER: Duration = Duration::from_millis(20);

/// The mark Redis holds for `key` (0: none), read until Redis answers.
async fn mark(store: &RedisStore, key: &str, backoff: &mut Backoff) -> u64 {
    loop {
        let command = redis::cmd("GET").arg(key).to_owned();
        match store.query::<Option<u64>>(command, "journal mark").await {
            Ok(mark) => return mark.unwrap_or(0),
            Err(e) => backoff.wait("read the usage journal's mark", &e).await,
        }
    }
}

/// Ships `journal` to `store` for the life of the process.
pub(crate) async fn ship(store: RedisStore, journal: Arc<Journal>) {
    let key = journal.mark_key();
    let mut backoff = Backoff::default();
    let mut shipped = mark(&store, &key, &mut backoff).await;
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
        let (frames, next) = match journal.read(file, pos, MOST_FRAMES) {
            Ok(read) => read,
            Err(e) => {
                backoff
                    .wait("read the usage journal", &StoreError(e.to_string()))
                    .await;
                continue;
            }
        };
        let frames: Vec<_> = frames.into_iter().filter(|f| f.0 > shipped).collect();
        let (Some(first), Some(last)) = (frames.first().map(|f| f.0), frames.last().map(|f| f.0))
        else {
            if next != pos {
                pos = next;
                continue;
            }
            if let Some(start) = journal.restart_if_shipped(pos, RESTART_AT) {
                (pos, reader) = (start, None);
                continue;
            }
            if tokio::time::timeout(IDLE, journal.wake.notified())
                .await
                .is_ok()
            {
                tokio::time::sleep(LINGER).await;
            }
            continue;
        };
        let guard = Guard {
            mark: key.clone(),
            first,
            last,
        };
        let batch: Vec<Settlement> = frames.into_iter().map(|f| f.1).collect();
        let (keys, args) = invocation(merge(batch), Some(guard));
        let sent = store.run(&store.scripts.settle, &keys, args).await;
        match sent.and_then(|reply| integer(&reply)) {
            // The mark lies inside the batch (an earlier send of part of it landed late).
            Ok(-1) => shipped = mark(&store, &key, &mut backoff).await,
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

    /// Appends a settlement with a usage record to the journal, whole (its unused tokens and
    /// spend ship with its record); the settlement back when there is no journal, no record
    /// (nothing waits on it: it goes to Redis at once) or the journal cannot take it.
    pub(super) fn journaled(&self, settlement: Settlement) -> Option<Settlement> {
        match &self.journal {
            Some(journal) if settlement.record.is_some() && journal.append(&settlement) => None,
            _ => Some(settlement),
        }
    }

    /// Waits up to `within` for the journal, if any, to ship what it holds; whether it did.
    pub(super) async fn flush_journal(&self, within: Duration) -> bool {
        match &self.journal {
            Some(journal) => flush(journal, within).await,
            None => true,
        }
    }
}
