//! The live side of an idempotent request: one generation, any number of listeners. The
//! original client and every client that joins with the same key read the same chunks; the
//! chunks are kept (up to a byte limit) so a late joiner starts from the beginning, and so the
//! finished response can be stored for replay. When the last listener leaves before the end,
//! the generation is dropped, which cancels the engine work; a stream (server-sent events)
//! first waits out its resume window, so a client that lost its connection can come back
//! with `Last-Event-ID` and read on ([`super::resume`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

/// Chunks buffered per listener before the generation waits for it.
const LISTENER_BUFFER: usize = 64;

/// How often a hub looks whether anyone still listens.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// How a pumped response ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every chunk was read; the chunks, unless they outgrew the limit.
    Completed {
        /// The response failed (its status, or an error event mid-stream).
        failed: bool,
        /// The chunks as text, when kept.
        chunks: Option<Vec<String>>,
    },
    /// Every listener left first, or the body failed.
    Cancelled,
}

#[derive(Debug, Default)]
struct State {
    kept: Vec<Bytes>,
    kept_bytes: usize,
    overflow: bool,
    listeners: Vec<mpsc::Sender<Bytes>>,
    ended: bool,
    /// Every listener left (or the body failed) before the end: the work is being dropped, no
    /// one may join.
    deserted: bool,
}

/// Marks a response whose work goes on without its readers (a background response's stream):
/// when every listener left, the hub keeps recording it to its end, so a retry with the same key
/// replays it instead of starting the work a second time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Detached;

