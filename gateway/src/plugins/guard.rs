//! A generation request as a guard sees it, and a guard's rewrite applied back: message
//! contents and prompt texts, by position, nothing else.

use serde_json::Value;
use turnpike_plugin_api::json::{GuardMessage, GuardRequest};

use crate::pipeline::request::{GenerationRequest, Prompt};

/// The text of a message content: a string, or the text parts of a content array.
fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => None,
    }
}

/// What a guard is shown of `req`.
pub(super) fn guard_request(
    req: &GenerationRequest,
    tenant: &str,
    model: &str,
    endpoint: &str,
) -> GuardRequest {
    let (messages, prompt) = match &req.prompt {
        Prompt::Chat { messages, .. } => (
            Some(
                messages
                    .iter()
                    .map(|m| GuardMessage {
                        role: m
                            .get("role")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        content: content_text(m.get("content")),
                    })
                    .collect(),
            ),
            None,
        ),
        Prompt::Texts(Value::String(text)) => (None, Some(vec![text.clone()])),
        Prompt::Texts(Value::Array(items)) if items.iter().all(Value::is_string) => (
            None,
            Some(
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
            ),
        ),
        // Token ids carry no text to judge.
        Prompt::Texts(_) => (None, None),
    };
    GuardRequest {
        tenant: tenant.to_string(),
        model: model.to_string(),
        endpoint: endpoint.to_string(),
        messages,
        prompt,
        tools: req.tools.names.clone(),
        metadata: req
            .metadata
            .clone()
            .unwrap_or(Value::Object(Default::default())),
    }
}

/// `req` with the texts of `rewritten` (same number of messages or prompts: the host checked).
pub(super) fn apply_rewrite(
    req: &GenerationRequest,
    rewritten: &GuardRequest,
) -> GenerationRequest {
    let mut out = req.clone();
    match (&mut out.prompt, &rewritten.messages, &rewritten.prompt) {
        (Prompt::Chat { messages, .. }, Some(new), _) => {
            for (message, new) in messages.iter_mut().zip(new) {
                let before = content_text(message.get("content"));
                if before == new.content {
                    continue;
                }
                if let Some(object) = message.as_object_mut() {
                    let content = new.content.clone().map_or(Value::Null, Value::String);
                    object.insert("content".into(), content);
                }
            }
        }
        (Prompt::Texts(value), _, Some(new)) => {
            *value = match value {
                Value::String(_) => new.first().cloned().map_or(Value::Null, Value::String),
                _ => Value::Array(new.iter().cloned().map(Value::String).collect()),
            };
        }
        _ => {}
    }
    out
}
