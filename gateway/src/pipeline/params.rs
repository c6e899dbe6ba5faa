//! OpenAI parameters -> the engine's [`GenerationParams`], checked once, each error naming its
//! parameter.
//!
//! Capabilities decide what may be sent: a parameter a model cannot honour is refused with a
//! 400, never dropped, except sampling controls (temperature, top_p, top_k, min_p, seed) on an
//! engine without sampling, which is deterministic whatever they say.

use serde_json::Value;
use turnpike_engine_api::{GenerationParams, Grammar};

use super::extensions::SamplingExtensions;
use super::speculation::{Names, speculation};
use crate::engine_host::Defaults;
use crate::engine_host::ServedModel;
use crate::error::ApiError;

/// Most stop strings per request.
pub(crate) const MAX_STOP_STRINGS: usize = 4;
/// Longest stop string, in bytes.
pub(crate) const MAX_STOP_BYTES: usize = 256;
/// Most stop token ids per request.
pub(crate) const MAX_STOP_TOKEN_IDS: usize = 256;
/// Most choices per prompt (`n`).
pub(crate) const MAX_N: u32 = 128;
/// Most alternatives per token a request may ask for (`top_logprobs`); the model may allow
/// fewer.
pub(crate) const MAX_TOP_LOGPROBS: u32 = 20;
/// Most choices in all (prompts times `n`): each is engine work and state held by the gateway.
pub(crate) const MAX_CHOICES: usize = 2048;

/// Refuses a request whose prompts times `n` exceed [`MAX_CHOICES`], before any is tokenized.
pub(crate) fn check_total_choices(prompts: usize, n: u32) -> Result<(), ApiError> {
    let total = prompts.saturating_mul(n as usize);
    if total > MAX_CHOICES {
        return Err(ApiError::invalid(
            if n > 1 { "n" } else { "prompt" },
            format!(
                "{prompts} prompts with n={n} make {total} choices; at most {MAX_CHOICES} are allowed"
            ),
        ));
    }
    Ok(())
}

/// Sampling fields, integers typed at the edge (checked against the model by
/// [`generation_params`]).
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `n`.
    pub n: Option<u32>,
    /// `seed`.
    pub seed: Option<u64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// Stop strings (`stop`, `stop_sequences`), as given.
    pub stop: Vec<String>,
    /// `logit_bias`.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// `best_of` (legacy completions; chat takes it as an extension): beam search with this
    /// many beams when above `n`. `None` where the protocol has no beams.
    pub best_of: Option<u32>,
    /// Settings beyond these.
    pub extensions: SamplingExtensions,
}

/// `value` of `param` within `min..=max`.
fn within(param: &str, value: u32, min: u32, max: u32) -> Result<u32, ApiError> {
    if value < min || value > max {
        return Err(ApiError::out_of_range(
            param,
            i64::from(value),
            i64::from(min),
            i64::from(max),
        ));
    }
    Ok(value)
}

fn ranged(param: &str, v: f64, min: f64, max: f64) -> Result<f32, ApiError> {
    if v.is_finite() && v >= min && v <= max {
        Ok(v as f32)
    } else {
        Err(ApiError::invalid(
            param,
            format!("'{param}' must be between {min} and {max}, got {v}"),
        ))
    }
}

/// The stop strings, checked.
pub(crate) fn stop_strings(stop: &[String]) -> Result<Vec<String>, ApiError> {
    let list = stop.to_vec();
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "'stop' holds at most {MAX_STOP_STRINGS} strings, got {}",
                list.len()
            ),
        ));
    }
    for s in &list {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(ApiError::invalid(
                "stop",
                format!("each stop string must be 1 to {MAX_STOP_BYTES} bytes long"),
            ));
        }
    }
    Ok(list)
}

