//! The JSON documents that cross the ABI: generation parameters (host -> plugin), model
//! descriptors and stats (plugin -> host).
//!
//! Parameters travel as JSON so a parameter can be added without touching the ABI. Each side
//! ignores keys it does not know; the host only sends a parameter the model's [`Capabilities`]
//! declare, so "ignored" never means "silently not enforced".

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The most tokens a request may ask to be drafted per step (`num_assistant_tokens`).
pub const MAX_ASSISTANT_TOKENS: u32 = 16;

/// Parses a JSON object into `T`; empty text is `{}`. Anything but an object is refused (serde
/// would otherwise read a struct from an array, by position).
pub fn from_json_object<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let text = text.trim_start();
    let text = if text.is_empty() { "{}" } else { text };
    if !text.starts_with('{') {
        return Err("expected a JSON object".into());
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// The highest priority of background work (batch lines): below every priority a client may
/// ask for. The default engine schedules such requests only in steps where no other request
/// waits to be admitted or is still in its prompt, so interactive work never waits behind
/// them for more than the step already under way.
pub const BACKGROUND_PRIORITY: i32 = -1001;

/// Generation parameters of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerationParams {
    /// The gateway's id of the request (for logs and traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Most tokens to generate per choice.
    pub max_tokens: u32,
    /// Fewest tokens to generate before end-of-sequence or stop tokens count.
    pub min_tokens: u32,
    /// Number of choices.
    pub n: u32,
    /// Sampling temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Drop tokens below `min_p` times the top probability; 0 disables.
    pub min_p: f32,
    /// OpenAI presence penalty, in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in [-2, 2].
    pub frequency_penalty: f32,
    /// Multiplicative repetition penalty; 1 disables.
    pub repetition_penalty: f32,
    /// Seed for reproducible sampling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Token ids that end a choice (besides the model's end-of-sequence tokens).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Report each token's log probability.
    pub logprobs: bool,
    /// Report this many alternatives per token (0..=20).
    pub top_logprobs: u32,
    /// Constrain output to a grammar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<Grammar>,
    /// Scheduling priority; higher runs first. At or below [`BACKGROUND_PRIORITY`] a request is
    /// background work (a batch line): an engine may hold it back while other work waits.
    pub priority: i32,
    /// The tenant the request belongs to (for fair scheduling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The tenant's share of the engine under contention, relative to other tenants (weighted
    /// fair queuing); 1 when the gateway has no tenants.
    pub tenant_weight: u32,
    /// How much a reasoning model should reason: `none`, `minimal`, `low`, `medium`, `high` or
    /// `xhigh`; absent when the client did not say. Engines that do not reason ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// When the request offers tools the model may call (and nothing else shapes its output),
    /// the grammar of one call in the model's own tool-call envelope, each function's
    /// arguments held to its schema; sent only to models whose capabilities declare
    /// `tool_call_grammar` (the simulator, which draws its tool calls from it; an engine that
    /// samples a model lets its weights decide whether to call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_grammar: Option<Grammar>,
    /// Speculative decoding: tokens to draft per step for this request (`num_assistant_tokens`;
    /// 0: none); the engine's own choice, adapted to acceptance, when absent. Sent only to
    /// models whose capabilities declare `speculative`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_assistant_tokens: Option<u32>,
    /// Speculative decoding: a draft ends at its first token whose probability under the
    /// draft model is below this, in `(0, 1]` (`assistant_confidence_threshold`). Sent only to
    /// models whose capabilities declare `draft_confidence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_confidence_threshold: Option<f32>,
    /// Beam search with this many beams (`best_of` greater than `n`), returning the `n` best;
    /// deterministic (the sampling settings do not apply). Sent only to models whose
    /// capabilities declare a `max_beam_width` at least this wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beam_width: Option<u32>,
    /// Beam search scores a finished sequence by its cumulative log-probability over its
    /// length to this power (above 0 favours longer sequences).
    pub length_penalty: f32,
    /// Diverse beam search: the beams split into this many groups of equal size (1: plain
    /// beam search).
    pub beam_groups: u32,
    /// Diverse beam search: subtracted from a beam's score once for each group before its own
    /// that chose the same token at the same step.
    pub diversity_penalty: f32,
    /// A resumption after another engine failed mid-stream: the prompt's last tokens are output
    /// already delivered ([`crate::resume`]). Sent only to models whose capabilities declare
    /// `resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<crate::resume::Resume>,
}

