//! [`Generation`]: the engine's merged event stream together with the tenant's hold on its
//! limits, so that however the stream ends (its last event, an error, a client that left) the
//! tenant is charged the tokens actually used and its concurrency lease and queue place return.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::pipeline::run::{GenEvent, GenStream};
use crate::plugins::OutputTransforms;
use crate::tenancy::Admission;

/// A started generation. Dropping it cancels every engine request still running.
#[derive(Debug)]
pub struct Generation {
    stream: GenStream,
    admission: Admission,
    /// The gateway plugins' response transforms, with the events they made not yet taken.
    transforms: Option<(OutputTransforms, std::collections::VecDeque<GenEvent>)>,
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
            transforms: transforms.map(|t| (t, Default::default())),
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
}

impl Stream for Generation {
    type Item = GenEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GenEvent>> {
        let this = &mut *self;
        loop {
            if let Some((_, ready)) = this.transforms.as_mut()
                && let Some(event) = ready.pop_front()
            {
                return Poll::Ready(Some(event));
            }
            let polled = Pin::new(&mut this.stream).poll_next(cx);
            // What a drop (cancel, error) settles with: every token the engines sent so far.
            this.admission.record(this.stream.tokens_used());
            match (polled, this.transforms.as_mut()) {
                (Poll::Ready(Some(event)), Some((transforms, ready))) => {
                    ready.extend(transforms.apply(event));
                }
                (polled, _) => return polled,
            }
        }
    }
}
