//! What a protocol's stream renderer is, below the HTTP layer that streams it: the [`Render`]
//! trait (generation events into server-sent-event chunks), [`data`] (one event framed), and
//! [`StreamFailed`] (raised when a stream ended in an error after its 200 head, read by whoever
//! records the response, such as idempotency). `routes::sse` drives a renderer over a response
//! body; the protocols (chat, completions, Responses) implement it.

use axum::body::Bytes;

use crate::openai::error::ErrorDetail;
use crate::pipeline::run::GenEvent;

/// Turns generation events into an endpoint's chunks (each already an SSE `data:` event; see
/// [`data`]).
pub trait Render: Send + 'static {
    /// Chunks sent before any event (the role of each chat choice, echoed prompts).
    fn opening(&mut self) -> Vec<Bytes>;
    /// Chunks for one event (never an error: `routes::sse` sends those).
    fn event(&mut self, event: &GenEvent) -> Vec<Bytes>;
    /// The endpoint's own chunks for a failure after the head, ending the stream; `None` sends
    /// the default `data: {"error": ...}` event.
    fn failure(&mut self, error: &ErrorDetail) -> Option<Vec<Bytes>> {
        let _ = error;
        None
    }
}

/// One SSE event carrying `value` as JSON, serialised straight into the frame.
pub fn data(value: &impl serde::Serialize) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if serde_json::to_writer(&mut frame, value).is_err() {
        frame.extend_from_slice(b"null");
    }
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// Set when a streamed response ended with an error event (its status was already 200), so a
/// recorder of the response knows it did not succeed.
#[derive(Debug, Clone, Default)]
pub struct StreamFailed(pub std::sync::Arc<std::sync::atomic::AtomicBool>);
