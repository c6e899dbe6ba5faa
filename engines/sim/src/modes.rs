//! What a simulator model does besides its output mode: reasoning before its answers, and
//! tool calls when a request offers tools. Plain configuration data, read by `config` and
//! acted on by `generation` and the engine's submit.

use serde::Deserialize;

/// Tool calling: when a request offers tools (the gateway sends the grammar of a call in the
/// model's envelope), the answer is a call drawn from that grammar with probability `rate`,
/// unless the prompt already holds a tool result (it contains `result_marker`, the token ids
/// the chat template puts before one): then the answer is text.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCalls {
    /// Probability of a call, in [0, 1].
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Token ids that begin a tool result in the prompt.
    #[serde(default)]
    pub result_marker: Vec<u32>,
}

fn default_rate() -> f64 {
    1.0
}

impl ToolCalls {
    /// Whether `prompt` already answers a call.
    pub fn answered(&self, prompt: &[u32]) -> bool {
        let m = &self.result_marker;
        !m.is_empty() && prompt.windows(m.len()).any(|w| w == m.as_slice())
    }
}

/// A reasoning mode: each answer is preceded by `start`, reasoning tokens and `end` (token
/// ids, the model's markers), as many reasoning tokens as the request's effort asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Reasoning {
    /// The start marker's token ids.
    pub start: Vec<u32>,
    /// The end marker's token ids.
    pub end: Vec<u32>,
}

impl Reasoning {
    /// Reasoning tokens for an answer of about `answer` tokens at `effort` (as llmsim scales
    /// them: none 0, minimal 0.5x, low 1.5x, medium 3x (the default), high 6x, xhigh 10x).
    pub fn tokens(effort: Option<&str>, answer: u32) -> u32 {
        let factor = match effort {
            Some("none") => 0.0,
            Some("minimal") => 0.5,
            Some("low") => 1.5,
            Some("high") => 6.0,
            Some("xhigh") => 10.0,
            _ => 3.0,
        };
        (f64::from(answer.max(1)) * factor).round() as u32
    }
}
