//! What the engine host is configured with: the engine plugins to load, the models to serve
//! over them, and the request defaults every served model starts from. The configuration
//! layer reads these from its file and hands them here; nothing here reads a file.

use std::path::PathBuf;

use crate::text::tools::ToolCallFormat;

/// Request defaults (the seed's section 18).
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// Largest prompt, in tokens.
    pub max_request_tokens: u32,
    /// `max_tokens` when a chat request sets none, and the cap of a model without its own.
    pub max_output_tokens: u32,
    /// `temperature` when a request sets none.
    pub temperature: f32,
    /// `top_p` when a request sets none.
    pub top_p: f32,
    /// `presence_penalty` when a request sets none.
    pub presence_penalty: f32,
    /// `frequency_penalty` when a request sets none.
    pub frequency_penalty: f32,
    /// The tool-call format of a model whose entry names none (and of the models an engine
    /// lists itself); `None`: the one its chat template teaches, else Hermes blocks.
    pub tool_call_parser: Option<crate::text::tools::ToolCallFormat>,
}

/// What happens to a structured-output request (a JSON Schema or object, or a forced tool
/// call) for a model whose engine cannot constrain output by a grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StructuredOutput {
    /// Refused up front with a 400 (`unsupported_parameter`).
    #[default]
    Refuse,
    /// Generated unconstrained, then checked: an answer that breaks the shape is a 422.
    Validate,
}

/// One engine plugin to load.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Its name, which models refer to.
    pub name: String,
    /// The plugin library.
    pub plugin: PathBuf,
    /// The configuration given to the plugin's `create`, as JSON.
    pub config_json: String,
}

/// One served model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Public name.
    pub name: String,
    /// Release date `YYYY-MM-DD`: the model answers to `name-version`, and `name` names the
    /// newest version.
    pub version: Option<String>,
    /// More public names.
    pub aliases: Vec<String>,
    /// The engine that serves it.
    pub engine: String,
    /// The model's id inside the engine.
    pub engine_model: String,
    /// Folder with `tokenizer.json` and, for chat, the chat template.
    pub folder: PathBuf,
    /// Shown as `owned_by`.
    pub owned_by: Option<String>,
    /// Shown as `shutdown_date`.
    pub deprecation_date: Option<String>,
    /// Context window; the engine's when unset, never more.
    pub context_length: Option<u32>,
    /// Most tokens a request may ask for.
    pub max_output_tokens: u32,
    /// How the model writes tool calls; without one, requests that offer tools are refused.
    pub tool_call_parser: Option<ToolCallFormat>,
    /// The markers around the model's reasoning, for a reasoning model (`reasoning = {}` takes
    /// `<think>` and `</think>`).
    pub reasoning: Option<crate::text::reasoning::ReasoningMarkers>,
    /// Structured output when the engine cannot constrain it.
    pub structured_output: StructuredOutput,
    /// Engines tried in order when the model's own is unavailable (every replica's breaker
    /// open, or the engine refusing as unavailable).
    pub standby: Vec<EngineTarget>,
    /// An engine (or model build) that takes a share of the tenants.
    pub canary: Option<CanaryConfig>,
}

/// An engine and its id for a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineTarget {
    /// The engine's configured name.
    pub engine: String,
    /// The model's id inside it.
    pub engine_model: String,
}

/// A canary: named tenants, and a share of the others (sticky per tenant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanaryConfig {
    /// Where canary traffic goes.
    pub target: EngineTarget,
    /// Percent of tenants (by a hash of the tenant's name), 0..=100.
    pub percent: u32,
    /// Tenants that always take the canary.
    pub tenants: Vec<String>,
}

/// `YYYY-MM-DD`, a day the calendar has.
pub(crate) fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    let shaped = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shaped {
        return false;
    }
    let (Ok(year), Ok(month), Ok(day)) = (
        s[..4].parse::<u32>(),
        s[5..7].parse::<u32>(),
        s[8..10].parse::<u32>(),
    ) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// The longest public model id, in bytes.
pub(crate) const MAX_MODEL_ID: usize = 256;

/// What [`is_model_id`] asks, for error messages.
pub(crate) const MODEL_ID_RULE: &str = "a model name is 1 to 256 bytes without whitespace, control characters or any of *?#%\"\\, and its /-separated parts are not empty, `.` or `..`";

/// A public model id, whether the configuration or the admin API names it: 1 to
/// [`MAX_MODEL_ID`] bytes; no whitespace or control characters; none of `*` (which means every
/// model in a plan), `?`, `#`, `%`, `"` or `\` (which a URL or a log line would read
/// otherwise); `/`-separated parts (`org/name`) none of them empty, `.` or `..`.
pub(crate) fn is_model_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_MODEL_ID
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "*?#%\"\\".contains(c))
        && s.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

#[cfg(test)]
mod model_id_tests {
    use super::is_model_id;

    #[test]
    fn model_ids_are_names_a_url_and_a_plan_read_as_written() {
        for good in [
            "chat",
            "sim-2026-01-01",
            "meta-llama/Llama-3.1-8B-Instruct",
            "ft:gpt-4o:org:x",
            "qwen2.5:7b",
            "é",
        ] {
            assert!(is_model_id(good), "{good}");
        }
        let long = "x".repeat(257);
        for bad in [
            "",
            "a b",
            "a\nb",
            "*",
            "a?b",
            "a#b",
            "50%",
            "a\"b",
            "a\\b",
            "..",
            ".",
            "/lead",
            "tr/",
            "a//b",
            "a/../b",
            long.as_str(),
        ] {
            assert!(!is_model_id(bad), "{bad:?}");
        }
    }
}
