//! The Responses API: input items, stored responses and the event stream. The endpoint itself is
//! `routes::responses`; it runs every request through the chat pipeline.

pub mod background;
pub mod compaction;
pub mod events;
pub mod input;
pub mod render;
pub mod stored;
pub mod translate;
pub mod truncate;

pub use stored::ResponseStore;