/// A response being produced for one or more listeners.
#[derive(Debug)]
pub(crate) struct Hub {
    state: Mutex<State>,
    head: watch::Sender<Option<(StatusCode, HeaderMap)>>,
    max_bytes: usize,
    /// How long a stream goes on with no listener, for one to resume it.
    resume_window: Duration,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Updates under the lock are plain pushes and flags: a poisoned lock is consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A listener: the chunks so far, then the live ones.
#[derive(Debug)]
pub(crate) struct Listener {
    head: watch::Receiver<Option<(StatusCode, HeaderMap)>>,
    backlog: Vec<Bytes>,
    rx: mpsc::Receiver<Bytes>,
}

impl Hub {
    /// A hub that keeps at most `max_bytes` of chunks, and keeps a stream going for
    /// `resume_window` once no one listens.
    pub(crate) fn new(max_bytes: usize, resume_window: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            head: watch::Sender::new(None),
            max_bytes,
            resume_window,
        })
    }

    /// A new listener, or `None` when the start of the response is no longer kept.
    pub(crate) fn listen(&self) -> Option<Listener> {
        let mut state = lock(&self.state);
        if state.overflow || state.deserted {
            return None;
        }
        let (tx, rx) = mpsc::channel(LISTENER_BUFFER);
        if !state.ended {
            state.listeners.push(tx);
        }
        Some(Listener {
            head: self.head.subscribe(),
            backlog: state.kept.clone(),
            rx,
        })
    }

    /// Pumps `response` to the listeners until it ends or they all leave. `keep_alive` runs
    /// every `tick` while it lasts (to extend the store's lease).
    pub(crate) async fn pump(
        &self,
        response: Response,
        tick: Duration,
        mut keep_alive: impl FnMut() -> futures_util::future::BoxFuture<'static, ()>,
    ) -> Ended {
        let failed_flag = response.extensions().get::<StreamFailed>().cloned();
        let detached = response.extensions().get::<Detached>().is_some();
        let status = response.status();
        let (parts, body) = response.into_parts();
        let resumable =
            !self.resume_window.is_zero() && super::resume::is_stream(parts.status, &parts.headers);
        self.head.send_replace(Some((parts.status, parts.headers)));
        let mut alone_since: Option<Instant> = None;
        let mut body = body.into_data_stream();
        let mut ticker = tokio::time::interval(tick.max(Duration::from_millis(50)));
        ticker.tick().await;
        let mut check = tokio::time::interval(CHECK_EVERY);
        let ended = loop {
            tokio::select! {
                chunk = body.next() => match chunk {
                    Some(Ok(bytes)) => {
                        if !self.deliver(bytes).await && !detached && !resumable {
                            break Ended::Cancelled;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "an idempotent response's body failed");
                        break Ended::Cancelled;
                    }
                    None => {
                        let failed = status.is_server_error()
                            || failed_flag.as_ref().is_some_and(|f| f.0.load(Ordering::Relaxed));
                        break Ended::Completed { failed, chunks: self.kept_text() };
                    }
                },
                _ = ticker.tick() => keep_alive().await,
                _ = check.tick() => {
                    if detached || self.anyone_listening() {
                        alone_since = None;
                    } else if !resumable || self.overflowed() {
                        break Ended::Cancelled;
                    } else if alone_since.get_or_insert_with(Instant::now).elapsed()
                        >= self.resume_window
                    {
                        // No one came back: the work is dropped, as for any stream left.
                        break Ended::Cancelled;
                    }
                }
            }
        };
        let mut state = lock(&self.state);
        state.ended = true;
        // A run cut short is no answer to join: a later joiner waits for the key to be let go
        // and runs the request itself.
        state.deserted |= ended == Ended::Cancelled;
        state.listeners.clear();
        ended
    }

    /// Completes once no listener is left (checked every [`CHECK_EVERY`]), for a response not
    /// yet started; from then on no one may join.
    pub(crate) async fn deserted(&self) {
        let mut check = tokio::time::interval(CHECK_EVERY);
        loop {
            check.tick().await;
            let mut state = lock(&self.state);
            if !listening(&mut state) {
                state.deserted = true;
                return;
            }
        }
    }

    /// Whether the start of the response is no longer kept (no one can join or resume).
    fn overflowed(&self) -> bool {
        lock(&self.state).overflow
    }

    fn anyone_listening(&self) -> bool {
        listening(&mut lock(&self.state))
    }

    /// Keeps and sends one chunk; `false` when no listener is left.
    async fn deliver(&self, bytes: Bytes) -> bool {
        let listeners = {
            let mut state = lock(&self.state);
            let heartbeat = bytes.starts_with(b":");
            if !state.overflow && !heartbeat {
                if state.kept_bytes + bytes.len() > self.max_bytes {
                    state.overflow = true;
                    state.kept = Vec::new();
                } else {
                    state.kept_bytes += bytes.len();
                    state.kept.push(bytes.clone());
                }
            }
            state.listeners.clone()
        };
        let mut alive = 0;
        for listener in &listeners {
            if listener.send(bytes.clone()).await.is_ok() {
                alive += 1;
            }
        }
        alive > 0 || self.anyone_listening()
    }

    fn kept_text(&self) -> Option<Vec<String>> {
        let state = lock(&self.state);
        if state.overflow {
            return None;
        }
        state
            .kept
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).ok())
            .collect()
    }
}

/// Whether any listener is left (those that went away are dropped).
fn listening(state: &mut State) -> bool {
    state.listeners.retain(|l| !l.is_closed());
    !state.listeners.is_empty()
}

impl Listener {
    /// The response this listener reads, once the head is known (`None` if the producer
    /// vanished first).
    pub(crate) async fn into_response(mut self) -> Option<(StatusCode, HeaderMap, Body)> {
        let head = self.head.wait_for(Option::is_some).await.ok()?.clone()?;
        let backlog = futures_util::stream::iter(self.backlog.into_iter().map(Ok));
        let live = futures_util::stream::unfold(self.rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        });
        Some((head.0, head.1, Body::from_stream(backlog.chain(live))))
    }
}

/// Set when a streamed response ended with an error event (its status was already 200), so a
/// recorder of the response knows it did not succeed.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamFailed(pub std::sync::Arc<std::sync::atomic::AtomicBool>);
