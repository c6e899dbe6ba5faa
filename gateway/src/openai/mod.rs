//! Wire types of the OpenAI protocols (serde only, no behaviour).

pub mod error;
pub mod models;
