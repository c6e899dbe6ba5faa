//! What every protocol's streamed answer is made of, below any transport: a [`Render`] turns
//! generation events into [`Chunk`]s (one JSON event each, with the SSE event name the
//! protocol gives it, if any), and [`events`] drives a renderer over a [`Generation`] into
//! [`Out`] items: chunks, keep-alives when nothing was sent for a while, the end, or a failure
//! after the answer began, each typed. Server-sent events and WebSocket frames are two
//! framings of the same items (`routes::sse`, `routes::websocket`); neither parses the other.
//!
//! The stream owns the generation: dropping it cancels the engine work.

use std::collections::VecDeque;
use std::ops::Range;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use futures_core::Stream;
use futures_util::StreamExt;

use crate::error::ApiError;
use crate::generation::GenEvent;
use crate::generation::Generation;
use crate::generation::record::RequestRecord;
use crate::observability::metrics;
use crate::openai::error::ErrorDetail;

/// One event of a streamed answer: its JSON, and the name SSE gives it (`event:`), if any. It
/// is serialised once, straight into its server-sent-event frame; the JSON alone (what a
/// WebSocket message carries) is a view of the same bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chunk {
    /// `event: NAME\n` (when named), then `data: JSON\n\n`.
    frame: Bytes,
    /// Where the JSON lies in `frame`.
    json: Range<usize>,
}

impl Chunk {
    /// An unnamed event carrying `value`.
    pub(crate) fn data(value: &impl serde::Serialize) -> Self {
        Self::framed(None, value)
    }

    /// An event named `event` (the Responses API names each event by its type) carrying
    /// `value`.
    pub(crate) fn named(event: &str, value: &impl serde::Serialize) -> Self {
        Self::framed(Some(event), value)
    }

    fn framed(event: Option<&str>, value: &impl serde::Serialize) -> Self {
        let mut frame = Vec::with_capacity(256);
        if let Some(event) = event {
            frame.extend_from_slice(b"event: ");
            frame.extend_from_slice(event.as_bytes());
            frame.push(b'\n');
        }
        frame.extend_from_slice(b"data: ");
        let start = frame.len();
        if serde_json::to_writer(&mut frame, value).is_err() {
            frame.truncate(start);
            frame.extend_from_slice(b"null");
        }
        let end = frame.len();
        frame.extend_from_slice(b"\n\n");
        Self {
            frame: Bytes::from(frame),
            json: start..end,
        }
    }

    /// The event's JSON.
    pub(crate) fn json(&self) -> &[u8] {
        &self.frame[self.json.clone()]
    }

    /// The event as server-sent-event bytes (shared, not copied).
    pub(crate) fn sse(&self) -> Bytes {
        self.frame.clone()
    }
}

/// Turns generation events into a protocol's chunks.
pub(crate) trait Render: Send + 'static {
    /// Chunks sent before any event (the role of each chat choice, echoed prompts).
    fn opening(&mut self) -> Vec<Chunk>;
    /// Chunks for one event (never an error: failures go to [`Render::failure`]).
    fn event(&mut self, event: &GenEvent) -> Vec<Chunk>;
    /// The protocol's own chunks for a failure after the head, ending the stream; `None`
    /// leaves the failure to the transport's default (an error event).
    fn failure(&mut self, error: &ErrorDetail) -> Option<Vec<Chunk>> {
        let _ = error;
        None
    }
}

/// One item of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Out {
    /// An event.
    Chunk(Chunk),
    /// Nothing was sent for a heartbeat interval.
    KeepAlive,
    /// The answer is complete.
    Done,
    /// The generation failed after the answer began; the last item.
    Failed {
        /// The status the failure would have had before the head.
        status: StatusCode,
        /// What failed, as the caller sees it.
        error: ErrorDetail,
        /// The protocol's own events for it (then followed by the end), if it has them.
        chunks: Option<Vec<Chunk>>,
    },
}

/// A streamed answer, ready for a transport.
pub(crate) type Events = Pin<Box<dyn Stream<Item = Out> + Send>>;

/// How a stream is timed and accounted.
#[derive(Debug)]
pub(crate) struct Timing {
    /// When the request arrived.
    pub started: Instant,
    /// Keep-alive interval.
    pub heartbeat: Duration,
    /// When the request times out.
    pub deadline: Instant,
    /// The request, accounted when the stream ends.
    pub record: RequestRecord,
    /// The `render` trace span, held open while the stream is rendered.
    pub _span: tracing::Span,
}

