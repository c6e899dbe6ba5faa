//! Wire types of the OpenAI protocols (serde only, no behaviour).

pub(crate) mod chat;
pub(crate) mod common;
pub(crate) mod completions;
pub(crate) mod embeddings;
pub(crate) mod error;
pub(crate) mod models;
pub(crate) mod responses;
