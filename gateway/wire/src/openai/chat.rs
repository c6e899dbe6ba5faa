//! `POST /v1/chat/completions`: request, response, and stream chunks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::common::{ChatLogprobs, Extensions, StopParam, StreamOptions, Usage};

/// The request body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (deprecated name).
    #[serde(default)]
    pub max_tokens: Option<Number>,
    /// Most tokens to generate.
    #[serde(default)]
    pub max_completion_tokens: Option<Number>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Number of choices.
    #[serde(default)]
    pub n: Option<Number>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<Number>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopParam>,
    /// Return log probabilities.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token (0..=20).
    #[serde(default)]
    pub top_logprobs: Option<Number>,
    /// Presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Token biases (unsupported unless empty).
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// End-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
    /// Free-form metadata, for logs.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    /// How the model should choose tools.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether several tool calls may come at once.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Constrain the output format.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Extra variables for the chat template.
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// How much a reasoning model should reason (`none` .. `xhigh`).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Sampling extensions (top level).
    #[serde(flatten)]
    pub extensions: Extensions,
    /// Sampling extensions (NVIDIA Dynamo's `nvext`).
    #[serde(default)]
    pub nvext: Option<Extensions>,
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    /// Instructions.
    System {
        /// The text.
        content: Content,
        /// Optional author name.
        #[serde(default)]
        name: Option<String>,
    },
    /// Instructions (newer name for `system`).
    Developer {
        /// The text.
        content: Content,
        /// Optional author name.
        #[serde(default)]
        name: Option<String>,
    },
    /// The user.
    User {
        /// The text.
        content: Content,
        /// Optional author name.
        #[serde(default)]
        name: Option<String>,
    },
    /// An earlier answer.
    Assistant {
        /// The text, absent when the answer was tool calls.
        #[serde(default)]
        content: Option<Content>,
        /// Tool calls the model made.
        #[serde(default)]
        tool_calls: Option<Vec<ToolCall>>,
        /// Optional author name.
        #[serde(default)]
        name: Option<String>,
    },
    /// A tool's result.
    Tool {
        /// The result.
        content: Content,
        /// The call it answers.
        tool_call_id: String,
    },
}

/// Message content: text, or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts.
    Parts(Vec<ContentPart>),
}

/// A part of message content.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image (unsupported by text models; its data is not read).
    ImageUrl {},
    /// Audio (unsupported by text models; its data is not read).
    InputAudio {},
    /// A file (unsupported by text models; its data is not read).
    File {},
    /// A refusal (in assistant messages).
    Refusal {
        /// The refusal text.
        refusal: String,
    },
}

/// A tool the model may call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDefinition,
}

/// A callable function.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionDefinition {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Whether arguments must match the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A tool call in an assistant message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

/// The function called and its arguments (a JSON string).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema.
    JsonSchema {
        /// The schema and its options.
        json_schema: JsonSchemaFormat,
    },
}

/// The schema of `response_format: json_schema` (its `name` and `strict` are accepted and
/// not read: the schema is always enforced exactly).
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema.
    #[serde(default)]
    pub schema: Option<Value>,
}

/// The non-streaming response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-...`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model as requested.
    pub model: String,
    /// The backend configuration that served it.
    pub system_fingerprint: String,
    /// The answers.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// One answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: u32,
    /// The message.
    pub message: AssistantMessage,
    /// Log probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: Option<&'static str>,
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text.
    pub content: Option<String>,
    /// Always null: this server does not refuse.
    pub refusal: Option<String>,
    /// The tools the model called, when it called any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The model's reasoning (models with reasoning markers; the vLLM field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    /// Same id in every chunk.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    /// Same in every chunk.
    pub created: u64,
    /// Same in every chunk.
    pub model: String,
    /// Same in every chunk.
    pub system_fingerprint: String,
    /// The choices this chunk advances (empty in the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Present (null but in the last) when `include_usage` was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One choice's part of a chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Choice index.
    pub index: u32,
    /// New text (and the role, in a choice's first chunk).
    pub delta: Delta,
    /// Log probabilities of the tokens in this chunk.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in exactly one chunk per choice, its last.
    pub finish_reason: Option<&'static str>,
}

/// The change a chunk carries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `assistant` in a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Null in the first chunk, as OpenAI sends it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Option<String>>,
    /// A piece of a tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// New reasoning text (models with reasoning markers; the vLLM field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A piece of a streamed tool call: the first names the call (`id`, `type`, `function.name`),
/// later ones add to `function.arguments`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    /// The call's index within the choice.
    pub index: u32,
    /// `call_...`, in the first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in the first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name and arguments so far.
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallDelta {
    /// The name, in the first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    pub arguments: String,
}
