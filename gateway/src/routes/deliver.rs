//! The one place a started generation becomes a response: streamed as server-sent events when
//! the client asked for a stream, else folded into one answer within the request's deadline.
//! Either way the request's record accounts it exactly once.

use axum::response::Response;

use super::sse::{self, Render, Timing};
use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::pipeline::fold::{self, Folded};
use crate::pipeline::run::GenStream;

/// A generation, delivered.
#[derive(Debug)]
pub enum Delivered<R> {
    /// The streamed response.
    Streamed(Response),
    /// The whole generation, accounted, with the renderer's data for building the body.
    Folded {
        /// Every choice and the usage.
        folded: Folded,
        /// The request (its id goes in `x-request-id`).
        record: RequestRecord,
        /// What the stream would have been rendered with.
        renderer: R,
    },
}

/// Streams `stream` through `renderer` when `record.stream`, else folds its `choices` choices.
pub async fn deliver<R: Render>(
    mut stream: GenStream,
    record: RequestRecord,
    server: &ServerConfig,
    choices: usize,
    renderer: R,
) -> Result<Delivered<R>, ApiError> {
    let deadline = record.started + server.request_timeout;
    if record.stream {
        let first = sse::first_event(
            &mut stream,
            server.stream_heartbeat,
            deadline,
            server.request_timeout,
        )
        .await
        .inspect_err(|e| record.failed(e))?;
        let timing = Timing {
            started: record.started,
            heartbeat: server.stream_heartbeat,
            deadline,
            record,
        };
        return Ok(Delivered::Streamed(sse::respond(
            stream, first, renderer, timing,
        )));
    }
    let folded = tokio::time::timeout_at(deadline.into(), fold::fold(stream, choices))
        .await
        .map_err(|_| ApiError::Timeout(server.request_timeout))
        .and_then(|folded| folded)
        .inspect_err(|e| record.failed(e))?;
    record.ended(folded.totals.prompt, folded.totals.completion);
    Ok(Delivered::Folded {
        folded,
        record,
        renderer,
    })
}
