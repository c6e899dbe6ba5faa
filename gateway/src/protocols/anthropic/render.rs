//! A generation as Anthropic's answer: one `message`, or its event stream (`message_start`,
//! `content_block_start` / `_delta` / `_stop` per text, thinking and tool-use block,
//! `message_delta` with the stop reason and usage, `message_stop`; keep-alives are `ping`s), and
//! errors in Anthropic's shape with the statuses its SDKs expect.

use serde_json::{Value, json};

use crate::anthropic::{ContentBlock, ErrorBody, ErrorDetail, Message, Usage};
use crate::generation::{Finished, Folded, GenEvent, Totals};
use crate::openai::error::ErrorDetail as OpenAiError;
use crate::protocols::render::{Chunk, Render};

/// Anthropic's stop reason and the stop sequence that ended the answer, if one did.
pub(crate) fn stop_reason(
    finished: Option<Finished>,
    stops: &[String],
) -> (&'static str, Option<String>) {
    match finished {
        Some(Finished::Length) => ("max_tokens", None),
        Some(Finished::ToolCalls) => ("tool_use", None),
        Some(Finished::StopString(i)) => ("stop_sequence", stops.get(i as usize).cloned()),
        Some(Finished::Stop) | None => ("end_turn", None),
    }
}

fn usage(totals: Totals) -> Usage {
    Usage {
        input_tokens: totals.prompt.saturating_sub(totals.cached),
        output_tokens: totals.completion,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: totals.cached,
    }
}

/// A tool call's id as Anthropic writes them.
fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.trim_start_matches("call_"))
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// The whole answer.
pub(crate) fn message(
    id: String,
    model: String,
    folded: Folded,
    thinking: bool,
    stops: &[String],
) -> Message {
    let mut content = Vec::new();
    let choice = folded.choices.into_iter().next().unwrap_or_default();
    if thinking && !choice.reasoning.is_empty() {
        content.push(ContentBlock::Thinking {
            thinking: choice.reasoning,
            signature: String::new(),
        });
    }
    if !choice.text.is_empty() || choice.tool_calls.is_empty() {
        content.push(ContentBlock::Text { text: choice.text });
    }
    for call in choice.tool_calls {
        content.push(ContentBlock::ToolUse {
            id: tool_use_id(&call.id),
            name: call.name,
            input: tool_input(&call.arguments),
        });
    }
    let (reason, sequence) = stop_reason(choice.finish, stops);
    Message {
        id,
        kind: "message",
        role: "assistant",
        model,
        content,
        stop_reason: Some(reason),
        stop_sequence: sequence,
        usage: usage(folded.totals),
    }
}

/// Anthropic's error type and status for an error the gateway answers with `status`.
pub(crate) fn error_kind(status: u16, code: Option<&str>) -> (u16, &'static str) {
    match (status, code) {
        (
            _,
            Some(
                "queue_full" | "engine_unavailable" | "server_shutting_down" | "plugin_unavailable",
            ),
        ) => (529, "overloaded_error"),
        (401, _) => (401, "authentication_error"),
        (403, _) => (403, "permission_error"),
        (404, _) => (404, "not_found_error"),
        (413, _) => (413, "request_too_large"),
        (429, _) => (429, "rate_limit_error"),
        (s, _) if s >= 500 => (500, "api_error"),
        (s, _) => (s, "invalid_request_error"),
    }
}

/// An error body in Anthropic's shape.
pub(crate) fn error_body(kind: &'static str, message: String) -> ErrorBody {
    ErrorBody {
        kind: "error",
        error: ErrorDetail { kind, message },
    }
}

/// Which block is open in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// Renders a generation as Anthropic's events.
#[derive(Debug)]
pub(crate) struct EventRenderer {
    id: String,
    model: String,
    prompt_tokens: u64,
    thinking: bool,
    stops: Vec<String>,
    /// The index the next block takes.
    next: usize,
    open: Option<Open>,
    finished: Option<Finished>,
}

impl EventRenderer {
    pub(crate) fn new(
        id: String,
        model: String,
        prompt_tokens: u64,
        thinking: bool,
        stops: Vec<String>,
    ) -> Self {
        Self {
            id,
            model,
            prompt_tokens,
            thinking,
            stops,
            next: 0,
            open: None,
            finished: None,
        }
    }

    fn close(&mut self, out: &mut Vec<Chunk>) {
        if self.open.take().is_some() {
            out.push(Chunk::named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.next - 1}),
            ));
        }
    }

    fn delta(&mut self, out: &mut Vec<Chunk>, kind: Open, text: &str) {
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                Open::Text => json!({"type": "text", "text": ""}),
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push(Chunk::named(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.next, "content_block": block}),
            ));
            self.open = Some(kind);
            self.next += 1;
        }
        let delta = match kind {
            Open::Text => json!({"type": "text_delta", "text": text}),
            Open::Thinking => json!({"type": "thinking_delta", "thinking": text}),
        };
        out.push(Chunk::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta}),
        ));
    }
}

impl Render for EventRenderer {
    fn opening(&mut self) -> Vec<Chunk> {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        });
        vec![Chunk::named(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        )]
    }

    fn event(&mut self, event: &GenEvent) -> Vec<Chunk> {
        let mut out = Vec::new();
        match event {
            GenEvent::Text {
                choice: 0, text, ..
            } if !text.is_empty() => self.delta(&mut out, Open::Text, text),
            GenEvent::Reasoning { choice: 0, text } if self.thinking && !text.is_empty() => {
                self.delta(&mut out, Open::Thinking, text);
            }
            GenEvent::ToolCall {
                choice: 0,
                id,
                name,
                arguments,
                ..
            } => {
                self.close(&mut out);
                let index = self.next;
                self.next += 1;
                out.push(Chunk::named("content_block_start", &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}}})));
                out.push(Chunk::named(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                ));
                out.push(Chunk::named(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": index}),
                ));
            }
            GenEvent::Finish { choice: 0, reason } => self.finished = Some(*reason),
            GenEvent::Usage(totals) => {
                self.close(&mut out);
                let (reason, sequence) = stop_reason(self.finished, &self.stops);
                out.push(Chunk::named(
                    "message_delta",
                    &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(*totals)}),
                ));
                out.push(Chunk::named(
                    "message_stop",
                    &json!({"type": "message_stop"}),
                ));
            }
            _ => {}
        }
        out
    }

    fn failure(&mut self, error: &OpenAiError) -> Option<Vec<Chunk>> {
        let (_, kind) = error_kind(500, error.code.as_deref());
        let kind = if kind == "overloaded_error" {
            kind
        } else {
            "api_error"
        };
        Some(vec![Chunk::named(
            "error",
            &error_body(kind, error.message.clone()),
        )])
    }
}
