//! The JSON documents hooks read and write, as Rust types. The ABI passes them as UTF-8 JSON
//! (see `TgPluginApiV1` in [`crate::abi`]); the SDK and the host parse them with these types, so
//! both sides agree on one definition. Every document may gain keys in a later minor version:
//! readers ignore keys they do not know.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `describe` writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Description {
    /// The tools the plugin runs.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
}

/// A tool a plugin runs for the gateway (a "server tool"): shown to the model like any function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its function name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// Its arguments' JSON Schema.
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    /// The server it belongs to (an MCP server's label), shown with its calls; the plugin's
    /// name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// One message of a request, as a guard sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// Its text (`null` when it has none, as an assistant message with only tool calls).
    pub content: Option<String>,
}

/// A request, as a guard sees it (before it is templated and tokenized).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardRequest {
    /// The caller's tenant.
    pub tenant: String,
    /// The model it asked for.
    pub model: String,
    /// `chat`, `completions`, `responses`, `messages`, ...
    pub endpoint: String,
    /// A conversation's messages (chat-shaped requests).
    #[serde(default)]
    pub messages: Option<Vec<GuardMessage>>,
    /// Prompt texts (completion-shaped requests).
    #[serde(default)]
    pub prompt: Option<Vec<String>>,
    /// The names of the tools offered to the model.
    #[serde(default)]
    pub tools: Vec<String>,
    /// The caller's metadata.
    #[serde(default)]
    pub metadata: Value,
}

/// A guard's refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The HTTP status, 400 to 499.
    pub status: u16,
    /// The OpenAI-style error code (`content_policy_violation`, ...).
    pub code: String,
    /// What the client is told.
    pub message: String,
}

/// What a guard decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Let it through.
    Allow,
    /// Refuse it.
    Reject(Rejection),
    /// Let it through with these texts (same number of messages or prompts).
    Rewrite(GuardRequest),
}

/// What a transform is opened for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformContext {
    /// The caller's tenant.
    pub tenant: String,
    /// The model.
    pub model: String,
    /// The endpoint.
    pub endpoint: String,
    /// Which choice's text it sees.
    pub choice: u32,
}

/// A tool call, as the plugin receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool.
    pub name: String,
    /// Its arguments, as the model wrote them (an object, or the text when it was not JSON).
    pub arguments: Value,
    /// Milliseconds the host waits before it cancels the call.
    pub deadline_ms: u64,
    /// The caller's tenant.
    #[serde(default)]
    pub tenant: String,
    /// The model that called it.
    #[serde(default)]
    pub model: String,
}
