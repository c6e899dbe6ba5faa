//! Wire types shared by the OpenAI endpoints.
//!
//! Request types are lenient where clients are (unknown fields are ignored, numbers are taken as
//! any JSON number and range-checked later, in `pipeline::params`); response types serialise every
//! key clients expect, `null` included.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopParam {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage of the whole request.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling extensions beyond OpenAI's, accepted at the top level and under `nvext`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Extensions {
    /// Keep the k most likely tokens.
    pub top_k: Option<Number>,
    /// Drop tokens below this fraction of the top probability.
    pub min_p: Option<f64>,
    /// Multiplicative repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Keep generating past end-of-sequence.
    pub ignore_eos: Option<bool>,
    /// Token ids that end a choice.
    pub stop_token_ids: Option<Vec<Value>>,
    /// Fewest tokens before a stop counts.
    pub min_tokens: Option<Number>,
    /// Always pick the most likely token (`temperature` 0).
    pub greedy: Option<bool>,
    /// Output matching this regular expression (vLLM's name).
    pub guided_regex: Option<String>,
    /// Output in this Lark grammar (vLLM's name).
    pub guided_grammar: Option<String>,
    /// Output that is exactly one of these strings (vLLM's name).
    pub guided_choice: Option<Vec<String>>,
    /// Output valid under this JSON Schema (vLLM's name).
    pub guided_json: Option<Value>,
    /// The same four under vLLM's newer object (`regex`, `grammar`, `choice`, `json`).
    pub structured_outputs: Option<GuidedOutputs>,
    /// Speculative decoding: tokens drafted per step (OpenVINO Model Server's name).
    pub num_assistant_tokens: Option<Number>,
    /// Speculative decoding with a draft model: its confidence below which it stops drafting.
    pub assistant_confidence_threshold: Option<f64>,
    /// Beam search with this many beams when above `n` (OpenVINO Model Server's and vLLM's
    /// name; a top-level field of the legacy completions request).
    pub best_of: Option<Number>,
    /// Beam search's length normalisation exponent.
    pub length_penalty: Option<f64>,
    /// Diverse beam search: groups the beams split into (`transformers`' name).
    pub num_beam_groups: Option<Number>,
    /// Diverse beam search: the price of a token an earlier group chose at the same step.
    pub diversity_penalty: Option<f64>,
}

/// vLLM's `structured_outputs` object.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GuidedOutputs {
    /// A regular expression.
    pub regex: Option<String>,
    /// A Lark grammar.
    pub grammar: Option<String>,
    /// Exact alternatives.
    pub choice: Option<Vec<String>>,
    /// A JSON Schema.
    pub json: Option<Value>,
}

impl Extensions {
    /// `self` with unset fields taken from `other` (top-level values win over `nvext`).
    pub fn or(self, other: Option<Extensions>) -> Extensions {
        let Some(o) = other else { return self };
        Extensions {
            top_k: self.top_k.or(o.top_k),
            min_p: self.min_p.or(o.min_p),
            repetition_penalty: self.repetition_penalty.or(o.repetition_penalty),
            ignore_eos: self.ignore_eos.or(o.ignore_eos),
            stop_token_ids: self.stop_token_ids.or(o.stop_token_ids),
            min_tokens: self.min_tokens.or(o.min_tokens),
            greedy: self.greedy.or(o.greedy),
            guided_regex: self.guided_regex.or(o.guided_regex),
            guided_grammar: self.guided_grammar.or(o.guided_grammar),
            guided_choice: self.guided_choice.or(o.guided_choice),
            guided_json: self.guided_json.or(o.guided_json),
            structured_outputs: self.structured_outputs.or(o.structured_outputs),
            num_assistant_tokens: self.num_assistant_tokens.or(o.num_assistant_tokens),
            assistant_confidence_threshold: self
                .assistant_confidence_threshold
                .or(o.assistant_confidence_threshold),
            best_of: self.best_of.or(o.best_of),
            length_penalty: self.length_penalty.or(o.length_penalty),
            num_beam_groups: self.num_beam_groups.or(o.num_beam_groups),
            diversity_penalty: self.diversity_penalty.or(o.diversity_penalty),
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens, counted by the gateway.
    pub prompt_tokens: u64,
    /// Generated tokens, counted by the engine.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// Breakdown of the prompt tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Breakdown of the generated tokens (reasoning models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
    /// What the request cost, when its model has a price (a Turnpike extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// A cost in nano-units (1e-9) of the gateway's currency, written as a JSON number of units
/// (`0.00012345`), so the sums a gateway keeps stay exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost(pub u64);

impl Serialize for Cost {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0 as f64 / 1e9)
    }
}

impl<'de> serde::Deserialize<'de> for Cost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let units = f64::deserialize(d)?;
        Ok(Self((units.max(0.0) * 1e9).round() as u64))
    }
}

/// Reasoning part of the generated tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: u64,
}

/// Cached part of the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from a prefix cache.
    pub cached_tokens: u64,
}

impl Usage {
    /// Usage from the three counts.
    pub fn new(prompt: u64, completion: u64, cached: u64) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: cached,
            }),
            completion_tokens_details: None,
            cost: None,
        }
    }

    /// The same, with its cost in nano-units, when known.
    #[must_use]
    pub fn with_cost(mut self, nanos: Option<u64>) -> Self {
        self.cost = nanos.map(Cost);
        self
    }

    /// The same, with the reasoning part of the generated tokens (shown when there is one).
    #[must_use]
    pub fn with_reasoning(mut self, reasoning: u64) -> Self {
        self.completion_tokens_details = (reasoning > 0).then_some(CompletionTokensDetails {
            reasoning_tokens: reasoning,
        });
        self
    }
}

/// One token in the chat `logprobs.content` format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// Chat `logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null (no refusals).
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// Legacy completions `logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log probabilities.
    pub token_logprobs: Vec<Option<f32>>,
    /// Per token, the alternatives as `{token: logprob}`.
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<u64>,
}
