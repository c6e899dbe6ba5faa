//! An instrumented sink that records everything a plugin does with it; the kit uses it, and
//! plugin authors can use it in their own tests.
//!
//! Its context is deliberately leaked (a few hundred bytes per request the kit sends), so a
//! plugin that releases twice or emits after release is caught and counted instead of causing
//! a use-after-free in the kit.

use std::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::abi::{TpEventV1, TpSinkV1};
use crate::event::{EngineEvent, FinalEvent, TokenEvent};

/// What one request's sink saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Token events, in order.
    pub tokens: Vec<TokenEvent>,
    /// Choices ended by CHOICE_END events, in order.
    pub choice_ends: Vec<u32>,
    /// FINAL events (the contract allows exactly one).
    pub finals: Vec<FinalEvent>,
    /// Calls of `release` (the contract allows exactly one).
    pub releases: u32,
    /// Events that arrived after a FINAL.
    pub after_final: u32,
    /// Events that arrived after `release`.
    pub after_release: u32,
    /// Why events could not be read.
    pub malformed: Vec<String>,
}

/// Records one request's events and releases.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: Mutex<Seen>,
    changed: Condvar,
    in_call: AtomicBool,
    overlapped: AtomicBool,
}

impl Recorder {
    /// A new recorder and the raw sink that feeds it.
    pub fn sink() -> (&'static Recorder, TpSinkV1) {
        let recorder: &'static Recorder = Box::leak(Box::default());
        let ctx = (recorder as *const Recorder).cast_mut().cast::<c_void>();
        (
            recorder,
            TpSinkV1 {
                ctx,
                on_event: Some(on_event),
                release: Some(release),
            },
        )
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of what was seen so far.
    pub fn seen(&self) -> Seen {
        self.lock().clone()
    }

    /// Whether two `on_event` calls for this request ever overlapped.
    pub fn overlapped(&self) -> bool {
        self.overlapped.load(Ordering::Acquire)
    }

    /// Waits until `done(seen)` holds or `timeout` passes; returns what was seen and whether it
    /// held.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&Seen) -> bool) -> (Seen, bool) {
        let deadline = Instant::now() + timeout;
        let mut seen = self.lock();
        loop {
            if done(&seen) {
                return (seen.clone(), true);
            }
            let now = Instant::now();
            if now >= deadline {
                return (seen.clone(), false);
            }
            seen = match self.changed.wait_timeout(seen, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Waits for the FINAL event and the release that follows it.
    pub fn wait_ended(&self, timeout: Duration) -> (Seen, bool) {
        self.wait_until(timeout, |s| !s.finals.is_empty() && s.releases > 0)
    }

    /// Waits for the release alone (refused requests get no FINAL).
    pub fn wait_released(&self, timeout: Duration) -> (Seen, bool) {
        self.wait_until(timeout, |s| s.releases > 0)
    }
}

unsafe extern "C" fn on_event(ctx: *mut c_void, event: *const TpEventV1) {
    let _ = catch_unwind(|| {
        // SAFETY: `ctx` is a leaked `Recorder`, valid forever.
        let Some(recorder) = (unsafe { ctx.cast::<Recorder>().as_ref() }) else {
            return;
        };
        if recorder.in_call.swap(true, Ordering::AcqRel) {
            recorder.overlapped.store(true, Ordering::Release);
        }
        // SAFETY: the plugin passes a live event for the call.
        let parsed = unsafe { EngineEvent::from_raw(event) };
        {
            let mut seen = recorder.lock();
            if seen.releases > 0 {
                seen.after_release += 1;
            }
            if !seen.finals.is_empty() {
                seen.after_final += 1;
            }
            match parsed {
                Ok(Some(EngineEvent::Token(token))) => seen.tokens.push(token),
                Ok(Some(EngineEvent::ChoiceEnd { choice, .. })) => seen.choice_ends.push(choice),
                Ok(Some(EngineEvent::Final(fin))) => seen.finals.push(fin),
                Ok(None) => seen
                    .malformed
                    .push("an event kind v1 does not define".into()),
                Err(reason) => seen.malformed.push(reason),
            }
        }
        recorder.in_call.store(false, Ordering::Release);
        recorder.changed.notify_all();
    });
}

unsafe extern "C" fn release(ctx: *mut c_void) {
    let _ = catch_unwind(|| {
        // SAFETY: `ctx` is a leaked `Recorder`, valid forever.
        let Some(recorder) = (unsafe { ctx.cast::<Recorder>().as_ref() }) else {
            return;
        };
        recorder.lock().releases += 1;
        recorder.changed.notify_all();
    });
}
