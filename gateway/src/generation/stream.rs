//! [`Generation`]: the engine's merged event stream together with the tenant's hold on its
//! limits, so that however the stream ends (its last event, an error, a client that left) the
//! tenant is charged the tokens actually used and its concurrency lease and queue place return.
//!
//! Between the engine's events and the protocol sit, when configured, the gateway plugins'
//! response transforms, and the server-tool loop ([`super::tool_loop`]): a round that ends in
//! calls of the gateway's own tools is followed by another round, on the same stream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::tool_loop::ToolLoop;
use crate::pipeline::run::{GenEvent, GenStream};
use crate::plugins::OutputTransforms;
use crate::tenancy::Admission;

/// A started generation. Dropping it cancels every engine request still running (and every
/// tool call the gateway is running for it).
#[derive(Debug)]
pub struct Generation {
    stream: GenStream,
    admission: Admission,
    /// The gateway plugins' response transforms.
    transforms: Option<OutputTransforms>,
    /// The server-tool loop, when the model was offered the gateway's tools.
    tool_loop: Option<Box<ToolLoop>>,
    /// Events made and not yet taken.
    ready: VecDeque<GenEvent>,
    /// The final usage, held until its usage record is written.
    billed: Option<GenEvent>,
}

impl Generation {
    pub(super) fn new(
        stream: GenStream,
        admission: Admission,
        transforms: Option<OutputTransforms>,
    ) -> Self {
        Self {
            stream,
            admission,
            transforms,
            tool_loop: None,
            ready: VecDeque::new(),
            billed: None,
        }
    }

    /// The same generation, continued by `tool_loop` while the model calls server tools.
    pub(super) fn with_tool_loop(self, tool_loop: ToolLoop) -> Self {
        Self {
            tool_loop: Some(Box::new(tool_loop)),
            ..self
        }
    }

    /// For a routed model, which route and engine took it.
    pub fn route(&self) -> Option<&str> {
        self.stream.route.as_deref()
    }

    /// Whether an engine has sent anything yet (so it accepted the work and is under way).
    pub fn engine_started(&self) -> bool {
        self.stream.engine_started()
    }

    /// Takes in the next round: its stream, limits and transforms replace this round's.
    fn continue_with(&mut self, next: Generation) {
        self.stream = next.stream;
        // The finished round's hold goes back as it drops (its tokens were recorded).
        self.admission = next.admission;
        self.transforms = next.transforms;
    }

    /// Takes in an engine event: through the transforms, then the tool loop, into `ready`;
    /// without either, straight out.
    fn take_in(&mut self, event: GenEvent) -> Option<GenEvent> {
        match (self.transforms.as_mut(), self.tool_loop.as_mut()) {
            (None, None) => return Some(event),
            (Some(transforms), None) => transforms.apply(event, &mut self.ready),
            (None, Some(tool_loop)) => tool_loop.observe(event, &mut self.ready),
            (Some(transforms), Some(tool_loop)) => {
                let mut transformed = VecDeque::new();
                transforms.apply(event, &mut transformed);
                for event in transformed {
                    tool_loop.observe(event, &mut self.ready);
                }
            }
        }
        None
    }
}

impl Stream for Generation {
    type Item = GenEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GenEvent>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.billed.take() {
                if this.admission.poll_written(cx).is_pending() {
                    this.billed = Some(event);
                    return Poll::Pending;
                }
                if let Some(event) = this.take_in(event) {
                    return Poll::Ready(Some(event));
                }
                continue;
            }
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(event));
            }
            if let Some(tool_loop) = this.tool_loop.as_mut()
                && let Some(next) = tool_loop.poll_next_round(cx)
            {
                match next {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok((generation, events))) => {
                        this.continue_with(generation);
                        this.ready.extend(events);
                        continue;
                    }
                    Poll::Ready(Err(error)) => {
                        this.tool_loop = None;
                        return Poll::Ready(Some(GenEvent::Error(error)));
                    }
                }
            }
            let polled = Pin::new(&mut this.stream).poll_next(cx);
            // What a drop (cancel, error) settles with: every token the engines sent so far.
            this.admission.record(this.stream.tokens_used());
            match polled {
                Poll::Ready(Some(mut event)) => {
                    // The round's final count: settle its cost (each round bills its own hold)
                    // and pass it on once its usage record is written.
                    if let GenEvent::Usage(totals) = &mut event {
                        totals.cost = this.admission.bill(totals.usage());
                        this.billed = Some(event);
                        continue;
                    }
                    if matches!(event, GenEvent::Error(_)) {
                        this.admission.fail();
                    }
                    if let Some(event) = this.take_in(event) {
                        return Poll::Ready(Some(event));
                    }
                }
                Poll::Ready(None) => {
                    if this
                        .tool_loop
                        .as_ref()
                        .is_some_and(|tool_loop| tool_loop.has_next_round())
                    {
                        continue;
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
