//! `POST /v1/responses`: the request, the response object, its output items and its stream
//! events, as the OpenAI SDKs and the Open Responses specification expect them. Every key of the
//! response object is present (null where empty).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::common::{Extensions, StopParam};

/// The request body.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    /// Model name.
    pub model: String,
    /// A string (one user message) or a list of input items; required unless the request
    /// only warms a WebSocket connection up.
    #[serde(default)]
    pub input: Option<ResponseInput>,
    /// A system message put before the input (not carried to later turns).
    #[serde(default)]
    pub instructions: Option<String>,
    /// Continue the conversation of a stored response.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Keep the response for later `previous_response_id` and `GET` (default true).
    #[serde(default)]
    pub store: Option<bool>,
    /// Most tokens to generate.
    #[serde(default)]
    pub max_output_tokens: Option<Number>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Alternatives per token, with `include: ["message.output_text.logprobs"]`.
    #[serde(default)]
    pub top_logprobs: Option<Number>,
    /// Tools the model may call (function tools).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// How the model should choose tools.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether several tool calls may come at once.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Reasoning settings (`effort`, `summary`).
    #[serde(default)]
    pub reasoning: Option<Value>,
    /// Output format (`text.format`).
    #[serde(default)]
    pub text: Option<Value>,
    /// `disabled` (default) or `auto`.
    #[serde(default)]
    pub truncation: Option<String>,
    /// Up to 16 string pairs, echoed back.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// Extra output to include.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Run without holding the connection.
    #[serde(default)]
    pub background: Option<bool>,
    /// Stream events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// End-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
    /// Seed (extension, as on chat).
    #[serde(default)]
    pub seed: Option<Number>,
    /// Stop strings (extension, as on chat).
    #[serde(default)]
    pub stop: Option<StopParam>,
    /// Presence penalty (extension, as on chat).
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty (extension, as on chat).
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Extra variables for the chat template (extension, as on chat).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Sampling extensions (top level).
    #[serde(flatten)]
    pub extensions: Extensions,
    /// Sampling extensions (NVIDIA Dynamo's `nvext`).
    #[serde(default)]
    pub nvext: Option<Extensions>,
}

/// `input`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    /// One user message.
    Text(String),
    /// Input items, checked one by one (see `responses::input`).
    Items(Vec<Value>),
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Prompt tokens in detail (cached).
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Generated tokens in detail (reasoning).
    pub output_tokens_details: OutputTokensDetails,
    /// Prompt and generated tokens together.
    pub total_tokens: u64,
    /// What the response cost, when its model has a price (a Turnpike extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<super::common::Cost>,
}

/// Input token details.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to a prompt cache (the engine's prefix cache keeps blocks on its
    /// own, so none are reported).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

/// Output token details.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    /// Tokens spent reasoning.
    pub reasoning_tokens: u64,
}

impl ResponseUsage {
    /// Usage of `input` prompt tokens (`cached` of them cached) and `output` generated ones.
    pub fn new(input: u64, output: u64, cached: u64, reasoning: u64) -> Self {
        Self {
            input_tokens: input,
            input_tokens_details: InputTokensDetails {
                cached_tokens: cached,
                cache_write_tokens: 0,
            },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning,
            },
            total_tokens: input + output,
            cost: None,
        }
    }

    /// The same, with its cost in nano-units, when known.
    #[must_use]
    pub fn with_cost(mut self, nanos: Option<u64>) -> Self {
        self.cost = nanos.map(super::common::Cost);
        self
    }
}

/// Why a response is incomplete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// A text part of a message output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
    /// Log probabilities when asked for (else empty).
    #[serde(default)]
    pub logprobs: Vec<Value>,
}

