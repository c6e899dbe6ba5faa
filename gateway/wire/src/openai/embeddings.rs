//! `POST /v1/embeddings`.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// The request body.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    /// Model name.
    pub model: String,
    /// A string, a list of strings, token ids, or a list of token id lists.
    pub input: Value,
    /// `float` (default) or `base64` (little-endian float32).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Truncate vectors to this many dimensions.
    #[serde(default)]
    pub dimensions: Option<Number>,
    /// End-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
}

/// The response.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingList {
    /// Always `list`.
    pub object: &'static str,
    /// One entry per input, in order.
    pub data: Vec<Embedding>,
    /// The model as requested.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

/// One vector.
#[derive(Debug, Clone, Serialize)]
pub struct Embedding {
    /// Always `embedding`.
    pub object: &'static str,
    /// Input index.
    pub index: u32,
    /// The vector.
    pub embedding: Vector,
}

/// A vector as a list of floats, or as base64 of little-endian float32s.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Vector {
    /// Floats (written in their shortest float32 form).
    Float(Vec<f32>),
    /// Base64.
    Base64(String),
}

/// Token counts of an embeddings request.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EmbeddingUsage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// The same.
    pub total_tokens: u64,
}
