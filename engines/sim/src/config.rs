//! The simulator's configuration: the raw JSON document (unknown keys rejected) and its
//! validated form, made in one step by [`SimConfig::parse`].

use std::time::Duration;

use serde::Deserialize;
use turnpike_engine_api::json::from_json_object;

pub(crate) use crate::modes::{Reasoning, ToolCalls};
use crate::vocab::Vocab;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    seed: u64,
    #[serde(default = "default_max_running")]
    max_running: usize,
    #[serde(default = "default_max_queued")]
    max_queued: usize,
    #[serde(default)]
    errors: RawErrors,
    #[serde(default)]
    models: Option<Vec<RawModel>>,
}

fn default_max_running() -> usize {
    256
}
fn default_max_queued() -> usize {
    4096
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    #[serde(default)]
    owned_by: Option<String>,
    #[serde(default = "default_context")]
    max_context: u32,
    #[serde(default)]
    vocab_size: Option<u32>,
    #[serde(default)]
    tokenizer: Option<String>,
    #[serde(default)]
    eos_token_id: Option<u32>,
    #[serde(default = "default_embedding_dim")]
    embedding_dim: u32,
    #[serde(default = "default_max_n")]
    max_n: u32,
    #[serde(default)]
    latency: RawLatency,
    #[serde(default)]
    output: Output,
    #[serde(default)]
    reasoning: Option<Reasoning>,
    #[serde(default)]
    tool_calls: Option<ToolCalls>,
    #[serde(default)]
    errors: Option<RawErrors>,
}

fn default_context() -> u32 {
    8192
}
fn default_embedding_dim() -> u32 {
    64
}
fn default_max_n() -> u32 {
    16
}

/// A named profile or explicit figures.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawLatency {
    Preset(String),
    Figures(LatencyFigures),
}

impl Default for RawLatency {
    fn default() -> Self {
        Self::Preset("instant".into())
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LatencyFigures {
    ttft_ms: f64,
    ttft_jitter_ms: f64,
    itl_ms: f64,
    itl_jitter_ms: f64,
    prefill_us_per_token: f64,
}

/// How a model produces tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Output {
    /// Repeat the prompt's tokens, then end.
    Echo,
    /// Pseudo-random tokens from the vocabulary; with `length`, end after a number of tokens
    /// drawn from `[min, max]`.
    Random {
        #[serde(default)]
        length: Option<[u32; 2]>,
    },
    /// A fixed sequence of token ids, then end.
    Script { tokens: Vec<u32> },
}

impl Default for Output {
    fn default() -> Self {
        Self::Random { length: None }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawErrors {
    refuse_rate: f64,
    overload_rate: f64,
    unavailable_rate: f64,
    fail_midstream_rate: f64,
    fail_after_tokens: u32,
}

/// Timing of a model, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Latency {
    pub ttft: f64,
    pub ttft_jitter: f64,
    pub itl: f64,
    pub itl_jitter: f64,
    pub prefill_per_token: f64,
}

/// Injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Errors {
    pub refuse_rate: f64,
    pub overload_rate: f64,
    pub unavailable_rate: f64,
    pub fail_midstream_rate: f64,
    pub fail_after_tokens: u32,
}

/// One validated model.
#[derive(Debug, Clone)]
pub(crate) struct ModelConfig {
    pub id: String,
    pub owned_by: Option<String>,
    pub max_context: u32,
    pub vocab: Vocab,
    pub tokenizer: Option<String>,
    /// The grammar compiler over the tokenizer's vocabulary (built on first use).
    pub grammars: Option<std::sync::Arc<turnpike_grammar::Grammars>>,
    pub eos: u32,
    pub embedding_dim: u32,
    pub max_n: u32,
    pub latency: Latency,
    pub output: Output,
    pub reasoning: Option<Reasoning>,
    pub tool_calls: Option<ToolCalls>,
    pub errors: Errors,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct SimConfig {
    pub seed: u64,
    pub max_running: usize,
    pub max_queued: usize,
    pub models: Vec<ModelConfig>,
}

impl SimConfig {
    /// Parses and validates a JSON configuration; the error names the offending key.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let raw: RawConfig = from_json_object(text).map_err(|e| format!("sim config: {e}"))?;
        if raw.max_running == 0 {
            return Err("sim config: max_running must be at least 1".into());
        }
        let defaults = check_errors(raw.errors, "errors")?;
        let raw_models = raw.models.unwrap_or_else(|| {
            vec![RawModel {
                id: "sim".into(),
                owned_by: Some("turnpike".into()),
                max_context: default_context(),
                vocab_size: None,
                tokenizer: None,
                eos_token_id: None,
                embedding_dim: default_embedding_dim(),
                max_n: default_max_n(),
                latency: RawLatency::default(),
                output: Output::default(),
                reasoning: None,
                tool_calls: None,
                errors: None,
            }]
        });
        if raw_models.is_empty() {
            return Err("sim config: models must not be empty".into());
        }
        let mut models: Vec<ModelConfig> = Vec::with_capacity(raw_models.len());
        for m in raw_models {
            if models.iter().any(|seen| seen.id == m.id) {
                return Err(format!("sim config: model `{}` is listed twice", m.id));
            }
            let errors = match m.errors {
                Some(e) => check_errors(e, &format!("models.{}.errors", m.id))?,
                None => defaults,
            };
            models.push(check_model(m, errors)?);
        }
        Ok(Self {
            seed: raw.seed,
            max_running: raw.max_running,
            max_queued: raw.max_queued,
            models,
        })
    }
}

fn check_errors(raw: RawErrors, at: &str) -> Result<Errors, String> {
    for (name, rate) in [
        ("refuse_rate", raw.refuse_rate),
        ("overload_rate", raw.overload_rate),
        ("unavailable_rate", raw.unavailable_rate),
        ("fail_midstream_rate", raw.fail_midstream_rate),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            return Err(format!(
                "sim config: {at}.{name} must be in [0, 1], got {rate}"
            ));
        }
    }
    Ok(Errors {
        refuse_rate: raw.refuse_rate,
        overload_rate: raw.overload_rate,
        unavailable_rate: raw.unavailable_rate,
        fail_midstream_rate: raw.fail_midstream_rate,
        fail_after_tokens: raw.fail_after_tokens.max(1),
    })
}

