//! Tools for a model whose chat template shows none (SmolLM2's, TinyLlama's, many GGUFs'): the
//! generic tool prompt. Without it such a model is never told what it may call, and offering
//! it tools changes nothing but the refusal.
//!
//! The conversation is rewritten before the template renders it, in the envelope of the
//! model's tool-call format (`hermes` unless configured otherwise), so what the model is taught
//! is exactly what the parser reads:
//! - a system message (the conversation's own first one, extended, or a new one) lists the
//!   functions as JSON, one per line, between `<tools>` and `</tools>`, and says how to call one;
//! - an assistant message's `tool_calls` become text in that envelope;
//! - a `tool` message becomes a user message holding `<tool_response>…</tool_response>`, which any
//!   template renders.
//!
//! And where a model's configuration names no format, [`format_taught`] reads the one its
//! template teaches off the template's text.

use serde_json::{Value, json};

use super::tools::ToolCallFormat;

/// The functions, and how to call them, in `format`'s envelope.
fn section(tools: &[Value], format: ToolCallFormat) -> String {
    let listed: Vec<String> = tools.iter().map(Value::to_string).collect();
    let how = match format {
        ToolCallFormat::Hermes => {
            "To call a function, write its name and arguments as one JSON object between \
             <tool_call> and </tool_call>, one call per pair of tags:\n<tool_call>\n\
             {\"name\": \"FUNCTION_NAME\", \"arguments\": {\"ARGUMENT\": \"VALUE\"}}\n</tool_call>"
        }
        ToolCallFormat::Llama3Json => {
            "To call a function, answer with nothing but one JSON object naming it and its \
             arguments:\n{\"name\": \"FUNCTION_NAME\", \"parameters\": {\"ARGUMENT\": \"VALUE\"}}"
        }
        ToolCallFormat::Mistral => {
            "To call functions, answer with [TOOL_CALLS] and then a JSON list of calls:\n\
             [TOOL_CALLS][{\"name\": \"FUNCTION_NAME\", \"arguments\": {\"ARGUMENT\": \"VALUE\"}}]"
        }
    };
    format!(
        "You can call functions to answer. These are the functions, as JSON, one per line:\n\
         <tools>\n{}\n</tools>\n{how}\nA function's result comes back between <tool_response> \
         and </tool_response>. Call a function only when it helps; otherwise answer in words.",
        listed.join("\n")
    )
}

/// A call's arguments as JSON (a message may carry them as JSON text).
fn arguments(call: &Value) -> Value {
    let raw = &call["function"]["arguments"];
    match raw {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| raw.clone()),
        Value::Null => json!({}),
        other => other.clone(),
    }
}

/// An assistant message's calls as text in `format`'s envelope.
fn calls_text(calls: &[Value], format: ToolCallFormat) -> String {
    let named = |call: &Value, key: &str| {
        let mut object = serde_json::Map::new();
        object.insert("name".into(), call["function"]["name"].clone());
        object.insert(key.into(), arguments(call));
        Value::Object(object)
    };
    match format {
        ToolCallFormat::Hermes => calls
            .iter()
            .map(|c| format!("<tool_call>\n{}\n</tool_call>", named(c, "arguments")))
            .collect::<Vec<_>>()
            .join("\n"),
        ToolCallFormat::Llama3Json => calls
            .iter()
            .map(|c| named(c, "parameters").to_string())
            .collect::<Vec<_>>()
            .join("; "),
        ToolCallFormat::Mistral => {
            let list: Vec<Value> = calls.iter().map(|c| named(c, "arguments")).collect();
            format!("[TOOL_CALLS]{}", Value::Array(list))
        }
    }
}

/// Text content of a message (a string, or its text parts joined).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// `messages` (in the template's shape) rewritten so a template that shows no tools renders
/// `tools` (the template's tool list; none: only the conversation's calls and results).
pub fn generic_messages(messages: &[Value], tools: &[Value], format: ToolCallFormat) -> Vec<Value> {
    let section = (!tools.is_empty()).then(|| section(tools, format));
    let mut out = Vec::with_capacity(messages.len() + 1);
    let first_is_system = messages.first().is_some_and(|m| m["role"] == "system");
    if let Some(section) = section.as_ref().filter(|_| !first_is_system) {
        out.push(json!({"role": "system", "content": section}));
    }
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        let mut message = message.clone();
        match role {
            "system" if i == 0 => {
                let Some(section) = &section else {
                    out.push(message);
                    continue;
                };
                let own = text_of(&message["content"]);
                message["content"] = json!(if own.is_empty() {
                    section.clone()
                } else {
                    format!("{own}\n\n{section}")
                });
            }
            "assistant" => {
                if let Some(Value::Array(calls)) =
                    message.as_object_mut().and_then(|m| m.remove("tool_calls"))
                    && !calls.is_empty()
                {
                    let own = text_of(&message["content"]);
                    let calls = calls_text(&calls, format);
                    message["content"] = json!(if own.is_empty() {
                        calls
                    } else {
                        format!("{own}\n{calls}")
                    });
                }
            }
            "tool" => {
                let result = text_of(&message["content"]);
                message = json!({"role": "user", "content": format!("<tool_response>\n{result}\n</tool_response>")});
            }
            _ => {}
        }
        out.push(message);
    }
    out
}

/// The tool-call format a chat template teaches, read off its text: Hermes and Qwen blocks,
/// Mistral's control token, or Llama 3's `ipython` role and JSON calls.
pub fn format_taught(template: &str) -> Option<ToolCallFormat> {
    if template.contains("<tool_call>") {
        Some(ToolCallFormat::Hermes)
    } else if template.contains("[TOOL_CALLS]") {
        Some(ToolCallFormat::Mistral)
    } else if template.contains("ipython") || template.contains("<|python_tag|>") {
        Some(ToolCallFormat::Llama3Json)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "The weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn the_tools_calls_and_results_reach_a_template_that_shows_none() {
        let messages = vec![
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        ];
        let out = generic_messages(&messages, &[weather()], ToolCallFormat::Hermes);
        assert_eq!(out.len(), 4);
        let system = out[0]["content"].as_str().unwrap();
        assert!(
            system
                .contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"")
        );
        assert!(system.contains("<tool_call>"));
        assert_eq!(
            out[2]["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert!(out[2].get("tool_calls").is_none());
        assert_eq!(
            out[3],
            json!({"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"})
        );
        let with_system = vec![
            json!({"role": "system", "content": "Be brief."}),
            messages[0].clone(),
        ];
        let out = generic_messages(&with_system, &[weather()], ToolCallFormat::Llama3Json);
        assert_eq!(out.len(), 2);
        let system = out[0]["content"].as_str().unwrap();
        assert!(
            system.starts_with("Be brief.\n\nYou can call functions")
                && system.contains("\"parameters\"")
        );
        let untouched = generic_messages(&with_system, &[], ToolCallFormat::Hermes);
        assert_eq!(untouched, with_system, "no tools offered: nothing to add");
    }

    #[test]
    fn a_template_teaches_its_format() {
        assert_eq!(
            format_taught("{{ '<tool_call>' }}"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(
            format_taught("[TOOL_CALLS] {{ x }}"),
            Some(ToolCallFormat::Mistral)
        );
        assert_eq!(
            format_taught("<|start_header_id|>ipython"),
            Some(ToolCallFormat::Llama3Json)
        );
        assert_eq!(format_taught("{{ messages }}"), None);
    }
}
