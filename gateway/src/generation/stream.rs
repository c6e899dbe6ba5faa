//! [`Generation`]: the engine's merged event stream together with the tenant's hold on its
//! limits, so that however the stream ends (its last event, an error, a client that left) the
//! tenant is charged the tokens actually used and its concurrency lease and queue place return.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::pipeline::run::{GenEvent, GenStream};
use crate::tenancy::Admission;

/// A started generation. Dropping it cancels every engine request still running.
#[derive(Debug)]
pub struct Generation {
    stream: GenStream,
    admission: Admission,
}

impl Generation {
    pub(super) fn new(stream: GenStream, admission: Admission) -> Self {
        Self { stream, admission }
    }

    /// For a routed model, which route and engine took it.
    pub fn route(&self) -> Option<&str> {
        self.stream.route.as_deref()
    }

    /// Whether an engine has sent anything yet (so it accepted the work and is under way).
    pub fn engine_started(&self) -> bool {
        self.stream.engine_started()
    }
}

impl Stream for Generation {
    type Item = GenEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GenEvent>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_next(cx);
        // What a drop (cancel, error) settles with: every token the engines sent so far.
        this.admission.record(this.stream.tokens_used());
        polled
    }
}