fn check_latency(raw: RawLatency, at: &str) -> Result<Latency, String> {
    let figures = match raw {
        RawLatency::Preset(name) => match name.as_str() {
            "instant" => LatencyFigures::default(),
            "fast" => LatencyFigures {
                ttft_ms: 20.0,
                itl_ms: 5.0,
                ..Default::default()
            },
            "realistic" => LatencyFigures {
                ttft_ms: 250.0,
                ttft_jitter_ms: 50.0,
                itl_ms: 20.0,
                itl_jitter_ms: 4.0,
                prefill_us_per_token: 50.0,
            },
            other => {
                return Err(format!(
                    "sim config: {at}: unknown latency preset `{other}` (instant, fast, realistic)"
                ));
            }
        },
        RawLatency::Figures(f) => f,
    };
    let all = [
        figures.ttft_ms,
        figures.ttft_jitter_ms,
        figures.itl_ms,
        figures.itl_jitter_ms,
        figures.prefill_us_per_token,
    ];
    if all.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(format!(
            "sim config: {at}: latency figures must be finite and >= 0"
        ));
    }
    Ok(Latency {
        ttft: figures.ttft_ms / 1e3,
        ttft_jitter: figures.ttft_jitter_ms / 1e3,
        itl: figures.itl_ms / 1e3,
        itl_jitter: figures.itl_jitter_ms / 1e3,
        prefill_per_token: figures.prefill_us_per_token / 1e6,
    })
}

