//! Wire types of Anthropic's Messages API (serde only, no behaviour): the request, the message
//! it answers with, the streamed events, and the error body.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/messages` (and, without `max_tokens`, `/v1/messages/count_tokens`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesRequest {
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<serde_json::Number>,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub system: Option<Value>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<serde_json::Number>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub thinking: Option<Value>,
    #[serde(default)]
    pub service_tier: Option<String>,
}

/// A message of the conversation: a string, or content blocks (read by the translator, which
/// names a bad block by its place).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputMessage {
    pub role: String,
    pub content: Value,
}

/// `metadata`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Metadata {
    #[serde(default)]
    pub user_id: Option<String>,
}

/// A content block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentBlock {
    /// Text.
    Text { text: String },
    /// The model's reasoning (`signature` is empty: this gateway does not sign it).
    Thinking { thinking: String, signature: String },
    /// A tool call.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

/// The answer (`type: "message"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// The error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

/// A model in `GET /v1/models`, as Anthropic lists them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Model {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    pub display_name: String,
    pub created_at: String,
}
