//! The one generation request every protocol translates into: plain data, named in the
//! gateway's own terms, with the caller's own parameter names kept for errors.
//!
//! A protocol's translator fills this from its wire type (chat messages, a Responses
//! conversation, legacy prompts); the facade (`generation::Generator`) hands it to
//! [`super::plan`], which checks it against the model and templates and tokenizes it. Nothing
//! here knows HTTP or a wire format beyond the JSON values a chat template reads.

use serde_json::{Map, Value};

pub(crate) use super::params::Sampling;

/// What to generate, before it is checked against the model.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The public model name the caller asked for.
    pub model: String,
    /// The prompt: a conversation for the chat template, or prompts given as text or ids.
    pub prompt: Prompt,
    /// Sampling, penalties, `n`, stops.
    pub sampling: Sampling,
    /// The most tokens to generate per choice, as the caller set it (at least 1).
    pub max_tokens: Option<u32>,
    /// `max_tokens` when the caller set none (`None`: the gateway's default output budget).
    pub default_max_tokens: Option<u32>,
    /// Whether to return log probabilities.
    pub logprobs: bool,
    /// Alternatives per token with them, as the caller set it (at most
    /// [`MAX_TOP_LOGPROBS`](super::params::MAX_TOP_LOGPROBS)).
    pub top_logprobs: Option<u32>,
    /// Tools offered to the model, and whether it may call them.
    pub tools: Tools,
    /// A shape the output must take.
    pub output: OutputFormat,
    /// How hard a reasoning model should think (`none` .. `xhigh`).
    pub reasoning_effort: Option<String>,
    /// The caller's metadata (its `priority` orders the model's queue).
    pub metadata: Option<Value>,
    /// What the caller calls each parameter, for errors.
    pub names: ParamNames,
}

/// A prompt, as the protocol gave it.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, rendered by the model's chat template.
    Chat {
        /// Messages, already in the template's shape.
        messages: Vec<Value>,
        /// Tool definitions the template shows the model, in the template's shape.
        tools: Option<Value>,
        /// Extra variables for the template.
        template_kwargs: Option<Map<String, Value>>,
    },
    /// One to many prompts: a string, strings, token ids, or lists of token ids.
    Texts(Value),
}

/// A function tool as the chat template reads it (what chat's `tools` holds).
pub(crate) fn template_tool(name: &str, description: &str, parameters: &Value) -> Value {
    serde_json::json!({"type": "function", "function": {
        "name": name,
        "description": description,
        "parameters": parameters,
    }})
}

/// Tools offered, and how the model may use them.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    /// Names of the functions offered (empty: none).
    pub names: Vec<String>,
    /// Each function's `parameters` JSON Schema, in the order of `names`.
    pub schemas: Vec<Value>,
    /// Whether each function's arguments must follow its schema exactly (`strict`).
    pub strict: Vec<bool>,
    /// Whether the model may call them.
    pub choice: ToolChoice,
    /// Whether one choice may call several.
    pub parallel: bool,
    /// The gateway's own servers whose tools the request names (the Responses API's `mcp`
    /// tools); `None` offers every server tool configured for the model and tenant.
    pub hosted: Option<Vec<HostedServer>>,
}

/// A server whose tools the gateway runs, named by a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedServer {
    /// Its label (`server_label`).
    pub label: String,
    /// Only these of its tools (`allowed_tools`); all when absent.
    pub allowed: Option<Vec<String>>,
    /// Where the request says it is (`tools[i]`), for errors.
    pub param: String,
}

/// Whether the model may call the tools offered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// It decides.
    #[default]
    Auto,
    /// It may not (and is not shown them).
    None,
    /// It must call one of them (`required`).
    Required,
    /// It must call this one.
    Named(String),
    /// A choice this gateway does not know how to force (refused).
    Other,
}

/// A shape the output must take.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum OutputFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching this schema.
    JsonSchema(Value),
}

/// The caller's names for the parameters errors point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamNames {
    /// The prompt (`messages`, `prompt`, `input`).
    pub prompt: &'static str,
    /// The output budget (`max_tokens`, `max_completion_tokens`, `max_output_tokens`).
    pub max_tokens: &'static str,
    /// Alternatives per token (`top_logprobs`, `logprobs`).
    pub top_logprobs: &'static str,
    /// The output format (`response_format`, `text.format`).
    pub output: &'static str,
    /// The output's JSON Schema (`response_format.json_schema.schema`, `text.format.schema`).
    pub schema: &'static str,
    /// The tool choice (`tool_choice`).
    pub tool_choice: &'static str,
    /// The reasoning effort (`reasoning_effort`, `reasoning.effort`).
    pub reasoning_effort: &'static str,
}

impl ParamNames {
    /// Chat completions' names (`max_tokens` for the budget; see [`Self::with_max_tokens`]).
    pub const CHAT: Self = Self {
        prompt: "messages",
        max_tokens: "max_tokens",
        top_logprobs: "top_logprobs",
        output: "response_format",
        schema: "response_format.json_schema.schema",
        tool_choice: "tool_choice",
        reasoning_effort: "reasoning_effort",
    };

    /// These names, with the budget called `name`.
    pub const fn with_max_tokens(self, name: &'static str) -> Self {
        Self {
            max_tokens: name,
            ..self
        }
    }
}