/// Sampling and penalties, checked against the model's capabilities; `max_tokens`, `logprobs`
/// and `grammar` are set by the caller.
pub(crate) fn generation_params(
    s: &Sampling,
    model: &ServedModel,
    defaults: &Defaults,
) -> Result<GenerationParams, ApiError> {
    let caps = &model.info.capabilities;
    let mut p = GenerationParams::default();
    let n = s.n.unwrap_or(1);
    if n > caps.max_n {
        return Err(ApiError::unsupported(
            "n",
            format!(
                "'n' is {n}; model `{}` generates at most {} choices",
                model.id, caps.max_n
            ),
        ));
    }
    p.n = n;
    // What the request leaves unset: the model's recommendation, else the gateway's default.
    let recommended = &model.sampling;
    p.temperature = ranged(
        "temperature",
        s.temperature
            .or(recommended.temperature)
            .unwrap_or(f64::from(defaults.temperature)),
        0.0,
        2.0,
    )?;
    p.top_p = ranged(
        "top_p",
        s.top_p
            .or(recommended.top_p)
            .unwrap_or(f64::from(defaults.top_p)),
        0.0,
        1.0,
    )?;
    if p.top_p == 0.0 {
        // Some clients ask for greedy decoding this way.
        p.top_p = 1.0;
        p.temperature = 0.0;
    }
    p.seed = s.seed;
    let e = &s.extensions;
    p.top_k = e.top_k.or(recommended.top_k).unwrap_or(p.top_k);
    match e.min_p {
        Some(min_p) => p.min_p = ranged("min_p", min_p, 0.0, 1.0)?,
        None => p.min_p = recommended.min_p.map_or(p.min_p, |m| m as f32),
    }
    if e.greedy == Some(true) {
        p.temperature = 0.0;
    }
    p.presence_penalty = ranged(
        "presence_penalty",
        s.presence_penalty
            .unwrap_or(f64::from(defaults.presence_penalty)),
        -2.0,
        2.0,
    )?;
    p.frequency_penalty = ranged(
        "frequency_penalty",
        s.frequency_penalty
            .unwrap_or(f64::from(defaults.frequency_penalty)),
        -2.0,
        2.0,
    )?;
    match e.repetition_penalty {
        Some(r) => p.repetition_penalty = ranged("repetition_penalty", r, 0.01, 10.0)?,
        // Recommended only where the engine applies penalties (else every request would fail).
        None if caps.penalties => {
            p.repetition_penalty = recommended
                .repetition_penalty
                .map_or(p.repetition_penalty, |r| r as f32);
        }
        None => {}
    }
    let penalised =
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0;
    if penalised && !caps.penalties {
        return Err(ApiError::unsupported(
            "presence_penalty",
            format!("model `{}` does not support penalties", model.id),
        ));
    }
    (p.num_assistant_tokens, p.assistant_confidence_threshold) = speculation(
        e.num_assistant_tokens,
        e.assistant_confidence_threshold,
        caps,
        &model.id,
        Names {
            tokens: "num_assistant_tokens",
            threshold: "assistant_confidence_threshold",
        },
    )?;
    if let Some(best_of) = s.best_of {
        if best_of < n {
            return Err(ApiError::invalid(
                "best_of",
                format!("'best_of' ({best_of}) must be at least 'n' ({n})"),
            ));
        }
        if best_of > n {
            if best_of > caps.max_beam_width {
                return Err(ApiError::unsupported(
                    "best_of",
                    format!(
                        "'best_of' above 'n' searches {best_of} beams; model `{}` searches at most {}",
                        model.id, caps.max_beam_width
                    ),
                ));
            }
            p.beam_width = Some(best_of);
            if let Some(penalty) = e.length_penalty {
                p.length_penalty = ranged("length_penalty", penalty, -10.0, 10.0)?;
            }
            if let Some(groups) = e.num_beam_groups {
                p.beam_groups = within("num_beam_groups", groups, 1, best_of)?;
                if !best_of.is_multiple_of(p.beam_groups) {
                    return Err(ApiError::invalid(
                        "num_beam_groups",
                        format!(
                            "'num_beam_groups' ({}) must divide 'best_of' ({best_of})",
                            p.beam_groups
                        ),
                    ));
                }
            }
            if let Some(penalty) = e.diversity_penalty {
                p.diversity_penalty = ranged("diversity_penalty", penalty, 0.0, 100.0)?;
            }
        }
    }
    if p.beam_width.is_none() && e.num_beam_groups.is_some() {
        return Err(ApiError::invalid(
            "num_beam_groups",
            "'num_beam_groups' splits a beam search: it needs 'best_of' above 'n'",
        ));
    }
    if !caps.sampling {
        // A deterministic engine: sampling controls cannot change its output.
        let keep = (
            p.n,
            p.presence_penalty,
            p.frequency_penalty,
            p.repetition_penalty,
        );
        p = GenerationParams {
            n: keep.0,
            presence_penalty: keep.1,
            frequency_penalty: keep.2,
            repetition_penalty: keep.3,
            ..GenerationParams::default()
        };
    }
    if s.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::unsupported(
            "logit_bias",
            "'logit_bias' is not supported",
        ));
    }
    p.ignore_eos = e.ignore_eos.unwrap_or(false);
    if let Some(ids) = &e.stop_token_ids {
        let vocab = model.info.vocab_size;
        if ids.iter().any(|&id| id >= vocab) {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!("stop token ids must be integers below {vocab}"),
            ));
        }
        p.stop_token_ids.clone_from(ids);
    }
    p.min_tokens = e.min_tokens.unwrap_or(p.min_tokens);
    Ok(p)
}
/// The last step, once `max_tokens` is known: checks `min_tokens` against it and adds what the
/// model itself stops on (its end-of-turn tokens) unless the caller asked to ignore them.
pub(crate) fn complete_params(
    p: &mut GenerationParams,
    model: &ServedModel,
) -> Result<(), ApiError> {
    if p.min_tokens > p.max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!(
                "'min_tokens' ({}) must not exceed the maximum number of tokens ({})",
                p.min_tokens, p.max_tokens
            ),
        ));
    }
    if p.ignore_eos {
        return Ok(());
    }
    for &id in &model.stop_token_ids {
        if !p.stop_token_ids.contains(&id) {
            p.stop_token_ids.push(id);
        }
    }
    Ok(())
}

