//! Input items: checked once, given ids and a normal form (what is stored and listed by
//! `input_items`); [`super::conversation`] turns them into the prompt's messages.
//!
//! Accepted items: messages (`role` and `content`, a string or `input_text` / `output_text`
//! parts; `type: "message"` optional), `function_call`, `function_call_output`, and `reasoning`
//! items given back (kept in the conversation, not shown to the model), and `compaction` items
//! (shown to the model as the summary they hold). Images and files are refused: the served
//! models read text only.

use serde_json::{Map, Value, json};

use super::compaction;
use crate::error::ApiError;
use crate::ids::new_id;
use crate::openai::responses::{OutputItem, ResponseInput};

/// This turn's input items in normal form, each with an id.
pub(crate) fn normalise(input: &ResponseInput) -> Result<Vec<Value>, ApiError> {
    match input {
        ResponseInput::Text(text) => Ok(vec![message("user", &[part("input_text", text)])]),
        ResponseInput::Items(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| normalise_item(item, &format!("input[{i}]")))
            .collect(),
    }
}

/// Every `function_call_output` of this `turn` answers a `function_call` made before it, in
/// the conversation so far (`before`: the responses it continues) or earlier in the turn; the
/// error names the first that does not (`input[i].call_id`), in OpenAI's words. After a
/// compaction item the calls it summarises are gone from view: nothing more is checked.
pub(crate) fn check_outputs(before: &[Value], turn: &[Value]) -> Result<(), ApiError> {
    let is_compaction =
        |item: &Value| item.get("type").and_then(Value::as_str) == Some("compaction");
    if before.iter().any(is_compaction) {
        return Ok(());
    }
    let call_id = |item: &Value, kind: &str| {
        (item.get("type").and_then(Value::as_str) == Some(kind))
            .then(|| item.get("call_id").and_then(Value::as_str))
            .flatten()
            .map(str::to_string)
    };
    let mut calls: std::collections::HashSet<String> = before
        .iter()
        .filter_map(|item| call_id(item, "function_call"))
        .collect();
    for (i, item) in turn.iter().enumerate() {
        if is_compaction(item) {
            return Ok(());
        }
        if let Some(id) = call_id(item, "function_call") {
            calls.insert(id);
        }
        if let Some(id) = call_id(item, "function_call_output")
            && !calls.contains(&id)
        {
            return Err(ApiError::invalid(
                format!("input[{i}].call_id"),
                format!("No tool call found for function call output with call_id {id}."),
            ));
        }
    }
    Ok(())
}

fn part(kind: &str, text: &str) -> Value {
    json!({"type": kind, "text": text})
}

fn message(role: &str, content: &[Value]) -> Value {
    json!({"type": "message", "id": new_id("msg_"), "role": role, "status": "completed", "content": content})
}

fn text_field<'a>(item: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid(
            format!("{at}.{key}"),
            format!("'{at}.{key}' must be a string"),
        )),
        None => Err(ApiError::MissingParam(format!("{at}.{key}"))),
    }
}

fn normalise_item(item: &Value, at: &str) -> Result<Value, ApiError> {
    let Some(object) = item.as_object() else {
        return Err(ApiError::invalid(at, format!("'{at}' must be an object")));
    };
    let kind = match object.get("type") {
        None => "message",
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                "'type' must be a string",
            ));
        }
    };
    match kind {
        "message" => normalise_message(object, at),
        "function_call" => Ok(json!({
            "type": "function_call",
            "id": object.get("id").and_then(Value::as_str).map_or_else(|| new_id("fc_"), str::to_string),
            "call_id": text_field(object, "call_id", at)?,
            "name": text_field(object, "name", at)?,
            "arguments": text_field(object, "arguments", at)?,
            "status": "completed",
        })),
        "function_call_output" => {
            let output = match object.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.output"),
                        "'output' must be a string",
                    ));
                }
                None => return Err(ApiError::MissingParam(format!("{at}.output"))),
            };
            Ok(json!({
                "type": "function_call_output",
                "id": new_id("fco_"),
                "call_id": text_field(object, "call_id", at)?,
                "output": output,
                "status": "completed",
            }))
        }
        "reasoning" => {
            let mut kept = object.clone();
            kept.entry("id")
                .or_insert_with(|| Value::String(new_id("rs_")));
            kept.entry("summary")
                .or_insert_with(|| Value::Array(Vec::new()));
            Ok(Value::Object(kept))
        }
        "compaction" => {
            let content = text_field(object, "encrypted_content", at)?;
            if compaction::decode(content).is_none() {
                return Err(ApiError::invalid(
                    format!("{at}.encrypted_content"),
                    "'encrypted_content' is not a compaction made by this gateway",
                ));
            }
            Ok(json!({
                "type": "compaction",
                "id": object.get("id").and_then(Value::as_str).map_or_else(|| new_id("cmp_"), str::to_string),
                "encrypted_content": content,
            }))
        }
        "item_reference" => Err(ApiError::unsupported(
            format!("{at}.type"),
            "item references are not supported; send the item itself or use previous_response_id",
        )),
        other => Err(ApiError::invalid(
            format!("{at}.type"),
            format!(
                "unknown input item type '{other}'; expected message, function_call, function_call_output, reasoning or compaction"
            ),
        )),
    }
}

