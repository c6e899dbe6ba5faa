//! The event log of a streamed background response: its events, kept so that the request that
//! created it and any later `GET /v1/responses/{id}?stream=true` (from the start, or after a
//! `starting_after` sequence number) read the same stream, while the generation runs on its own
//! task whoever is reading.
//!
//! A log is bounded by bytes ([`MAX_LOG_BYTES`], and all logs together by [`MAX_TOTAL_BYTES`]):
//! past that it lets its oldest events go, and a reader that needs one of them is told so (an
//! `error` event; `starting_after` a 400). While the response runs, the log is also written to
//! the state store ([`StoredEvents`]) every half second, and once more when it ends, so a reader
//! on another replica follows it there; the running log lives in the process that runs it. The gauge
//! `turnpike_response_event_log_bytes` is what the logs of this process keep.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// Most bytes of events one log keeps.
pub(crate) const MAX_LOG_BYTES: usize = 1 << 20;

/// Most bytes of events every log of this process keeps together; past it, a log that grows
/// lets its own oldest events go.
pub(crate) const MAX_TOTAL_BYTES: usize = 256 << 20;

/// The bytes every log of this process keeps.
static TOTAL_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A log's events as stored when the response ended (or as it began: empty, not `done`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvents {
    /// The sequence number of the first event kept.
    pub first: u64,
    /// The events, each a whole SSE frame (`event: ...\ndata: ...\n\n`).
    pub frames: Vec<String>,
    /// Whether the response had ended.
    pub done: bool,
}

#[derive(Debug, Default)]
struct Kept {
    first: u64,
    frames: VecDeque<Bytes>,
    bytes: usize,
    done: bool,
}

/// A running response's events.
#[derive(Debug)]
pub struct EventLog {
    kept: Mutex<Kept>,
    /// The number of events written so far, and whether the log ended.
    written: watch::Sender<(u64, bool)>,
}

/// Why a reader cannot have the events it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forgotten {
    /// The first event still kept.
    pub first: u64,
}

impl Default for EventLog {
    fn default() -> Self {
        Self {
            kept: Mutex::default(),
            written: watch::Sender::new((0, false)),
        }
    }
}

impl EventLog {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends the next event (its sequence number is the count so far).
    pub fn push(&self, frame: Bytes) {
        let mut kept = self.kept();
        kept.bytes += frame.len();
        TOTAL_BYTES.fetch_add(frame.len(), Ordering::Relaxed);
        kept.frames.push_back(frame);
        while (kept.bytes > MAX_LOG_BYTES || TOTAL_BYTES.load(Ordering::Relaxed) > MAX_TOTAL_BYTES)
            && kept.frames.len() > 1
        {
            if let Some(old) = kept.frames.pop_front() {
                kept.bytes -= old.len();
                TOTAL_BYTES.fetch_sub(old.len(), Ordering::Relaxed);
                kept.first += 1;
            }
        }
        gauge();
        let count = kept.first + kept.frames.len() as u64;
        drop(kept);
        self.written.send_replace((count, false));
    }

    /// Marks the log complete: readers end after its last event.
    pub fn end(&self) {
        let mut kept = self.kept();
        kept.done = true;
        let count = kept.first + kept.frames.len() as u64;
        drop(kept);
        self.written.send_replace((count, true));
    }

    /// How many events were written so far.
    pub fn written(&self) -> u64 {
        self.written.borrow().0
    }

    /// The log as stored.
    pub fn stored(&self) -> StoredEvents {
        let kept = self.kept();
        StoredEvents {
            first: kept.first,
            frames: kept
                .frames
                .iter()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect(),
            done: kept.done,
        }
    }

    /// The events from sequence number `from` on that are written now, or which were forgotten.
    fn from(&self, from: u64) -> Result<Vec<Bytes>, Forgotten> {
        let kept = self.kept();
        if from < kept.first {
            return Err(Forgotten { first: kept.first });
        }
        let skip = usize::try_from(from - kept.first).unwrap_or(usize::MAX);
        Ok(kept.frames.iter().skip(skip).cloned().collect())
    }

    /// Checks that the events from `from` on are still kept.
    pub fn check(&self, from: u64) -> Result<(), Forgotten> {
        self.from(from).map(drop)
    }

