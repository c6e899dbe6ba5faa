//! `POST /v1/completions` (legacy): request, response, and stream chunks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::common::{CompletionLogprobs, Extensions, StopParam, StreamOptions, Usage};

/// The request body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Model name.
    pub model: String,
    /// A string, a list of strings, token ids, or a list of token id lists.
    pub prompt: Value,
    /// Text after the completion (unsupported).
    #[serde(default)]
    pub suffix: Option<String>,
    /// Most tokens to generate per choice (default 16).
    #[serde(default)]
    pub max_tokens: Option<Number>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Choices per prompt.
    #[serde(default)]
    pub n: Option<Number>,
    /// Server-side candidates per choice (only 1, or equal to n, is supported).
    #[serde(default)]
    pub best_of: Option<Number>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Alternatives per token (an integer; `true`/`false` accepted as 1/0).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Repeat the prompt before the completion.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopParam>,
    /// Presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Token biases (unsupported unless empty).
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<Number>,
    /// End-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
    /// Free-form metadata, for logs.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Sampling extensions (top level).
    #[serde(flatten)]
    pub extensions: Extensions,
    /// Sampling extensions (NVIDIA Dynamo's `nvext`).
    #[serde(default)]
    pub nvext: Option<Extensions>,
}

/// The non-streaming response, and (with `object` the same) each stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// `cmpl-...`, the same in every chunk.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model as requested.
    pub model: String,
    /// The backend configuration that served it.
    pub system_fingerprint: String,
    /// The choices (empty in the usage chunk of a stream).
    pub choices: Vec<CompletionChoice>,
    /// Token counts; in a stream only in the usage chunk (and null in the others when asked
    /// for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One choice.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// The text (in a stream: the new part).
    pub text: String,
    /// Choice index (prompt index times n, plus the choice within the prompt).
    pub index: u32,
    /// Log probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; in a stream only in the choice's last chunk.
    pub finish_reason: Option<&'static str>,
}
