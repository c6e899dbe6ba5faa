//! A conversation's items (in the normal form of [`super::input`]) as the messages a chat
//! template reads, built directly: `instructions` first as a system message, then every item
//! except reasoning; consecutive function calls are one assistant turn, a compaction item is a
//! user message holding its summary, and a server tool the gateway ran is its call and its
//! result, as the model saw them.

use serde_json::{Map, Value};

use super::compaction;
use crate::error::ApiError;
use crate::protocols::messages::{template_call, template_message};

/// The template messages of `items`, with `instructions` first; refused when nothing is left
/// to show the model.
pub(crate) fn template_messages(
    instructions: Option<&str>,
    items: &[Value],
) -> Result<Vec<Value>, ApiError> {
    let mut messages: Vec<Map<String, Value>> = Vec::with_capacity(items.len() + 1);
    if let Some(text) = instructions {
        messages.push(template_message("system", text.to_string()));
    }
    for item in items {
        let field = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let text: Vec<&str> = item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                let role = match field("role") {
                    "system" | "developer" => "system",
                    "assistant" => "assistant",
                    _ => "user",
                };
                messages.push(template_message(role, text.join("\n")));
            }
            Some("function_call") => {
                let call = template_call(
                    field("call_id"),
                    "function",
                    field("name"),
                    field("arguments"),
                );
                // Consecutive calls are one assistant turn, as chat templates expect.
                match messages.last_mut().and_then(|m| m.get_mut("tool_calls")) {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => messages.push(calls_turn(vec![call])),
                }
            }
            Some("compaction") => {
                if let Some(summary) = compaction::decode(field("encrypted_content")) {
                    messages.push(template_message("user", compaction::shown(&summary)));
                }
            }
            Some("function_call_output") => {
                messages.push(tool_result(field("call_id"), field("output").to_string()));
            }
            Some("mcp_call") => {
                let call_id = format!("call_{}", field("id").trim_start_matches("mcp_"));
                let call = template_call(&call_id, "function", field("name"), field("arguments"));
                messages.push(calls_turn(vec![call]));
                let result = match item.get("error").and_then(Value::as_str) {
                    Some(error) => format!("error: {error}"),
                    None => field("output").to_string(),
                };
                messages.push(tool_result(&call_id, result));
            }
            _ => {}
        }
    }
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "'input' must hold at least one item the model is shown",
        ));
    }
    Ok(messages.into_iter().map(Value::Object).collect())
}

/// An assistant turn that only calls tools.
fn calls_turn(calls: Vec<Value>) -> Map<String, Value> {
    let mut m = template_message("assistant", String::new());
    m.insert("tool_calls".into(), Value::Array(calls));
    m
}

/// A tool's result, answering call `call_id`.
fn tool_result(call_id: &str, content: String) -> Map<String, Value> {
    let mut m = template_message("tool", content);
    m.insert("tool_call_id".into(), call_id.into());
    m
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::openai::responses::ResponseInput;

    #[test]
    fn items_become_template_messages_with_tool_turns() {
        let Value::Array(list) = json!([
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"},
                                         {"type": "input_text", "text": "in Oslo"}]},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": "It is sunny."}
        ]) else {
            unreachable!()
        };
        let items = super::super::input::normalise(&ResponseInput::Items(list)).unwrap();
        let got = template_messages(Some("Be brief."), &items).unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "system", "content": "Use tools."}),
                json!({"role": "user", "content": "weather?\nin Oslo"}),
                json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {}}},
                    {"id": "c2", "type": "function", "function": {"name": "get", "arguments": {"x": 1}}}
                ]}),
                json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"}),
                json!({"role": "assistant", "content": "It is sunny."}),
            ]
        );
    }

    #[test]
    fn a_server_tool_run_is_its_call_and_result_and_nothing_shown_is_refused() {
        let run = json!({"type": "mcp_call", "id": "mcp_7", "name": "add", "arguments": "{}",
                         "error": "boom"});
        let got = template_messages(None, &[run]).unwrap();
        assert_eq!(got[0]["tool_calls"][0]["id"], "call_7");
        assert_eq!(
            got[1],
            json!({"role": "tool", "content": "error: boom", "tool_call_id": "call_7"})
        );
        let only_reasoning = [json!({"type": "reasoning", "summary": []})];
        let err = template_messages(None, &only_reasoning).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidParam { param, .. } if param == "input"));
    }
}
