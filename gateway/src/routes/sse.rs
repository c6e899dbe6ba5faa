//! A protocol's [`Reply`] as an HTTP response: one JSON body, or server-sent events as clients
//! expect them (`data: {json}\n\n`, `event:` first where the protocol names its events, a
//! comment frame as keep-alive, `data: [DONE]` at the end, and a failure after the head as the
//! protocol's own events or one `data: {"error": ...}` event). Every event carries an `id:`,
//! its place in the stream, which a client resumes after (`Last-Event-ID`, see
//! [`crate::idempotency::resume`]).
//!
//! The body owns the generation: when the client goes away, the body is dropped, and with it
//! every engine request.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::idempotency::hub::{Detached, StreamFailed};
use crate::idempotency::resume::EventIds;
use crate::observability::metrics::OpenGuard;
use crate::openai::error::ErrorBody;
use crate::protocols::Reply;
use crate::protocols::render::{Chunk, Out};

/// The end of a stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// `reply` as an HTTP response.
pub(super) fn respond(reply: Reply) -> Response {
    respond_with(reply, frame)
}

/// `reply` as an HTTP response, its stream items framed by `frame` (a protocol with its own
/// keep-alive, end and error events).
pub(super) fn respond_with(reply: Reply, frame: fn(Out, &StreamFailed) -> Bytes) -> Response {
    match reply {
        Reply::Json { id, body } => {
            let mut response = (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response();
            if let Some(id) = id {
                response = super::with_request_id(response, &id);
            }
            response
        }
        Reply::Events { id, events } => {
            let failed = StreamFailed::default();
            let flag = failed.clone();
            let guard = OpenGuard::stream();
            let mut ids = EventIds::default();
            let frames = events.map(move |out| {
                let _open = &guard;
                Ok::<_, Infallible>(ids.tag(frame(out, &flag)))
            });
            let mut response = event_stream(Body::from_stream(frames), &id);
            response.extensions_mut().insert(failed);
            response
        }
        Reply::Log { id, first, frames } => {
            let mut ids = EventIds::starting_at(first);
            let body = Body::from_stream(frames.map(move |f| Ok::<_, Infallible>(ids.tag(f))));
            let mut response = event_stream(body, &id);
            response.extensions_mut().insert(Detached);
            response
        }
    }
}

/// One item of a stream as server-sent-event bytes; a failure raises `failed`.
fn frame(out: Out, failed: &StreamFailed) -> Bytes {
    match out {
        Out::Chunk(chunk) => chunk.sse(),
        Out::KeepAlive => Bytes::from_static(b": keep-alive\n\n"),
        Out::Done => Bytes::from_static(DONE),
        Out::Failed { error, chunks, .. } => {
            failed.0.store(true, std::sync::atomic::Ordering::Relaxed);
            match chunks {
                Some(chunks) => {
                    let mut bytes: Vec<u8> = chunks.iter().flat_map(|c| c.sse()).collect();
                    bytes.extend_from_slice(DONE);
                    Bytes::from(bytes)
                }
                None => Chunk::data(&ErrorBody { error }).sse(),
            }
        }
    }
}

/// `body`, a stream of server-sent events, as the response to request `id`.
pub(super) fn event_stream(body: Body, id: &str) -> Response {
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
