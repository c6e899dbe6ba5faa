//! Wire types of the OpenAI protocols (serde only, no behaviour).

pub mod chat;
pub mod common;
pub mod completions;
pub mod embeddings;
pub mod error;
pub mod models;
pub mod responses;