fn normalise_message(object: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let role = text_field(object, "role", at)?;
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(ApiError::invalid(
            format!("{at}.role"),
            format!("'{role}' is not a role; expected user, assistant, system or developer"),
        ));
    }
    let text_kind = if role == "assistant" {
        "output_text"
    } else {
        "input_text"
    };
    let parts = match object.get("content") {
        Some(Value::String(text)) => vec![part(text_kind, text)],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| normalise_part(p, &format!("{at}.content[{j}]")))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.content"),
                "'content' must be a string or a list of parts",
            ));
        }
        None => return Err(ApiError::MissingParam(format!("{at}.content"))),
    };
    let mut item = message(role, &parts);
    if let Some(id) = object.get("id").and_then(Value::as_str) {
        item["id"] = Value::String(id.to_string());
    }
    Ok(item)
}

fn normalise_part(part: &Value, at: &str) -> Result<Value, ApiError> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "input_text" | "output_text" | "text" => {
            let text = part
                .get("text")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::MissingParam(format!("{at}.text")))?;
            let kind = if kind == "text" { "input_text" } else { kind };
            Ok(self::part(kind, text))
        }
        "refusal" => Ok(self::part(
            "output_text",
            part.get("refusal").and_then(Value::as_str).unwrap_or(""),
        )),
        "input_image" | "input_file" | "input_audio" => Err(ApiError::unsupported(
            at,
            format!("'{kind}' is not supported: the served models read text only"),
        )),
        _ => Err(ApiError::invalid(
            format!("{at}.type"),
            format!("unknown content part type '{kind}'; expected input_text or output_text"),
        )),
    }
}

/// An output item as an input item of a later turn.
pub(crate) fn from_output(item: &OutputItem) -> Value {
    serde_json::to_value(item).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(value: Value) -> Result<Vec<Value>, ApiError> {
        let Value::Array(list) = value else {
            panic!("a list")
        };
        normalise(&ResponseInput::Items(list))
    }

    #[test]
    fn a_string_is_one_user_message() {
        let got = normalise(&ResponseInput::Text("hi".into())).unwrap_or_default();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["role"], "user");
        assert_eq!(
            got[0]["content"][0],
            json!({"type": "input_text", "text": "hi"})
        );
        assert!(
            got[0]["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_"))
        );
    }

    #[test]
    fn images_and_bad_items_are_clear_errors() {
        let image = items(
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]),
        );
        let e = image.err().map(|e| (e.status(), e.detail().param));
        assert_eq!(
            e,
            Some((
                axum::http::StatusCode::BAD_REQUEST,
                Some("input[0].content[0]".into())
            ))
        );
        for bad in [
            json!([{"role": "robot", "content": "x"}]),
            json!([{"type": "weird"}]),
            json!([3]),
            json!([{"type": "function_call", "name": "f"}]),
        ] {
            let e = items(bad.clone()).err().map(|e| e.status());
            assert_eq!(e, Some(axum::http::StatusCode::BAD_REQUEST), "{bad}");
        }
    }
}