    /// Every event from sequence number `from` on, as written, then `data: [DONE]` when the log
    /// ends; a `: keep-alive` comment after `heartbeat` without an event. A reader that falls
    /// behind past what the log keeps gets an `error` event and ends.
    pub fn follow(
        self: Arc<Self>,
        from: u64,
        heartbeat: Duration,
    ) -> impl Stream<Item = Bytes> + Send + 'static {
        let written = self.written.subscribe();
        futures_util::stream::unfold(
            (self, written, from, false),
            move |(log, mut written, next, over)| async move {
                if over {
                    return None;
                }
                loop {
                    let (_, done) = *written.borrow_and_update();
                    match log.from(next) {
                        Err(forgotten) => {
                            let frame = behind(forgotten, next);
                            return Some((frame, (log, written, next, true)));
                        }
                        Ok(frames) if !frames.is_empty() => {
                            let count = frames.len() as u64;
                            let mut batch = Vec::new();
                            for f in frames {
                                batch.extend_from_slice(&f);
                            }
                            let state = (log, written, next + count, false);
                            return Some((Bytes::from(batch), state));
                        }
                        Ok(_) if done => {
                            let end = Bytes::from_static(b"data: [DONE]\n\n");
                            return Some((end, (log, written, next, true)));
                        }
                        Ok(_) => match tokio::time::timeout(heartbeat, written.changed()).await {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => return None,
                            Err(_) => {
                                let beat = Bytes::from_static(b": keep-alive\n\n");
                                return Some((beat, (log, written, next, false)));
                            }
                        },
                    }
                }
            },
        )
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        let bytes = self.kept().bytes;
        TOTAL_BYTES.fetch_sub(bytes, Ordering::Relaxed);
        gauge();
    }
}

fn gauge() {
    metrics::gauge!("turnpike_response_event_log_bytes")
        .set(TOTAL_BYTES.load(Ordering::Relaxed) as f64);
}

/// The event a reader gets, in place of event `at`, when the events it needs were let go.
pub(crate) fn behind(forgotten: Forgotten, at: u64) -> Bytes {
    let error = serde_json::json!({
        "type": "error",
        "sequence_number": at,
        "code": "stream_events_expired",
        "message": format!(
            "This reader fell behind: the stream keeps its events from sequence number {} on. Retrieve the response, or stream it again with starting_after.",
            forgotten.first
        ),
        "param": null,
    });
    super::render::sse_frame(&error)
}

/// The frames of stored events from sequence number `from` on.
pub(crate) fn after(stored: &StoredEvents, from: u64) -> Result<Vec<Bytes>, Forgotten> {
    if from < stored.first {
        return Err(Forgotten {
            first: stored.first,
        });
    }
    let skip = usize::try_from(from - stored.first).unwrap_or(usize::MAX);
    Ok(stored
        .frames
        .iter()
        .skip(skip)
        .map(|f| Bytes::from(f.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    const BEAT: Duration = Duration::from_secs(60);

    fn frame(n: usize) -> Bytes {
        Bytes::from(format!("event: e\ndata: {n}\n\n"))
    }

    #[tokio::test]
    async fn readers_get_every_event_live_and_from_any_point() {
        let log = Arc::new(EventLog::default());
        log.push(frame(0));
        let live = tokio::spawn(Arc::clone(&log).follow(0, BEAT).collect::<Vec<_>>());
        let late = tokio::spawn(Arc::clone(&log).follow(1, BEAT).collect::<Vec<_>>());
        tokio::task::yield_now().await;
        log.push(frame(1));
        log.push(frame(2));
        log.end();
        let joined = |parts: Vec<Bytes>| parts.concat();
        let live = joined(live.await.unwrap_or_default());
        let late = joined(late.await.unwrap_or_default());
        assert_eq!(
            live,
            [
                frame(0),
                frame(1),
                frame(2),
                Bytes::from_static(b"data: [DONE]\n\n")
            ]
            .concat()
        );
        assert_eq!(
            late,
            [frame(1), frame(2), Bytes::from_static(b"data: [DONE]\n\n")].concat()
        );
        let stored = log.stored();
        assert!(stored.done && stored.first == 0 && stored.frames.len() == 3);
        assert_eq!(after(&stored, 2).map(|f| f.len()), Ok(1));
    }

    #[tokio::test]
    async fn a_quiet_log_sends_heartbeats() {
        let log = Arc::new(EventLog::default());
        let mut follower = Box::pin(Arc::clone(&log).follow(0, Duration::from_millis(20)));
        let beat = follower.next().await;
        assert_eq!(beat.as_deref(), Some(&b": keep-alive\n\n"[..]));
        log.push(frame(0));
        assert_eq!(follower.next().await, Some(frame(0)));
    }

    #[tokio::test]
    async fn a_full_log_lets_its_oldest_events_go_and_says_so() {
        let log = Arc::new(EventLog::default());
        let big = Bytes::from(vec![b'x'; MAX_LOG_BYTES / 2 + 1]);
        log.push(big.clone());
        log.push(big.clone());
        log.push(big);
        assert_eq!(log.check(0), Err(Forgotten { first: 2 }));
        assert_eq!(log.check(2), Ok(()));
        log.end();
        let got: Vec<Bytes> = Arc::clone(&log).follow(0, BEAT).collect().await;
        assert_eq!(got.len(), 1);
        assert!(String::from_utf8_lossy(&got[0]).contains("stream_events_expired"));
        assert_eq!(after(&log.stored(), 1), Err(Forgotten { first: 2 }));
    }
}
