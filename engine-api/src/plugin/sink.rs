//! The plugin side of a request's sink.
//!
//! The raw sink lives in a shared cell that the SDK's `submit` wrapper and the engine's [`Sink`]
//! both hold. The cell moves through `Open -> Finished` (the FINAL went out) or `Open -> Refused`
//! (submit failed: no event may go out), and whoever drops the last reference calls `release`.
//! That makes the contract hold whatever the engine does: finish, drop the sink, panic, or move
//! it to a thread and then refuse.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use crate::abi::{TpEventV1, TpSinkV1};
use crate::docs::Stats;
use crate::event::{EngineEvent, FinalEvent, Finish, Status, TokenEvent, TopLogprob, Usage};

const OPEN: u8 = 0;
const FINISHED: u8 = 1;
const REFUSED: u8 = 2;

/// What the SDK knows about an engine instance's requests.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    pub(crate) destroying: AtomicBool,
    in_flight: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
}

impl Lifecycle {
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            queued: 0,
            running: self.in_flight.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            extra: Default::default(),
        }
    }

    fn count_final(&self, status: Status) {
        let counter = match status {
            Status::Ok => &self.completed,
            Status::Cancelled => &self.cancelled,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct SinkCell {
    raw: TpSinkV1,
    state: AtomicU8,
    request_id: u64,
    life: Arc<Lifecycle>,
}

// SAFETY: the ABI lets a plugin call the sink from any thread (never concurrently for one
// request: `Sink` is not `Sync`, and the cell's own calls are guarded by `state`).
unsafe impl Send for SinkCell {}
// SAFETY: shared access only reads `raw` and uses atomics.
unsafe impl Sync for SinkCell {}

impl SinkCell {
    pub(crate) fn new(raw: TpSinkV1, request_id: u64, life: Arc<Lifecycle>) -> Arc<Self> {
        life.in_flight.fetch_add(1, Ordering::AcqRel);
        Arc::new(Self {
            raw,
            state: AtomicU8::new(OPEN),
            request_id,
            life,
        })
    }

    fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    fn deliver(&self, ev: &TpEventV1) {
        if let Some(on_event) = self.raw.on_event {
            // SAFETY: the host keeps `ctx` valid until `release`, which only runs when this cell
            // is dropped; `ev` is live for the call.
            unsafe { on_event(self.raw.ctx, ev) };
        }
    }

    /// Moves `Open -> to`; true when this call made the move.
    fn close(&self, to: u8) -> bool {
        let moved = self
            .state
            .compare_exchange(OPEN, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.life.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        moved
    }

    /// Marks a request refused by `submit`; false when its FINAL already went out.
    pub(crate) fn refuse(&self) -> bool {
        self.close(REFUSED)
    }

    fn finish(&self, fin: &FinalEvent) {
        if self.close(FINISHED) {
            self.life.count_final(fin.status);
            EngineEvent::Final(fin.clone()).with_raw(|ev| self.deliver(ev));
        }
    }
}

impl Drop for SinkCell {
    fn drop(&mut self) {
        if self.is_open() {
            let fin = if self.life.destroying.load(Ordering::Acquire) {
                FinalEvent::failed(Status::Cancelled, "engine destroyed", Usage::default())
            } else if std::thread::panicking() {
                FinalEvent::failed(
                    Status::Internal,
                    "engine panicked while running the request",
                    Usage::default(),
                )
            } else {
                FinalEvent::failed(
                    Status::Internal,
                    "engine dropped the request without finishing it",
                    Usage::default(),
                )
            };
            self.finish(&fin);
        }
        if let Some(release) = self.raw.release {
            // SAFETY: last reference to the sink; called exactly once, after the last event.
            unsafe { release(self.raw.ctx) };
        }
    }
}

/// Where an engine sends one request's events. `Send`, not `Sync`: move it to the thread that
/// generates. Finish it with [`Sink::finish`]; a sink dropped unfinished sends a FINAL on its own.
pub struct Sink {
    cell: Arc<SinkCell>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("request_id", &self.cell.request_id)
            .finish()
    }
}

impl Sink {
    pub(crate) fn new(cell: Arc<SinkCell>) -> Self {
        Self { cell }
    }

    /// The request this sink belongs to.
    pub fn request_id(&self) -> u64 {
        self.cell.request_id
    }

    /// False once the request has ended (or was refused); events sent then are dropped.
    pub fn is_open(&self) -> bool {
        self.cell.is_open()
    }

    /// Sends one token without log probabilities.
    pub fn token(&mut self, choice: u32, token_id: u32) {
        self.token_with_logprobs(choice, token_id, None, &[]);
    }

    /// Sends one token with its log probability and alternatives (most likely first).
    pub fn token_with_logprobs(
        &mut self,
        choice: u32,
        token_id: u32,
        logprob: Option<f32>,
        top_logprobs: &[TopLogprob],
    ) {
        if self.cell.is_open() {
            crate::event::raw_token(choice, token_id, logprob, top_logprobs, |ev| {
                self.cell.deliver(ev)
            });
        }
    }

    /// Sends an owned token event.
    pub fn send_token(&mut self, token: &TokenEvent) {
        self.token_with_logprobs(
            token.choice,
            token.token_id,
            token.logprob,
            &token.top_logprobs,
        );
    }

    /// Ends one choice of several; the others go on.
    pub fn end_choice(&mut self, choice: u32, finish: Finish) {
        if self.cell.is_open() {
            EngineEvent::ChoiceEnd { choice, finish }.with_raw(|ev| self.cell.deliver(ev));
        }
    }

    /// Sends the FINAL event and gives the sink back.
    pub fn finish(self, fin: FinalEvent) {
        self.cell.finish(&fin);
    }

    /// Ends the request successfully.
    pub fn complete(self, finish: Finish, usage: Usage) {
        self.finish(FinalEvent::ok(finish, usage));
    }

    /// Ends the request as cancelled.
    pub fn cancelled(self, usage: Usage) {
        self.finish(FinalEvent::failed(Status::Cancelled, "cancelled", usage));
    }

    /// Ends the request with an error.
    pub fn fail(self, status: Status, message: impl Into<String>, usage: Usage) {
        self.finish(FinalEvent::failed(status, message, usage));
    }
}
