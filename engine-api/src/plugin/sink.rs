//! The plugin side of a request's sink.
//!
//! The raw sink lives in a shared cell that the SDK's `submit` wrapper and the engine's [`Sink`]
//! both hold. The cell's state moves
//! - `Open -> Streaming` when the engine sends its first event;
//! - `Open | Streaming -> Finished` when the FINAL goes out;
//! - `Open -> Refused` when `submit` fails before anything was sent (no event may follow).
//!
//! A failed `submit` whose engine already sent events cannot be refused any more: the request
//! counts as accepted, and its FINAL (sent by the engine's thread when it finishes or drops the
//! sink, never by the wrapper, so `on_event` calls stay serial) carries the engine's error.
//! Whoever drops the last reference calls `release`, and `destroy` waits for every cell to go.
//! That keeps the contract whatever the engine does: finish, drop the sink, panic, or move it to
//! a thread and then fail.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::abi::{TpEventV1, TpSinkV1};
use crate::event::{
    EngineError, EngineEvent, FinalEvent, Finish, Status, TokenEvent, TopLogprob, Usage,
};
use crate::json::{MAX_TOP_LOGPROBS, Stats};

const OPEN: u8 = 0;
const STREAMING: u8 = 1;
const FINISHED: u8 = 2;
const REFUSED: u8 = 3;

/// What the SDK knows about an engine instance's requests.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    pub(crate) destroying: AtomicBool,
    /// Requests not yet finished or refused.
    in_flight: AtomicU64,
    /// Cells not yet released; `destroy` waits for zero.
    cells: Mutex<u64>,
    released: Condvar,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
}

impl Lifecycle {
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

    fn cells(&self) -> MutexGuard<'_, u64> {
        self.cells.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until every sink is released, calling `waiting(n)` every few seconds meanwhile.
    pub(crate) fn wait_released(&self, waiting: impl Fn(u64)) {
        let mut cells = self.cells();
        while *cells > 0 {
            let (guard, timeout) = self
                .released
                .wait_timeout(cells, Duration::from_secs(5))
                .unwrap_or_else(|p| p.into_inner());
            cells = guard;
            if timeout.timed_out() && *cells > 0 {
                waiting(*cells);
            }
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
    /// The engine's error, when `submit` failed after events had gone out.
    late_error: Mutex<Option<EngineError>>,
    /// The engine's `Sink` was dropped while its thread unwound from a panic. Recorded there,
    /// because the cell itself may be dropped later on another thread (the one in `submit`).
    owner_panicked: AtomicBool,
    life: Arc<Lifecycle>,
}

// SAFETY: the ABI lets a plugin call the sink from any thread (never concurrently for one
// request: `Sink` is neither `Clone` nor `Sync`, and the wrapper itself sends no event).
unsafe impl Send for SinkCell {}
// SAFETY: shared access only reads `raw` and uses atomics and a mutex.
unsafe impl Sync for SinkCell {}

impl SinkCell {
    pub(crate) fn new(raw: TpSinkV1, request_id: u64, life: Arc<Lifecycle>) -> Arc<Self> {
        life.in_flight.fetch_add(1, Ordering::AcqRel);
        *life.cells() += 1;
        Arc::new(Self {
            raw,
            state: AtomicU8::new(OPEN),
            request_id,
            late_error: Mutex::new(None),
            owner_panicked: AtomicBool::new(false),
            life,
        })
    }

    fn is_open(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), OPEN | STREAMING)
    }

    /// Marks the request as having sent events; false when it has ended or was refused.
    fn begin_event(&self) -> bool {
        match self
            .state
            .compare_exchange(OPEN, STREAMING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == STREAMING,
        }
    }

    fn deliver(&self, ev: &TpEventV1) {
        if let Some(on_event) = self.raw.on_event {
            // SAFETY: the host keeps `ctx` valid until `release`, which only runs when this cell
            // is dropped; `ev` is live for the call.
            unsafe { on_event(self.raw.ctx, ev) };
        }
    }

    /// Refuses the request if nothing was sent. Otherwise keeps `error` for its FINAL and
    /// returns false: the request counts as accepted.
    pub(crate) fn refuse(&self, error: EngineError) -> bool {
        if self
            .state
            .compare_exchange(OPEN, REFUSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.life.in_flight.fetch_sub(1, Ordering::AcqRel);
            return true;
        }
        *self.late_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
        false
    }

    fn finish(&self, fin: &FinalEvent) {
        let mut now = self.state.load(Ordering::Acquire);
        loop {
            if !matches!(now, OPEN | STREAMING) {
                return;
            }
            match self
                .state
                .compare_exchange(now, FINISHED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => now = actual,
            }
        }
        self.life.in_flight.fetch_sub(1, Ordering::AcqRel);
        let late = self
            .late_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let fin = match late {
            Some(e) => FinalEvent::failed(e.status, e.message, fin.usage),
            None => fin.clone(),
        };
        self.life.count_final(fin.status);
        EngineEvent::Final(fin).with_raw(|ev| self.deliver(ev));
    }
}

impl Drop for SinkCell {
    fn drop(&mut self) {
        if self.is_open() {
            let (status, message) = if self.life.destroying.load(Ordering::Acquire) {
                (Status::Cancelled, "engine destroyed")
            } else if std::thread::panicking() || self.owner_panicked.load(Ordering::Acquire) {
                (
                    Status::Internal,
                    "engine panicked while running the request",
                )
            } else {
                (
                    Status::Internal,
                    "engine dropped the request without finishing it",
                )
            };
            self.finish(&FinalEvent::failed(status, message, Usage::default()));
        }
        if let Some(release) = self.raw.release {
            // SAFETY: last reference to the sink; called exactly once, after the last event.
            unsafe { release(self.raw.ctx) };
        }
        let mut cells = self.life.cells();
        *cells -= 1;
        drop(cells);
        self.life.released.notify_all();
    }
}

/// Where an engine sends one request's events. `Send`, not `Sync` nor `Clone`: move it to the
/// thread that generates. Finish it with [`Sink::finish`]; a sink dropped unfinished sends a
/// FINAL on its own.
pub struct Sink {
    cell: Arc<SinkCell>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("request_id", &self.cell.request_id)
            .finish()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cell.owner_panicked.store(true, Ordering::Release);
        }
    }
}

impl Sink {
    pub(crate) fn new(cell: Arc<SinkCell>) -> Self {
        Self {
            cell,
            _not_sync: PhantomData,
        }
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

    /// Sends one token with its log probability and alternatives (most likely first; at most
    /// 20 are sent).
    pub fn token_with_logprobs(
        &mut self,
        choice: u32,
        token_id: u32,
        logprob: Option<f32>,
        top_logprobs: &[TopLogprob],
    ) {
        if self.cell.begin_event() {
            let top = &top_logprobs[..top_logprobs.len().min(MAX_TOP_LOGPROBS as usize)];
            crate::event::raw_token(choice, token_id, logprob, top, |ev| self.cell.deliver(ev));
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
        if self.cell.begin_event() {
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
