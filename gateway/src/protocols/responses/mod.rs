//! The Responses API, all of it: input items and the conversation a turn continues
//! ([`input`], [`truncate`]), translation into the facade's generation request ([`translate`]),
//! turns and the stored-response operations ([`api`]), the event stream ([`render`]), stored
//! responses ([`stored`]), background runs and their event logs ([`runner`], [`background`],
//! [`events`]) and compaction ([`compact`], [`compaction`]). The routes hold only its
//! handlers.

pub mod api;
pub mod background;
pub mod compact;
pub mod compaction;
pub mod events;
pub mod input;
pub mod render;
pub mod runner;
pub mod stored;
pub mod translate;
pub mod truncate;

use std::sync::Arc;

pub use stored::ResponseStore;

/// What the Responses API keeps: stored responses (in the state store) and the background
/// responses running in this process.
#[derive(Debug, Clone)]
pub struct Responses {
    /// Stored responses and their event logs.
    pub store: ResponseStore,
    /// Background responses running here.
    pub running: Arc<background::Running>,
}
