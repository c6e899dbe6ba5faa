//! The Responses API, all of it: input items and the conversation a turn continues
//! ([`input`], [`truncate`], [`conversation`]), translation into the facade's generation request
//! ([`translate`]), turns ([`api`]), the stored-response operations ([`operations`]), the event
//! stream ([`render`]), stored responses ([`stored`]), background runs and their event logs
//! ([`runner`], [`background`], [`events`]) and compaction ([`compact`], [`compaction`]). The
//! routes hold only its handlers.

pub(crate) mod api;
pub(crate) mod background;
pub(crate) mod compact;
pub(crate) mod compaction;
pub(crate) mod conversation;
pub(crate) mod events;
pub(crate) mod input;
pub(crate) mod operations;
pub(crate) mod render;
pub(crate) mod runner;
pub(crate) mod stored;
pub(crate) mod translate;
pub(crate) mod truncate;

use std::sync::Arc;

pub(crate) use stored::ResponseStore;

/// What the Responses API keeps: stored responses (in the state store) and the background
/// responses running in this process.
#[derive(Debug, Clone)]
pub struct Responses {
    /// Stored responses and their event logs.
    pub store: ResponseStore,
    /// Background responses running here.
    pub running: Arc<background::Running>,
}