impl Default for GenerationParams {
    fn default() -> Self {
        Self {
            request_id: None,
            max_tokens: 16,
            min_tokens: 0,
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: false,
            top_logprobs: 0,
            grammar: None,
            priority: 0,
            tenant: None,
            tenant_weight: 1,
            reasoning_effort: None,
            tool_call_grammar: None,
            num_assistant_tokens: None,
            assistant_confidence_threshold: None,
            beam_width: None,
            length_penalty: 1.0,
            beam_groups: 1,
            diversity_penalty: 1.0,
            resume: None,
        }
    }
}

impl GenerationParams {
    /// Parses and range-checks parameters; the error is a one-line reason.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let params: Self =
            from_json_object(text).map_err(|e| format!("invalid generation parameters: {e}"))?;
        params.check()?;
        Ok(params)
    }

    fn check(&self) -> Result<(), String> {
        let in_range = |name: &str, v: f32, lo: f32, hi: f32| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(())
            } else {
                Err(format!("{name} must be in [{lo}, {hi}], got {v}"))
            }
        };
        if self.n == 0 {
            return Err("n must be at least 1".into());
        }
        if self.min_tokens > self.max_tokens {
            return Err(format!(
                "min_tokens ({}) exceeds max_tokens ({})",
                self.min_tokens, self.max_tokens
            ));
        }
        in_range("temperature", self.temperature, 0.0, 100.0)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        in_range("min_p", self.min_p, 0.0, 1.0)?;
        in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!(
                "repetition_penalty must be positive, got {}",
                self.repetition_penalty
            ));
        }
        if self
            .num_assistant_tokens
            .is_some_and(|k| k > MAX_ASSISTANT_TOKENS)
        {
            return Err(format!(
                "num_assistant_tokens must be at most {MAX_ASSISTANT_TOKENS}"
            ));
        }
        if let Some(threshold) = self.assistant_confidence_threshold {
            if !(threshold > 0.0 && threshold <= 1.0) {
                return Err(format!(
                    "assistant_confidence_threshold must be in (0, 1], got {threshold}"
                ));
            }
            if self.num_assistant_tokens.is_some() {
                return Err(
                    "num_assistant_tokens and assistant_confidence_threshold exclude each other"
                        .into(),
                );
            }
        }
        if let Some(width) = self.beam_width {
            if width < self.n {
                return Err(format!("beam_width ({width}) is below n ({})", self.n));
            }
            in_range("length_penalty", self.length_penalty, -10.0, 10.0)?;
            in_range("diversity_penalty", self.diversity_penalty, 0.0, 100.0)?;
            if self.beam_groups == 0 || !width.is_multiple_of(self.beam_groups) {
                return Err(format!(
                    "beam_groups ({}) must divide beam_width ({width})",
                    self.beam_groups
                ));
            }
        }
        if let Some(resume) = self.resume {
            resume.check(self)?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            ));
        }
        Ok(())
    }
}

/// A constraint on the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Grammar {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against a JSON Schema.
    JsonSchema {
        /// The schema.
        schema: Value,
    },
    /// Text matching a regular expression.
    Regex {
        /// The pattern.
        pattern: String,
    },
    /// Text in a Lark grammar.
    Lark {
        /// The grammar.
        grammar: String,
    },
}

/// Parameters of an embeddings request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmbedParams {
    /// Truncate vectors to this many dimensions (when the model supports it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
}

impl EmbedParams {
    /// The vector size to return for a model whose vectors have `full` dimensions: `full`
    /// unless `dimensions` asks for fewer; the error is a one-line reason.
    pub fn dimensions_for(&self, full: usize) -> Result<usize, String> {
        match self.dimensions {
            None => Ok(full),
            Some(d) if d >= 1 && d as usize <= full => Ok(d as usize),
            Some(d) => Err(format!("dimensions must be between 1 and {full}, got {d}")),
        }
    }
}