struct Driver<R> {
    stream: Generation,
    renderer: R,
    first: Option<GenEvent>,
    out: VecDeque<Out>,
    finished: bool,
    timing: Timing,
    first_text_seen: bool,
}

impl<R: Render> Driver<R> {
    fn on_event(&mut self, event: Option<GenEvent>) {
        match event {
            None => {
                self.out.push_back(Out::Done);
                self.finished = true;
            }
            Some(GenEvent::Error(e)) => self.fail(e),
            Some(event) => {
                if !self.first_text_seen
                    && matches!(event, GenEvent::Text { .. } | GenEvent::ToolCall { .. })
                {
                    self.first_text_seen = true;
                    self.timing.record.first_output(std::time::Instant::now());
                }
                self.out
                    .extend(self.renderer.event(&event).into_iter().map(Out::Chunk));
                if let GenEvent::Usage(t) = &event {
                    // The last event: the answer is complete, whatever the clock says now.
                    self.timing.record.ended(t.prompt, t.completion);
                    self.out.push_back(Out::Done);
                    self.finished = true;
                }
            }
        }
    }

    fn fail(&mut self, e: ApiError) {
        e.log();
        self.timing.record.failed(&e);
        let error = e.detail();
        metrics::error(e.metric_code());
        let chunks = self.renderer.failure(&error);
        self.out.push_back(Out::Failed {
            status: e.status(),
            error,
            chunks,
        });
        self.finished = true;
    }

    async fn next(mut self) -> Option<(Out, Self)> {
        loop {
            if let Some(out) = self.out.pop_front() {
                return Some((out, self));
            }
            if self.finished {
                return None;
            }
            if let Some(event) = self.first.take() {
                self.on_event(Some(event));
                continue;
            }
            let now = Instant::now();
            if now >= self.timing.deadline {
                self.fail(ApiError::Timeout(
                    self.timing.deadline - self.timing.started,
                ));
                continue;
            }
            let wait = self.timing.heartbeat.min(self.timing.deadline - now);
            match tokio::time::timeout(wait, self.stream.next()).await {
                Ok(event) => self.on_event(event),
                Err(_) if Instant::now() >= self.timing.deadline => continue,
                Err(_) => self.out.push_back(Out::KeepAlive),
            }
        }
    }
}

/// The streamed answer: the renderer's opening chunks, then `first` (already read, so an
/// early failure could still become a plain error), then the rest of `stream`.
pub(crate) fn events(
    stream: Generation,
    first: Option<GenEvent>,
    mut renderer: impl Render,
    timing: Timing,
) -> Events {
    let out = renderer.opening().into_iter().map(Out::Chunk).collect();
    let driver = Driver {
        stream,
        renderer,
        first,
        out,
        finished: false,
        timing,
        first_text_seen: false,
    };
    Box::pin(futures_util::stream::unfold(driver, Driver::next))
}

/// Waits until the engine has produced something (up to the heartbeat interval, never past the
/// deadline), so a failure before any output is answered with its real status rather than a
/// stream and an error event. Returns the first event when there is one; once the engine is
/// under way, text the pipeline still holds (a tool call being parsed) does not hold back the
/// answer. Reaching `deadline` first is a timeout (`limit` is the configured request timeout).
pub(crate) async fn first_event(
    stream: &mut Generation,
    heartbeat: Duration,
    deadline: Instant,
    limit: Duration,
) -> Result<Option<GenEvent>, ApiError> {
    let now = Instant::now();
    let wait = heartbeat.min(deadline.saturating_duration_since(now));
    let first = std::future::poll_fn(|cx| match stream.poll_next_unpin(cx) {
        Poll::Ready(event) => Poll::Ready(Ok(event)),
        Poll::Pending if stream.engine_started() => Poll::Ready(Err(())),
        Poll::Pending => Poll::Pending,
    });
    match tokio::time::timeout(wait, first).await {
        Ok(Ok(Some(GenEvent::Error(e)))) => Err(e),
        Ok(Ok(Some(event))) => Ok(Some(event)),
        Ok(Ok(None) | Err(())) => Ok(None),
        Err(_) if Instant::now() >= deadline => Err(ApiError::Timeout(limit)),
        Err(_) => Ok(None),
    }
}
