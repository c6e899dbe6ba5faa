//! Requests -> prompt token ids: chat messages through the model's template, legacy prompts and
//! embedding inputs in their four forms (a string, strings, token ids, lists of token ids).

use serde_json::{Map, Value, json};

use super::budget::{BudgetError, encode_within};
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::openai::chat::{ChatMessage, Content, ContentPart, Tool};

/// Most prompts or inputs in one request.
pub const MAX_INPUTS: usize = 2048;

/// The text of message content (text parts joined by newlines); other parts are refused.
fn content_text(content: &Content, param: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(t) => Ok(t.clone()),
        Content::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match part {
                    ContentPart::Text { text } => texts.push(text.as_str()),
                    ContentPart::Refusal { refusal } => texts.push(refusal.as_str()),
                    ContentPart::ImageUrl { .. }
                    | ContentPart::InputAudio { .. }
                    | ContentPart::File { .. } => {
                        return Err(ApiError::unsupported(
                            format!("{param}[{j}].type"),
                            "this model accepts text content only",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

/// Messages as the chat template expects them (OpenAI shape, `developer` as `system`, content
/// as text, tool-call arguments parsed into objects as templates iterate them).
pub fn template_messages(messages: &[ChatMessage]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let param = format!("messages[{i}].content");
        let mut m = Map::new();
        let with_name = |m: &mut Map<String, Value>, name: &Option<String>| {
            if let Some(name) = name {
                m.insert("name".into(), Value::String(name.clone()));
            }
        };
        match message {
            ChatMessage::System { content, name } | ChatMessage::Developer { content, name } => {
                m.insert("role".into(), "system".into());
                m.insert("content".into(), content_text(content, &param)?.into());
                with_name(&mut m, name);
            }
            ChatMessage::User { content, name } => {
                m.insert("role".into(), "user".into());
                m.insert("content".into(), content_text(content, &param)?.into());
                with_name(&mut m, name);
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                name,
            } => {
                m.insert("role".into(), "assistant".into());
                let text = content
                    .as_ref()
                    .map(|c| content_text(c, &param))
                    .transpose()?;
                m.insert("content".into(), text.unwrap_or_default().into());
                with_name(&mut m, name);
                if let Some(calls) = tool_calls.as_ref().filter(|c| !c.is_empty()) {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            let args = serde_json::from_str::<Value>(&c.function.arguments)
                                .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
                            json!({"id": c.id, "type": c.kind, "function": {"name": c.function.name, "arguments": args}})
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
            }
            ChatMessage::Tool {
                content,
                tool_call_id,
            } => {
                m.insert("role".into(), "tool".into());
                m.insert("content".into(), content_text(content, &param)?.into());
                m.insert("tool_call_id".into(), tool_call_id.clone().into());
            }
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

/// Tool definitions for the template; malformed schemas are 422.
pub fn template_tools(tools: &[Tool]) -> Result<Value, ApiError> {
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::unsupported(
                format!("tools[{i}].type"),
                "only 'function' tools are supported",
            ));
        }
        let name = &tool.function.name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "a function name must be 1 to 64 letters, digits, underscores or dashes",
            ));
        }
        if let Some(params) = &tool.function.parameters
            && !params.is_object()
        {
            return Err(ApiError::InvalidSchema {
                param: format!("tools[{i}].function.parameters"),
                message: format!(
                    "the parameters of function `{name}` must be a JSON Schema object"
                ),
            });
        }
    }
    serde_json::to_value(tools).map_err(|e| ApiError::Internal {
        detail: format!("tools: {e}"),
    })
}

/// A JSON Schema for structured output, checked for shape (a 422 otherwise).
pub fn check_schema(schema: &Value, param: &str) -> Result<(), ApiError> {
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
pub fn chat_prompt(
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
    let text = template
        .render(messages, tools, true, kwargs)
        .map_err(|e| {
            ApiError::invalid(param, format!("the chat template refused the {param}: {e}"))
        })?;
    encode_within(&model.tokenizer, &text, false, budget).map_err(|e| over_budget(e, param))
}

/// One prompt or input of a legacy completion or embedding request.
#[derive(Debug, Clone, PartialEq)]
pub struct TextInput {
    /// Its token ids.
    pub ids: Vec<u32>,
    /// Its text (decoded, for token-id input).
    pub text: String,
}

/// How many prompts `value` holds, without looking inside them (a flat list of token ids is one).
pub fn input_count(value: &Value) -> usize {
    match value {
        Value::Array(items) if !items.iter().all(Value::is_number) => items.len(),
        _ => 1,
    }
}

/// Prompts in any of the four forms. `add_special` adds the tokenizer's own special tokens to
/// text (a beginning-of-text token); token ids are taken as given. A prompt clearly longer than
/// `budget` tokens is refused before it is tokenized (or its ids decoded) whole.
pub fn text_inputs(
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
        let ids = encode_within(&model.tokenizer, s, add_special, budget)
            .map_err(|e| over_budget(e, param))?;
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
