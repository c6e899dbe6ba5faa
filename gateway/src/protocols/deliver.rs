//! The one place a started generation becomes an answer: a stream of events when the caller
//! asked for one, else folded into one result within the request's deadline. Either way the
//! request's record accounts it exactly once.

use super::StreamSettings;
use super::render::{self, Events, Render, Timing};
use tracing::Instrument;

use crate::error::ApiError;
use crate::generation::Generation;
use crate::generation::record::RequestRecord;
use crate::generation::{Folded, fold};

/// A generation, delivered.
pub(crate) enum Delivered<R> {
    /// The streamed answer.
    Streamed(Events),
    /// The whole generation, accounted, with the renderer's data for building the body.
    Folded {
        /// Every choice and the usage.
        folded: Folded,
        /// The request (boxed: it outweighs the streamed variant).
        record: Box<RequestRecord>,
        /// What the stream would have been rendered with.
        renderer: R,
    },
}

impl<R> std::fmt::Debug for Delivered<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Streamed(_) => f.write_str("Streamed"),
            Self::Folded { folded, .. } => {
                f.debug_struct("Folded").field("folded", folded).finish()
            }
        }
    }
}

/// Streams `stream` through `renderer` when `record.stream`, else folds its `choices` choices.
pub(crate) async fn deliver<R: Render>(
    mut stream: Generation,
    record: RequestRecord,
    settings: StreamSettings,
    choices: usize,
    renderer: R,
) -> Result<Delivered<R>, ApiError> {
    let deadline = record.started + settings.request_timeout;
    if record.stream {
        let first = render::first_event(
            &mut stream,
            settings.heartbeat,
            deadline,
            settings.request_timeout,
        )
        .await
        .inspect_err(|e| record.failed(e))?;
        let timing = Timing {
            started: record.started,
            heartbeat: settings.heartbeat,
            deadline,
            record,
            _span: tracing::info_span!(target: crate::observability::traces::TARGET, "render", stream = true),
        };
        return Ok(Delivered::Streamed(render::events(
            stream, first, renderer, timing,
        )));
    }
    let render =
        tracing::info_span!(target: crate::observability::traces::TARGET, "render", stream = false);
    let folded = tokio::time::timeout_at(deadline.into(), fold(stream, choices))
        .instrument(render)
        .await
        .map_err(|_| ApiError::Timeout(settings.request_timeout))
        .and_then(|folded| folded)
        .inspect_err(|e| record.failed(e))?;
    if let Some(at) = folded.first_output {
        record.first_output(at);
    }
    record.ended(folded.totals.prompt, folded.totals.completion);
    Ok(Delivered::Folded {
        folded,
        record: Box::new(record),
        renderer,
    })
}
