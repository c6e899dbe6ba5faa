//! Wire types of Anthropic's Messages API (serde only, no behaviour): the request, the message
//! it answers with, the streamed events, and the error body.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/messages` (and, without `max_tokens`, `/v1/messages/count_tokens`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    /// The model.
    pub model: String,
    /// The most tokens to generate.
    #[serde(default)]
    pub max_tokens: Option<serde_json::Number>,
    /// The conversation.
    pub messages: Vec<InputMessage>,
    /// The system prompt: a string or text blocks.
    #[serde(default)]
    pub system: Option<Value>,
    /// `temperature`.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// `top_p`.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// `top_k`.
    #[serde(default)]
    pub top_k: Option<serde_json::Number>,
    /// Strings that end generation.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Whether to stream the answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// The caller's metadata.
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// The tools offered.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Whether and which tool the model must call.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Extended-thinking settings.
    #[serde(default)]
    pub thinking: Option<Value>,
    /// The service tier.
    #[serde(default)]
    pub service_tier: Option<String>,
}

/// A message of the conversation: a string, or content blocks (read by the translator, which
/// names a bad block by its place).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// Who speaks (`user`, `assistant`).
    pub role: String,
    /// The message's content: a string or content blocks.
    pub content: Value,
}

/// `metadata`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The caller's end-user id.
    #[serde(default)]
    pub user_id: Option<String>,
}

/// A content block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning (`signature` is empty: this gateway does not sign it).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// The reasoning's signature (empty: this gateway does not sign it).
        signature: String,
    },
    /// A tool call.
    ToolUse {
        /// Its id.
        id: String,
        /// The name.
        name: String,
        /// The call's arguments.
        input: Value,
    },
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache (always 0 here).
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
}

/// The answer (`type: "message"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// Its id.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Who speaks (`user`, `assistant`).
    pub role: &'static str,
    /// The model.
    pub model: String,
    /// The answer's content blocks.
    pub content: Vec<ContentBlock>,
    /// Why generation stopped.
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// The error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    /// The error's type (`invalid_request_error`, `overloaded_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A message for people.
    pub message: String,
}

/// A model in `GET /v1/models`, as Anthropic lists them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Always `model`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Its id.
    pub id: String,
    /// The model's name for people.
    pub display_name: String,
    /// When it was created (Unix seconds).
    pub created_at: String,
}
