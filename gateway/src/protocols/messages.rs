//! OpenAI chat messages and function tools in the shape a chat template reads: roles as
//! templates know them (`developer` as `system`), content as text, tool-call arguments parsed
//! into objects; and `tool_choice`, which both protocols write alike. Chat builds its messages
//! here from its wire type; the Responses API builds its own from its items with the same two
//! pieces ([`template_message`], [`template_call`]); both hand them to the facade as the
//! neutral prompt.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::generation::{ToolChoice, Tools};
use crate::openai::chat::{ChatMessage, Content, ContentPart, Tool};

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

/// A message as chat templates read it: a `role` they know (`system`, `user`, `assistant`,
/// `tool`) and text content.
pub(crate) fn template_message(role: &str, content: String) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("role".into(), role.into());
    m.insert("content".into(), content.into());
    m
}

/// A tool call of `kind` (`function`) as chat templates iterate it: its arguments parsed
/// into an object (kept as the string where they are not JSON).
pub(crate) fn template_call(id: &str, kind: &str, name: &str, arguments: &str) -> Value {
    let args = serde_json::from_str::<Value>(arguments)
        .unwrap_or_else(|_| Value::String(arguments.to_string()));
    json!({"id": id, "type": kind, "function": {"name": name, "arguments": args}})
}

/// Messages as the chat template expects them (OpenAI shape, `developer` as `system`, content
/// as text, tool-call arguments parsed into objects as templates iterate them).
pub(crate) fn template_messages(messages: &[ChatMessage]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let param = format!("messages[{i}].content");
        let with_name = |m: &mut Map<String, Value>, name: &Option<String>| {
            if let Some(name) = name {
                m.insert("name".into(), Value::String(name.clone()));
            }
        };
        let m = match message {
            ChatMessage::System { content, name } | ChatMessage::Developer { content, name } => {
                let mut m = template_message("system", content_text(content, &param)?);
                with_name(&mut m, name);
                m
            }
            ChatMessage::User { content, name } => {
                let mut m = template_message("user", content_text(content, &param)?);
                with_name(&mut m, name);
                m
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                name,
            } => {
                let text = content
                    .as_ref()
                    .map(|c| content_text(c, &param))
                    .transpose()?;
                let mut m = template_message("assistant", text.unwrap_or_default());
                with_name(&mut m, name);
                if let Some(calls) = tool_calls.as_ref().filter(|c| !c.is_empty()) {
                    let calls = calls
                        .iter()
                        .map(|c| {
                            template_call(&c.id, &c.kind, &c.function.name, &c.function.arguments)
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                m
            }
            ChatMessage::Tool {
                content,
                tool_call_id,
            } => {
                let mut m = template_message("tool", content_text(content, &param)?);
                m.insert("tool_call_id".into(), tool_call_id.clone().into());
                m
            }
        };
        out.push(Value::Object(m));
    }
    Ok(out)
}

/// Tool definitions for the template; malformed schemas are 400.
pub(crate) fn template_tools(tools: &[Tool]) -> Result<Value, ApiError> {
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

/// The functions `offered`, as the pipeline reads them: a function without `parameters` takes
/// any object, and one without `strict` is `strict_default` (false in chat, true in the
/// Responses API, as OpenAI documents each).
pub(crate) fn tools(
    offered: &[Tool],
    choice: Option<&Value>,
    parallel: Option<bool>,
    strict_default: bool,
) -> Tools {
    Tools {
        names: offered.iter().map(|t| t.function.name.clone()).collect(),
        schemas: offered
            .iter()
            .map(|t| {
                t.function
                    .parameters
                    .clone()
                    .unwrap_or_else(|| json!({"type": "object"}))
            })
            .collect(),
        strict: offered
            .iter()
            .map(|t| t.function.strict.unwrap_or(strict_default))
            .collect(),
        choice: tool_choice(choice),
        parallel: parallel.unwrap_or(true),
        hosted: None,
    }
}

/// `tool_choice`: `auto` (or unset), `none`, `required`, or a named function
/// (`{"type": "function", "function": {"name": ...}}` in chat, `{"type": "function", "name":
/// ...}` in the Responses API); anything else is [`ToolChoice::Other`].
pub(crate) fn tool_choice(choice: Option<&Value>) -> ToolChoice {
    match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str);
            name.map_or(ToolChoice::Other, |n| ToolChoice::Named(n.to_string()))
        }
        Some(_) => ToolChoice::Other,
    }
}