/// A model an engine serves, as `models` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The id clients name.
    pub id: String,
    /// Who publishes the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_by: Option<String>,
    /// Context window in tokens (prompt plus output).
    pub max_context: u32,
    /// Token ids are below this.
    pub vocab_size: u32,
    /// End-of-sequence token ids.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Path of the `tokenizer.json` the gateway should use for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Vector size when the model serves embeddings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_dim: Option<u32>,
    /// What generation parameters the model honours.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// What a model honours. The host must refuse (not drop) a parameter a model cannot honour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capabilities {
    /// The model generates text (false for an embedding-only model such as a BERT encoder;
    /// the host then refuses every generating request for it). True when an engine says
    /// nothing.
    pub generation: bool,
    /// Largest `n`.
    pub max_n: u32,
    /// Per-token log probabilities.
    pub logprobs: bool,
    /// Largest `top_logprobs`.
    pub max_top_logprobs: u32,
    /// Temperature, top_p, top_k, min_p and seeds.
    pub sampling: bool,
    /// Presence, frequency and repetition penalties.
    pub penalties: bool,
    /// Grammar-constrained output.
    pub grammar: bool,
    /// The engine draws its tool calls from the `tool_call_grammar` parameter (the simulator
    /// does); the host sends that parameter only to such models.
    pub tool_call_grammar: bool,
    /// The model decodes speculatively and takes `num_assistant_tokens` per request.
    pub speculative: bool,
    /// Its drafts come from a draft model, whose probabilities end a draft where they fall
    /// under a request's `assistant_confidence_threshold`.
    pub draft_confidence: bool,
    /// Widest beam search (`beam_width`); 0 when the model does not search beams.
    pub max_beam_width: u32,
    /// The model continues a resumed request exactly ([`GenerationParams::resume`]): the
    /// penalties, the grammar, `min_tokens` and the seed's position carry on from the output
    /// already delivered.
    pub resume: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            generation: true,
            max_n: 1,
            logprobs: false,
            max_top_logprobs: 0,
            sampling: false,
            penalties: false,
            grammar: false,
            tool_call_grammar: false,
            speculative: false,
            draft_confidence: false,
            max_beam_width: 0,
            resume: false,
        }
    }
}

/// Counters an engine reports through `stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Accepted, waiting to run.
    #[serde(default)]
    pub queued: u64,
    /// Running now.
    #[serde(default)]
    pub running: u64,
    /// Ended with `TP_STATUS_OK`.
    #[serde(default)]
    pub completed: u64,
    /// Ended cancelled.
    #[serde(default)]
    pub cancelled: u64,
    /// Ended with an error.
    #[serde(default)]
    pub failed: u64,
    /// Engine-specific counters.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_params_are_the_defaults() {
        assert_eq!(
            GenerationParams::from_json(""),
            Ok(GenerationParams::default())
        );
        assert_eq!(
            GenerationParams::from_json("{}"),
            Ok(GenerationParams::default())
        );
    }

    #[test]
    fn unknown_keys_are_ignored_and_ranges_checked() {
        let p = GenerationParams::from_json(r#"{"max_tokens": 3, "from_the_future": true}"#);
        assert_eq!(p.map(|p| p.max_tokens), Ok(3));
        for bad in [
            r#"{"n": 0}"#,
            r#"{"top_p": 0}"#,
            r#"{"temperature": -1}"#,
            r#"{"top_logprobs": 21}"#,
            r#"{"min_tokens": 5, "max_tokens": 2}"#,
            r#"{"max_tokens": "many"}"#,
            "not json",
            "[16]",
        ] {
            assert!(
                GenerationParams::from_json(bad).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn grammar_is_tagged() {
        let p = GenerationParams::from_json(
            r#"{"grammar": {"type": "json_schema", "schema": {"type": "object"}}}"#,
        )
        .map(|p| p.grammar);
        assert!(matches!(p, Ok(Some(Grammar::JsonSchema { .. }))));
    }

    #[test]
    fn model_info_tolerates_missing_and_extra_keys() {
        let m: ModelInfo = serde_json::from_str(
            r#"{"id": "m", "max_context": 128, "vocab_size": 100, "new_key": 1}"#,
        )
        .expect("parses");
        assert_eq!(m.capabilities, Capabilities::default());
        assert!(m.embedding_dim.is_none());
    }
}