impl OutputText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text".into(),
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// An output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The assistant's message.
    Message {
        /// Its id.
        id: String,
        /// Its status (`completed`, `in_progress`, `incomplete`, ...).
        status: String,
        /// Who speaks (`user`, `assistant`).
        role: String,
        /// The message's text parts.
        content: Vec<OutputText>,
    },
    /// The model's reasoning: its text as one summary part when a summary was asked for.
    Reasoning {
        /// Its id.
        id: String,
        /// Its summary parts.
        summary: Vec<Value>,
    },
    /// A tool call.
    FunctionCall {
        /// Its id.
        id: String,
        /// The id the call's output answers to.
        call_id: String,
        /// The name.
        name: String,
        /// The call's arguments, as JSON text.
        arguments: String,
        /// Its status (`completed`, `in_progress`, `incomplete`, ...).
        status: String,
    },
    /// A tool the gateway ran for the model (a gateway plugin's server tool), shown as OpenAI
    /// shows a hosted MCP tool's call: its server, arguments, and output or error.
    McpCall {
        /// Its id.
        id: String,
        /// The tool's server.
        server_label: String,
        /// The name.
        name: String,
        /// The call's arguments, as JSON text.
        arguments: String,
        /// The tool's output, when it answered.
        output: Option<String>,
        /// The tool's error, when it failed.
        error: Option<String>,
        /// Its status (`completed`, `in_progress`, `incomplete`, ...).
        status: String,
    },
}

impl OutputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Message { id, .. }
            | Self::Reasoning { id, .. }
            | Self::FunctionCall { id, .. }
            | Self::McpCall { id, .. } => id,
        }
    }
}

/// The response object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseObject {
    /// Its id.
    pub id: String,
    /// Always `response`.
    pub object: String,
    /// When it was created (Unix seconds).
    pub created_at: u64,
    /// Its status (`completed`, `in_progress`, `incomplete`, ...).
    pub status: String,
    /// Whether the response runs in the background.
    pub background: bool,
    /// When the response completed (Unix seconds).
    pub completed_at: Option<u64>,
    /// The error, when the response failed.
    pub error: Option<Value>,
    /// Why the response is incomplete, when it is.
    pub incomplete_details: Option<IncompleteDetails>,
    /// The system instructions.
    pub instructions: Option<String>,
    /// The most tokens to generate.
    pub max_output_tokens: Option<u64>,
    /// The most tool calls the response may make.
    pub max_tool_calls: Option<u64>,
    /// The model.
    pub model: String,
    /// The output items, in order.
    pub output: Vec<OutputItem>,
    /// The output's text, all parts joined (the SDKs' convenience).
    pub output_text: String,
    /// Whether the model may call several tools at once.
    pub parallel_tool_calls: bool,
    /// `presence_penalty`.
    pub presence_penalty: f64,
    /// `frequency_penalty`.
    pub frequency_penalty: f64,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// The caller's prompt-cache key.
    pub prompt_cache_key: Option<String>,
    /// Reasoning settings.
    pub reasoning: Value,
    /// The caller's end-user id for abuse monitoring.
    pub safety_identifier: Option<String>,
    /// The service tier.
    pub service_tier: String,
    /// Whether to keep the response for retrieval.
    pub store: bool,
    /// `temperature`.
    pub temperature: f64,
    /// The text output's settings (`format`).
    pub text: Value,
    /// Whether and which tool the model must call.
    pub tool_choice: Value,
    /// The tools offered.
    pub tools: Vec<Value>,
    /// Alternatives per token with their log probabilities.
    pub top_logprobs: u32,
    /// `top_p`.
    pub top_p: f64,
    /// What to do with a conversation over the context (`auto`, `disabled`).
    pub truncation: String,
    /// Token counts.
    pub usage: Option<ResponseUsage>,
    /// The end-user id, when one was sent (OpenAI's schema has no null for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The caller's metadata.
    pub metadata: Map<String, Value>,
}

/// The list `GET /v1/responses/{id}/input_items` returns.
#[derive(Debug, Clone, Serialize)]
pub struct InputItemList {
    /// Always `list`.
    pub object: &'static str,
    /// The items, in the order asked for.
    pub data: Vec<Value>,
    /// The first item's id.
    pub first_id: Option<String>,
    /// The last item's id.
    pub last_id: Option<String>,
    /// Whether more items follow.
    pub has_more: bool,
}
