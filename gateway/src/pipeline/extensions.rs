//! Sampling settings beyond the common ones, in the gateway's own terms.
//!
//! Protocols accept these under other engines' names (vLLM's top-level parameters and `nvext`,
//! OpenVINO Model Server's speculative and beam parameters, Anthropic's `top_k`); each
//! protocol's translator fills [`SamplingExtensions`] from its own wire type, so the pipeline
//! reads one struct whatever the caller spoke. Integers arrive typed and within their absolute
//! ranges (checked at the edge); what depends on the model is checked where the request meets
//! it.

use serde_json::Value;

/// Sampling extensions of a generation request (every field optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingExtensions {
    /// Keep the k most likely tokens (`top_k`; 0: all).
    pub top_k: Option<u32>,
    /// Drop tokens below this fraction of the top probability (`min_p`).
    pub min_p: Option<f64>,
    /// Multiplicative repetition penalty (`repetition_penalty`).
    pub repetition_penalty: Option<f64>,
    /// Keep generating past end-of-sequence (`ignore_eos`).
    pub ignore_eos: Option<bool>,
    /// Token ids that end a choice (`stop_token_ids`).
    pub stop_token_ids: Option<Vec<u32>>,
    /// Fewest tokens before a stop counts (`min_tokens`).
    pub min_tokens: Option<u32>,
    /// Always pick the most likely token (`greedy`).
    pub greedy: Option<bool>,
    /// Output matching this regular expression (`guided_regex`).
    pub guided_regex: Option<String>,
    /// Output in this Lark grammar (`guided_grammar`).
    pub guided_grammar: Option<String>,
    /// Output that is exactly one of these strings (`guided_choice`).
    pub guided_choice: Option<Vec<String>>,
    /// Output valid under this JSON Schema (`guided_json`).
    pub guided_json: Option<Value>,
    /// The same four shapes under `structured_outputs`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// Tokens drafted per step (`num_assistant_tokens`).
    pub num_assistant_tokens: Option<u32>,
    /// A draft model's confidence below which it stops drafting
    /// (`assistant_confidence_threshold`).
    pub assistant_confidence_threshold: Option<f64>,
    /// Beam search with this many beams when above `n` (`best_of`).
    pub best_of: Option<u32>,
    /// Beam search's length normalisation exponent (`length_penalty`).
    pub length_penalty: Option<f64>,
    /// Diverse beam search: groups the beams split into (`num_beam_groups`).
    pub num_beam_groups: Option<u32>,
    /// Diverse beam search: the price of a token an earlier group chose at the same step
    /// (`diversity_penalty`).
    pub diversity_penalty: Option<f64>,
}

/// Output shapes under `structured_outputs` (one at most, with the `guided_*` ones).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StructuredOutputs {
    /// A regular expression.
    pub regex: Option<String>,
    /// A Lark grammar.
    pub grammar: Option<String>,
    /// Exact alternatives.
    pub choice: Option<Vec<String>>,
    /// A JSON Schema.
    pub json: Option<Value>,
}