fn check_model(m: RawModel, errors: Errors) -> Result<ModelConfig, String> {
    let at = format!("models.{}", m.id);
    if m.id.trim().is_empty() {
        return Err("sim config: a model has an empty id".into());
    }
    let vocab = match (&m.tokenizer, m.vocab_size) {
        (Some(path), _) => Vocab::from_tokenizer_file(path)
            .map_err(|e| format!("sim config: {at}.tokenizer: {e}"))?,
        (None, Some(size)) => Vocab::plain(size),
        (None, None) => Vocab::plain(32_000),
    };
    if vocab.size() < 4 {
        return Err(format!(
            "sim config: {at}: the vocabulary needs at least 4 tokens"
        ));
    }
    let eos = m.eos_token_id.or(vocab.eos()).unwrap_or(2);
    if eos >= vocab.size() {
        return Err(format!(
            "sim config: {at}.eos_token_id {eos} is not below the vocabulary size {}",
            vocab.size()
        ));
    }
    if m.max_context < 2 {
        return Err(format!("sim config: {at}.max_context must be at least 2"));
    }
    if m.max_n == 0 {
        return Err(format!("sim config: {at}.max_n must be at least 1"));
    }
    if let Some(t) = &m.tool_calls {
        if !(0.0..=1.0).contains(&t.rate) {
            return Err(format!(
                "sim config: {at}.tool_calls.rate must be in [0, 1]"
            ));
        }
        if m.tokenizer.is_none() {
            return Err(format!(
                "sim config: {at}.tool_calls needs a tokenizer (calls are drawn from a grammar)"
            ));
        }
    }
    match &m.output {
        Output::Random {
            length: Some([lo, hi]),
        } if lo > hi => {
            return Err(format!(
                "sim config: {at}.output.length: min {lo} exceeds max {hi}"
            ));
        }
        Output::Script { tokens } => {
            if let Some(bad) = tokens.iter().find(|&&t| t >= vocab.size()) {
                return Err(format!(
                    "sim config: {at}.output.tokens: {bad} is outside the vocabulary"
                ));
            }
        }
        _ => {}
    }
    Ok(ModelConfig {
        latency: check_latency(m.latency, &at)?,
        id: m.id,
        owned_by: m.owned_by,
        max_context: m.max_context,
        grammars: m.tokenizer.as_ref().map(|path| {
            std::sync::Arc::new(turnpike_grammar::Grammars::new(
                std::path::Path::new(path),
                vocab.size() as usize,
                &[eos],
            ))
        }),
        vocab,
        tokenizer: m.tokenizer,
        eos,
        embedding_dim: m.embedding_dim,
        max_n: m.max_n,
        output: m.output,
        reasoning: m.reasoning,
        tool_calls: m.tool_calls,
        errors,
    })
}

/// A delay in seconds as a `Duration` (negative clamps to zero).
pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

#[cfg(test)]
mod tests {

    #[test]
    fn reasoning_follows_the_effort() {
        let at = |e| Reasoning::tokens(e, 8);
        assert_eq!(
            [
                at(Some("none")),
                at(Some("minimal")),
                at(Some("low")),
                at(None),
                at(Some("medium")),
                at(Some("high")),
                at(Some("xhigh"))
            ],
            [0, 4, 12, 24, 24, 48, 80]
        );
    }

    use super::*;

    #[test]
    fn empty_config_has_one_default_model() {
        let c = SimConfig::parse("").expect("default config");
        assert_eq!(c.models.len(), 1);
        assert_eq!(c.models[0].id, "sim");
        assert_eq!(c.models[0].latency.ttft, 0.0);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (r#"{"bogus": 1}"#, "unknown field `bogus`"),
            (
                r#"{"models": [{"id": "a", "latency": "slow"}]}"#,
                "unknown latency preset `slow`",
            ),
            (r#"{"errors": {"refuse_rate": 2}}"#, "errors.refuse_rate"),
            (r#"{"models": [{"id": "a"}, {"id": "a"}]}"#, "listed twice"),
            (
                r#"{"models": [{"id": "a", "vocab_size": 10, "output": {"mode": "script", "tokens": [11]}}]}"#,
                "outside the vocabulary",
            ),
            (
                r#"{"models": [{"id": "a", "output": {"mode": "random", "length": [5, 2]}}]}"#,
                "exceeds max",
            ),
            (
                r#"{"models": [{"id": "a", "tokenizer": "/no/such/tokenizer.json"}]}"#,
                "models.a.tokenizer",
            ),
        ];
        for (text, needle) in cases {
            let err = SimConfig::parse(text).expect_err(text);
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn presets_and_figures() {
        let c = SimConfig::parse(
            r#"{"models": [{"id": "a", "latency": "fast"}, {"id": "b", "latency": {"ttft_ms": 100, "itl_ms": 10}}]}"#,
        )
        .expect("valid");
        assert_eq!(c.models[0].latency.itl, 0.005);
        assert_eq!(c.models[1].latency.ttft, 0.1);
    }
}
