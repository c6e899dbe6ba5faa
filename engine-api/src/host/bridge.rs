//! The sink -> tokio bridge: a `TpSinkV1` whose events land in an unbounded channel, and the
//! receiving end as a `Stream` that ends after the FINAL event.
//!
//! `on_event` never blocks (an unbounded send), so an engine thread is never held up by a slow
//! client; the engine bounds what it sends by `max_tokens`. The sink's context is freed by
//! `release`, which the plugin calls exactly once, so a plugin may keep emitting after the
//! receiver is gone: those events are dropped.

use std::ffi::c_void;
use std::panic::catch_unwind;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::abi::{TpEventV1, TpSinkV1};
use crate::event::{EngineEvent, FinalEvent, Status, Usage};

/// What travels the channel: the engine's events, or word of one that could not be read.
enum Item {
    Event(EngineEvent),
    Malformed(String),
}

struct BridgeCtx {
    tx: UnboundedSender<Item>,
}

/// A raw sink and the stream its events arrive on. Hand the sink to exactly one `submit` (which
/// takes it whatever it returns): the plugin's `release` frees its context.
pub fn sink_pair() -> (TpSinkV1, EventReceiver) {
    let (tx, rx) = unbounded_channel();
    let ctx = Box::into_raw(Box::new(BridgeCtx { tx })).cast::<c_void>();
    let sink = TpSinkV1 {
        ctx,
        on_event: Some(on_event),
        release: Some(release),
    };
    (
        sink,
        EventReceiver {
            rx,
            done: false,
            engine_finished: false,
        },
    )
}

unsafe extern "C" fn on_event(ctx: *mut c_void, event: *const TpEventV1) {
    let _ = catch_unwind(|| {
        // SAFETY: `ctx` is the `BridgeCtx` of `sink_pair`, alive until `release`.
        let Some(ctx) = (unsafe { ctx.cast::<BridgeCtx>().as_ref() }) else {
            return;
        };
        // SAFETY: the plugin passes a live event valid for this call.
        let item = match unsafe { EngineEvent::from_raw(event) } {
            Ok(Some(event)) => Item::Event(event),
            Ok(None) => return, // a kind from a later minor: skipped
            Err(reason) => Item::Malformed(reason),
        };
        // A closed receiver means nobody is listening any more; the event is dropped.
        let _ = ctx.tx.send(item);
    });
}

unsafe extern "C" fn release(ctx: *mut c_void) {
    let _ = catch_unwind(|| {
        if !ctx.is_null() {
            // SAFETY: `ctx` came from `Box::into_raw` in `sink_pair`; release runs exactly once.
            drop(unsafe { Box::from_raw(ctx.cast::<BridgeCtx>()) });
        }
    });
}

/// The events of one request, ending with (and after) its FINAL event. If the plugin releases
/// the sink without a FINAL, the stream yields an internal-error FINAL of its own, so a consumer
/// always sees exactly one.
#[derive(Debug)]
pub struct EventReceiver {
    rx: UnboundedReceiver<Item>,
    done: bool,
    engine_finished: bool,
}

impl EventReceiver {
    /// True once the FINAL event has been yielded.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// True once the engine itself sent the FINAL (not one this side made up for a malformed
    /// event or a release without a FINAL): until then the engine may still be working.
    pub fn engine_finished(&self) -> bool {
        self.engine_finished
    }

    /// The next event, or `None` after the FINAL.
    pub async fn recv(&mut self) -> Option<EngineEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Polls for the next event.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<EngineEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        let made_up = |message: String| {
            EngineEvent::Final(FinalEvent::failed(
                Status::Internal,
                message,
                Usage::default(),
            ))
        };
        let event = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Item::Event(event))) => {
                if matches!(event, EngineEvent::Final(_)) {
                    self.engine_finished = true;
                }
                event
            }
            Poll::Ready(Some(Item::Malformed(reason))) => {
                made_up(format!("engine sent a malformed event: {reason}"))
            }
            Poll::Ready(None) => {
                // Released: the engine is done with the request, FINAL or not.
                self.engine_finished = true;
                made_up("engine released the request without a final event".into())
            }
        };
        if matches!(event, EngineEvent::Final(_)) {
            self.done = true;
            self.rx.close();
        }
        Poll::Ready(Some(event))
    }
}

impl Stream for EventReceiver {
    type Item = EngineEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EngineEvent>> {
        self.get_mut().poll_event(cx)
    }
}
