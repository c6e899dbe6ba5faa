//! The protocols the gateway speaks, each a translator between its wire types
//! ([`crate::openai`]) and the one generation request of the facade ([`crate::generation`]):
//! a request is translated into a [`crate::generation::GenerationRequest`], prepared and
//! started by the [`Generator`], and its events rendered back ([`render`]) or folded into one
//! answer ([`deliver`]). No protocol calls another's handler; the Responses API
//! ([`responses`]) keeps its domain (conversations, stored responses, background runs, event
//! logs, compaction) in its own folder.
//!
//! A protocol answers with a [`Reply`], which knows nothing of HTTP: the routes frame it as a
//! JSON body or server-sent events, a WebSocket turn as frames.

pub(crate) mod anthropic;
pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod deliver;
pub(crate) mod embeddings;
pub(crate) mod generate;
pub(crate) mod messages;
pub(crate) mod numbers;
pub(crate) mod paging;
pub(crate) mod render;
pub(crate) mod responses;
pub(crate) mod wire_sampling;

use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures_core::Stream;

use crate::generation::Generator;
use crate::tenancy::Caller;
use render::Events;

/// How streamed answers are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// A stream that sent nothing for this long gets a keep-alive.
    pub heartbeat: Duration,
    /// Longest a request may take from arrival to its last event.
    pub request_timeout: Duration,
}

/// Who asks, when, and what serves them: what every protocol call needs.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The facade.
    pub generator: &'a Generator,
    /// The authenticated caller.
    pub caller: &'a Caller,
    /// When the request arrived.
    pub started: Instant,
    /// How streams are timed.
    pub streams: StreamSettings,
}

impl Call<'_> {
    /// The record of request `id` to `endpoint`, for `model`, from the client's `user`.
    pub(crate) fn record(
        &self,
        id: &str,
        endpoint: &'static str,
        model: &str,
        user: Option<String>,
        stream: bool,
    ) -> crate::generation::record::RequestRecord {
        crate::generation::record::RequestRecord::new(
            id.to_string(),
            endpoint,
            model.to_string(),
            user,
            stream,
            self.started,
        )
        .correlated(self.caller.correlation.clone())
    }
}

/// A protocol's answer, before any transport frames it.
pub(crate) enum Reply {
    /// One JSON body.
    Json {
        /// The response id, sent as `x-request-id` when there is one.
        id: Option<String>,
        /// The body, serialised.
        body: Bytes,
    },
    /// Events, streamed as they come.
    Events {
        /// The response id.
        id: String,
        /// The events.
        events: Events,
    },
    /// Server-sent-event frames read back from a log that lives on without its reader (a
    /// background response): a retry replays it rather than starting another.
    Log {
        /// The response id.
        id: String,
        /// The sequence number of its first event (the SSE id it is framed with).
        first: u64,
        /// The frames.
        frames: std::pin::Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    },
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Json { id, body } => f
                .debug_struct("Json")
                .field("id", id)
                .field("bytes", &body.len())
                .finish(),
            Self::Events { id, .. } => f.debug_struct("Events").field("id", id).finish(),
            Self::Log { id, .. } => f.debug_struct("Log").field("id", id).finish(),
        }
    }
}

impl Reply {
    /// `value` as a JSON body of response `id`.
    pub(crate) fn json(id: Option<String>, value: &impl serde::Serialize) -> Self {
        let body =
            serde_json::to_vec(value).map_or_else(|_| Bytes::from_static(b"null"), Bytes::from);
        Self::Json { id, body }
    }
}
