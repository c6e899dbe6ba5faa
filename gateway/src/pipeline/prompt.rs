//! Prompts -> token ids: a conversation (already in the template's shape) through the model's
//! template, legacy prompts and
//! embedding inputs in their four forms (a string, strings, token ids, lists of token ids).

use serde_json::{Map, Value};

use super::budget::{BudgetError, encode_within};
use crate::engine_host::ServedModel;
use crate::error::ApiError;

/// Most prompts or inputs in one request.
pub(crate) const MAX_INPUTS: usize = 2048;

/// A JSON Schema for structured output, checked for shape (a 400 otherwise).
pub(crate) fn check_schema(schema: &Value, param: &str) -> Result<(), ApiError> {
    const TYPES: [&str; 7] = [
        "object", "array", "string", "number", "integer", "boolean", "null",
    ];
    let Some(object) = schema.as_object() else {
        return Err(ApiError::InvalidSchema {
            param: param.into(),
            message: "the schema must be a JSON object".into(),
        });
    };
    let type_ok = match object.get("type") {
        None => true,
        Some(Value::String(t)) => TYPES.contains(&t.as_str()),
        Some(Value::Array(list)) => list
            .iter()
            .all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))),
        Some(_) => false,
    };
    if !type_ok {
        return Err(ApiError::InvalidSchema {
            param: param.into(),
            message: "the schema's 'type' is not a JSON Schema type".into(),
        });
    }
    Ok(())
}

/// The refusal of a prompt in `param` found to hold more than `budget` tokens before it was
/// tokenized whole (see [`super::budget`]).
fn over_budget(e: BudgetError, param: &str) -> ApiError {
    match e {
        BudgetError::OverBudget { budget, .. } => ApiError::ContextLengthExceeded {
            param: param.into(),
            message: format!(
                "Your {param} resulted in more than {budget} tokens, more than this model accepts. Please reduce the length of the {param}."
            ),
        },
        BudgetError::Tokenizer(detail) => ApiError::Internal { detail },
    }
}

/// Token ids of a chat conversation (`param` names it in errors); a conversation clearly longer than `budget` tokens is
/// refused before it is tokenized whole.
pub(crate) fn chat_prompt(
    model: &ServedModel,
    messages: &[Value],
    tools: Option<&Value>,
    kwargs: Option<&Map<String, Value>>,
    budget: usize,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let template = model.template.as_ref().ok_or_else(|| {
        ApiError::unsupported(
            param,
            format!(
                "model `{}` has no chat template; use /v1/completions",
                model.id
            ),
        )
    })?;
    // A template that shows no tools: the generic tool prompt shows them, and the
    // conversation's calls and results, in the model's tool-call envelope.
    let generic;
    let (messages, tools) = match model.tool_call_parser.filter(|_| model.generic_tools) {
        Some(format) => {
            let offered = tools
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            generic = crate::text::tool_prompt::generic_messages(messages, offered, format);
            (generic.as_slice(), None)
        }
        None => (messages, tools),
    };
    let text = template
        .render(messages, tools, true, kwargs)
        .map_err(|e| {
            ApiError::invalid(param, format!("the chat template refused the {param}: {e}"))
        })?;
    encode_cached(model, &text, false, budget).map_err(|e| over_budget(e, param))
}

/// `text`'s token ids from the model's prompt cache, or tokenized (within `budget`) and kept.
fn encode_cached(
    model: &ServedModel,
    text: &str,
    add_special: bool,
    budget: usize,
) -> Result<Vec<u32>, BudgetError> {
    if let Some(ids) = model.prompt_cache.get(text, add_special) {
        metrics::counter!("turnpike_prompt_cache_total", "model" => model.id.clone(), "result" => "hit")
            .increment(1);
        return Ok(ids.to_vec());
    }
    let ids = encode_within(&model.tokenizer, text, add_special, budget)?;
    let bytes = model.prompt_cache.insert(text, add_special, &ids);
    metrics::counter!("turnpike_prompt_cache_total", "model" => model.id.clone(), "result" => "miss")
        .increment(1);
    metrics::gauge!("turnpike_prompt_cache_bytes", "model" => model.id.clone()).set(bytes as f64);
    Ok(ids)
}

/// One prompt or input of a legacy completion or embedding request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TextInput {
    /// Its token ids.
    pub ids: Vec<u32>,
    /// Its text (decoded, for token-id input).
    pub text: String,
}

/// How many prompts `value` holds, without looking inside them (a flat list of token ids is one).
pub(crate) fn input_count(value: &Value) -> usize {
    match value {
        Value::Array(items) if !items.iter().all(Value::is_number) => items.len(),
        _ => 1,
    }
}

/// Prompts in any of the four forms. `add_special` adds the tokenizer's own special tokens to
/// text (a beginning-of-text token); token ids are taken as given. A prompt clearly longer than
/// `budget` tokens is refused before it is tokenized (or its ids decoded) whole.
pub(crate) fn text_inputs(
    value: &Value,
    param: &str,
    model: &ServedModel,
    add_special: bool,
    budget: usize,
) -> Result<Vec<TextInput>, ApiError> {
    let shape_error = || {
        ApiError::invalid(
            param,
            format!(
                "'{param}' must be a string, an array of strings, an array of token ids, or an array of arrays of token ids"
            ),
        )
    };
    let vocab = model.info.vocab_size;
    let from_text = |s: &str| -> Result<TextInput, ApiError> {
        let ids =
            encode_cached(model, s, add_special, budget).map_err(|e| over_budget(e, param))?;
        Ok(TextInput {
            ids,
            text: s.to_string(),
        })
    };
    let from_ids = |list: &[Value]| -> Result<TextInput, ApiError> {
        if list.len() > budget {
            let counted = list.len();
            return Err(over_budget(
                BudgetError::OverBudget { budget, counted },
                param,
            ));
        }
        let ids = list
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&t| t < u64::from(vocab))
                    .map(|t| t as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    param,
                    format!("token ids in '{param}' must be integers below {vocab}"),
                )
            })?;
        let text = model
            .tokenizer
            .decode(&ids, false)
            .map_err(|detail| ApiError::Internal { detail })?;
        Ok(TextInput { ids, text })
    };
    // Counted before any is tokenized, so an oversized request costs nothing.
    let count = input_count(value);
    if count > MAX_INPUTS {
        return Err(ApiError::invalid(
            param,
            format!("'{param}' holds at most {MAX_INPUTS} items, got {count}"),
        ));
    }
    let inputs = match value {
        Value::String(s) => vec![from_text(s)?],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid(
                param,
                format!("'{param}' must not be empty"),
            ));
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|v| from_text(v.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Value::Array(items) if items.iter().all(Value::is_number) => vec![from_ids(items)?],
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| match v {
                Value::Array(list) if !list.is_empty() => from_ids(list),
                _ => Err(shape_error()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(shape_error()),
    };
    Ok(inputs)
}
