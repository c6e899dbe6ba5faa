//! Server-sent events, as clients expect them: `data: {json}\n\n`, one event per write, a comment
//! frame as heartbeat when nothing was sent for a while, `data: [DONE]` at the end, and a failure
//! after the head as one `data: {"error": ...}` event.
//!
//! The body owns the generation: when the client goes away, the body is dropped, and with it
//! every engine request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::error::ApiError;
use crate::observability::metrics::{self, OpenGuard};
use crate::observability::requests::RequestRecord;
use crate::openai::error::ErrorBody;
use crate::pipeline::run::{GenEvent, GenStream};
pub use crate::render::{Render, StreamFailed, data};

/// How a stream is timed and accounted.
#[derive(Debug)]
pub struct Timing {
    /// When the request arrived.
    pub started: Instant,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// When the request times out.
    pub deadline: Instant,
    /// The request, accounted when the stream ends.
    pub record: RequestRecord,
}

struct State<R> {
    stream: GenStream,
    renderer: R,
    first: Option<GenEvent>,
    out: VecDeque<Bytes>,
    finished: bool,
    timing: Timing,
    first_text_seen: bool,
    failed: StreamFailed,
    _guard: OpenGuard,
}

/// The JSON a `data: ...` event carries (for sending the same chunks over a WebSocket).
pub fn payload(frame: &Bytes) -> Option<String> {
    let text = std::str::from_utf8(frame).ok()?;
    let json = text.strip_prefix("data: ")?.strip_suffix("\n\n")?;
    Some(json.to_string())
}

impl<R: Render> State<R> {
    fn on_event(&mut self, event: Option<GenEvent>) {
        match event {
            None => {
                self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.finished = true;
            }
            Some(GenEvent::Error(e)) => self.fail(e),
            Some(event) => {
                if !self.first_text_seen
                    && matches!(event, GenEvent::Text { .. } | GenEvent::ToolCall { .. })
                {
                    self.first_text_seen = true;
                    metrics::time_to_first_token(
                        &self.timing.record.model,
                        self.timing.started.elapsed(),
                    );
                }
                self.out.extend(self.renderer.event(&event));
                if let GenEvent::Usage(t) = &event {
                    // The last event: the response is complete, whatever the clock says now.
                    self.timing.record.ended(t.prompt, t.completion);
                    self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.finished = true;
                }
            }
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.failed
            .0
            .store(true, std::sync::atomic::Ordering::Relaxed);
        e.log();
        self.timing.record.failed(&e);
        let detail = e.detail();
        metrics::error(detail.code.unwrap_or("server_error"));
        match self.renderer.failure(&detail) {
            Some(chunks) => self.out.extend(chunks),
            None => self.out.push_back(data(&ErrorBody { error: detail })),
        }
        self.finished = true;
    }

    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                return Some((Ok(bytes), self));
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
                Err(_) => self.out.push_back(Bytes::from_static(b": keep-alive\n\n")),
            }
        }
    }
}

/// The streamed response: opening chunks, then `first` (already read, so an early failure could
/// still become a plain error response), then the rest of the stream.
pub fn respond(
    stream: GenStream,
    first: Option<GenEvent>,
    mut renderer: impl Render,
    timing: Timing,
) -> Response {
    let out: VecDeque<Bytes> = renderer.opening().into();
    let state_id = timing.record.id.clone();
    let failed = StreamFailed::default();
    let state = State {
        stream,
        renderer,
        first,
        out,
        finished: false,
        timing,
        first_text_seen: false,
        failed: failed.clone(),
        _guard: OpenGuard::stream(),
    };
    let body = Body::from_stream(futures_util::stream::unfold(state, State::next));
    let mut response = event_stream(body, &state_id);
    response.extensions_mut().insert(failed);
    response
}

/// `body`, a stream of server-sent events, as the response to request `id`.
pub fn event_stream(body: Body, id: &str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(id) {
        headers.insert("x-request-id", id);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Waits until the engine has produced something (up to the heartbeat interval, never past the
/// deadline), so a failure before any output is answered with its real status rather than a 200
/// and an error event. Returns the first event when there is one; once the engine is under way,
/// text the pipeline still holds (a tool call being parsed) does not hold back the response.
/// Reaching `deadline` first is a timeout (`limit` is the configured request timeout).
pub async fn first_event(
    stream: &mut GenStream,
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