/// `top_logprobs` alternatives per token, checked against the model; `None` for no logprobs.
pub(crate) fn logprobs(
    wanted: bool,
    top: u32,
    param: &str,
    model: &ServedModel,
) -> Result<Option<u32>, ApiError> {
    if !wanted {
        return Ok(None);
    }
    let caps = &model.info.capabilities;
    if !caps.logprobs {
        return Err(ApiError::unsupported(
            "logprobs",
            format!("model `{}` does not return log probabilities", model.id),
        ));
    }
    let max = caps
        .max_top_logprobs
        .min(turnpike_engine_api::json::MAX_TOP_LOGPROBS);
    if top > max {
        return Err(ApiError::invalid(
            param,
            format!(
                "'{param}' must be at most {max} for model `{}`, got {top}",
                model.id
            ),
        ));
    }
    Ok(Some(top))
}

/// The grammar a structured-output request needs, if the model can enforce it.
pub(crate) fn grammar(g: Grammar, param: &str, model: &ServedModel) -> Result<Grammar, ApiError> {
    if model.info.capabilities.grammar {
        Ok(g)
    } else {
        Err(ApiError::unsupported(
            param,
            format!("model `{}` cannot enforce structured output", model.id),
        ))
    }
}

/// The tokens a prompt must stay under: the model's context or `max_request_tokens`, the
/// smaller (the budget prompts are tokenized within, see [`super::budget`]).
pub(crate) fn prompt_limit(model: &ServedModel, defaults: &Defaults) -> usize {
    (defaults.max_request_tokens as usize).min(model.context_length as usize)
}

/// `max_tokens`: the request's (capped by the model), else `default_max`; the prompt and the
/// output must fit the context. `param` names the prompt (`messages` or `prompt`).
pub(crate) fn max_tokens(
    requested: Option<u32>,
    requested_param: &str,
    default_max: u32,
    prompt_tokens: usize,
    model: &ServedModel,
    defaults: &Defaults,
    param: &str,
) -> Result<u32, ApiError> {
    let context = model.context_length as usize;
    let prompt_limit = prompt_limit(model, defaults);
    if prompt_tokens >= prompt_limit {
        return Err(ApiError::ContextLengthExceeded {
            param: param.into(),
            message: format!(
                "This model's maximum prompt length is {} tokens. However, your {param} resulted in {prompt_tokens} tokens. Please reduce the length of the {param}.",
                prompt_limit.saturating_sub(1)
            ),
        });
    }
    let room = context - prompt_tokens;
    let Some(n) = requested else {
        return Ok(default_max
            .min(model.max_output_tokens)
            .min(room as u32)
            .max(1));
    };
    let max = n;
    if max > model.max_output_tokens {
        return Err(ApiError::invalid(
            requested_param,
            format!(
                "'{requested_param}' is too large: {max}. Model `{}` supports at most {} completion tokens.",
                model.id, model.max_output_tokens
            ),
        ));
    }
    if prompt_tokens + max as usize > context {
        return Err(ApiError::ContextLengthExceeded {
            param: param.into(),
            message: format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_tokens} in the {param}, {max} in the completion). Please reduce the length of the {param} or completion.",
                prompt_tokens + max as usize
            ),
        });
    }
    Ok(max)
}

/// Highest `metadata.priority` magnitude.
pub(crate) const MAX_PRIORITY: i64 = 1000;

/// The priority of batch lines: below every priority a request may ask for.
pub(crate) const BATCH_PRIORITY: i32 = turnpike_engine_api::json::BACKGROUND_PRIORITY;
const _: () = assert!(BATCH_PRIORITY < -(MAX_PRIORITY as i32));

/// The scheduling priority in `metadata.priority` (OpenAI metadata values are strings, so
/// `"5"` and `5` both count); 0 without one.
pub(crate) fn priority(metadata: Option<&Value>) -> Result<i32, ApiError> {
    let Some(value) = metadata.and_then(|m| m.get("priority")) else {
        return Ok(0);
    };
    let parsed = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    match parsed {
        Some(p) if (-MAX_PRIORITY..=MAX_PRIORITY).contains(&p) => Ok(p as i32),
        _ => Err(ApiError::invalid(
            "metadata.priority",
            format!(
                "'metadata.priority' must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_bounded() {
        assert_eq!(stop_strings(&["x".into()]), Ok(vec!["x".to_string()]));
        assert!(stop_strings(&vec!["a".into(); 5]).is_err());
        assert!(stop_strings(&[String::new()]).is_err());
        assert!(stop_strings(&["x".repeat(257)]).is_err());
    }
}
