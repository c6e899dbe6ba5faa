//! What a generation yields ([`GenEvent`]): text, reasoning, tool calls, the gateway's own tool
//! runs, each choice's end and the usage, in the gateway's own terms. Plain data shared by the
//! stream that makes them (`run`), the fold and every protocol's renderer.

use turnpike_engine_api::{Finish, FinishReason};

use crate::error::ApiError;
use crate::spend::{Money, Usage};

/// One token's log probability, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (its bytes, lossily).
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: f32,
    /// Alternatives: text, bytes, log probability.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Why a choice ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// End of turn, stop token, or stop string.
    Stop,
    /// `max_tokens` or the context window.
    Length,
    /// The model called tools and stopped.
    ToolCalls,
    /// One of the request's stop strings matched (its index among them).
    StopString(u32),
}

impl Finished {
    /// `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop | Self::StopString(_) => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
        }
    }

    pub(super) fn from_engine(finish: Finish) -> Self {
        match finish.reason {
            Some(FinishReason::Length) => Self::Length,
            _ => Self::Stop,
        }
    }
}

/// Token counts of the whole generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Prompt tokens (counted here).
    pub prompt: u64,
    /// Generated tokens (counted by the engine).
    pub completion: u64,
    /// Prompt tokens served from the engine's cache.
    pub cached: u64,
    /// Generated tokens that were reasoning (for models with reasoning markers).
    pub reasoning: u64,
    /// What they cost, when the model has a price (set as the generation settles).
    pub cost: Option<Money>,
}

impl Totals {
    /// The counts a cost is computed from.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt: self.prompt,
            cached: self.cached,
            completion: self.completion,
            reasoning: self.reasoning,
        }
    }
}

/// A server tool call the gateway ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerToolRun {
    /// The choice it belongs to.
    pub choice: u32,
    /// The model's call id (`call_...`).
    pub call_id: String,
    /// The plugin that ran it.
    pub server: String,
    /// The tool.
    pub name: String,
    /// Its arguments as the model wrote them.
    pub arguments: String,
    /// Its output, or why it failed (shown to the model either way).
    pub output: Result<String, String>,
}

/// What a generation yields.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// New text of a choice, with the log probabilities of the tokens that made it.
    Text {
        /// Choice index (prompt index times `n`, plus the choice).
        choice: u32,
        /// The text (may be empty when only log probabilities are new).
        text: String,
        /// Per token, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// New reasoning text of a choice (between the model's reasoning markers).
    Reasoning {
        /// Choice index.
        choice: u32,
        /// The text.
        text: String,
    },
    /// A tool call of a choice, whole.
    ToolCall {
        /// Choice index.
        choice: u32,
        /// The call's index within the choice.
        index: u32,
        /// `call_...`, the same in streamed and folded responses.
        id: String,
        /// Function name.
        name: String,
        /// Arguments as JSON text.
        arguments: String,
    },
    /// A tool the gateway ran for the model (a gateway plugin's server tool), and its outcome;
    /// the next round of the conversation follows.
    ServerTool(Box<ServerToolRun>),
    /// A choice ended.
    Finish {
        /// Choice index.
        choice: u32,
        /// Why.
        reason: Finished,
    },
    /// Everything ended; the last event.
    Usage(Totals),
    /// The engine failed after the response began; the last event.
    Error(ApiError),
}
