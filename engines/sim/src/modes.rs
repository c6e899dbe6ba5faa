//! What a simulator model does besides its output mode: reasoning before its answers, and
//! tool calls when a request offers tools. Plain configuration data, read by `config` and
//! acted on by `generation` and the engine's submit.

use serde::Deserialize;

/// Tool calling: when a request offers tools (the gateway sends the grammar of a call in the
/// model's envelope), the answer is a call drawn from that grammar with probability `rate`,
/// unless the prompt already holds `rounds` tool results (each begins with `result_marker`,
/// the token ids the chat template puts before one): then the answer is text.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCalls {
    /// Probability of a call, in [0, 1].
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Token ids that begin a tool result in the prompt.
    #[serde(default)]
    pub result_marker: Vec<u32>,
    /// Tool results the prompt holds before the model answers with text.
    #[serde(default = "default_rounds")]
    pub rounds: usize,
}

fn default_rate() -> f64 {
    1.0
}

fn default_rounds() -> usize {
    1
}

impl ToolCalls {
    /// Whether `prompt` already holds the tool results the model calls for.
    pub(crate) fn answered(&self, prompt: &[u32]) -> bool {
        let m = &self.result_marker;
        !m.is_empty()
            && prompt
                .windows(m.len())
                .filter(|w| *w == m.as_slice())
                .count()
                >= self.rounds.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::ToolCalls;

    #[test]
    fn the_model_calls_until_the_prompt_holds_its_rounds_of_results() {
        let calls = |rounds| ToolCalls {
            rate: 1.0,
            result_marker: vec![7, 8],
            rounds,
        };
        let prompt = [1, 7, 8, 2, 7, 8, 3];
        assert!(calls(1).answered(&prompt) && calls(2).answered(&prompt));
        assert!(!calls(3).answered(&prompt));
        assert!(!calls(1).answered(&[1, 2, 3]));
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
    pub(crate) fn tokens(effort: Option<&str>, answer: u32) -> u32 {
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
