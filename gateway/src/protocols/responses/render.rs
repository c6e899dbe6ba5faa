//! The response object and its stream of events.
//!
//! A stream is `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its parts and deltas, `response.output_item.done`, and finally
//! `response.completed` (or `response.incomplete` when the token limit cut the answer, or
//! `response.failed` when the engine failed), then `data: [DONE]`. Every event carries
//! `sequence_number`, from 0, and is framed as `event: TYPE` + `data: JSON`.

use axum::body::Bytes;
use serde::Serialize;
use serde_json::{Value, json};

use crate::generation::{Finished, Folded, GenEvent, ServerToolRun, TokenLogprob};
use crate::ids::new_id;
use crate::openai::error::ErrorDetail;
use crate::openai::responses::{
    IncompleteDetails, OutputItem, OutputText, ResponseObject, ResponseUsage,
};
use crate::protocols::render::{Chunk, Render};

/// Ends `response`: its output, status (`incomplete` when the token limit cut it) and usage.
pub(crate) fn finish(
    mut response: ResponseObject,
    output: Vec<OutputItem>,
    finished: Option<Finished>,
    usage: ResponseUsage,
    now: u64,
) -> ResponseObject {
    response.output_text = output
        .iter()
        .filter_map(|item| match item {
            OutputItem::Message { content, .. } => {
                Some(content.iter().map(|c| c.text.as_str()).collect::<String>())
            }
            OutputItem::FunctionCall { .. }
            | OutputItem::Reasoning { .. }
            | OutputItem::McpCall { .. } => None,
        })
        .collect();
    response.output = output;
    response.usage = Some(usage);
    if finished == Some(Finished::Length) {
        response.status = "incomplete".into();
        response.incomplete_details = Some(IncompleteDetails {
            reason: "max_output_tokens".into(),
        });
        if let Some(OutputItem::Message { status, .. }) = response.output.last_mut() {
            *status = "incomplete".into();
        }
    } else {
        response.status = "completed".into();
        response.completed_at = Some(now);
    }
    response
}

/// The output items of a whole (non-streamed) generation: its text as a message (unless it is
/// only whitespace beside tool calls), then one item per tool call.
pub(crate) fn folded_output(folded: &Folded, summary: bool) -> (Vec<OutputItem>, Option<Finished>) {
    let Some(choice) = folded.choices.first() else {
        return (Vec::new(), None);
    };
    let mut output = Vec::new();
    if !choice.reasoning.is_empty() {
        output.push(reasoning_item(new_id("rs_"), &choice.reasoning, summary));
    }
    output.extend(choice.server_tools.iter().map(mcp_call_item));
    if choice.tool_calls.is_empty() || !choice.text.trim().is_empty() {
        output.push(message_item(
            new_id("msg_"),
            choice.text.clone(),
            logprob_values(&choice.logprobs),
            "completed",
        ));
    }
    for call in &choice.tool_calls {
        output.push(OutputItem::FunctionCall {
            id: new_id("fc_"),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            status: "completed".into(),
        });
    }
    (output, choice.finish)
}

/// The item of a server tool the gateway ran.
fn mcp_call_item(run: &ServerToolRun) -> OutputItem {
    OutputItem::McpCall {
        id: format!("mcp_{}", run.call_id.trim_start_matches("call_")),
        server_label: run.server.clone(),
        name: run.name.clone(),
        arguments: run.arguments.clone(),
        output: run.output.as_ref().ok().cloned(),
        error: run.output.as_ref().err().cloned(),
        status: if run.output.is_ok() {
            "completed"
        } else {
            "failed"
        }
        .into(),
    }
}

/// A reasoning item: the text as its one summary part when a summary was asked for, else an
/// empty summary (the text itself is not returned, as OpenAI does not return it).
fn reasoning_item(id: String, text: &str, summary: bool) -> OutputItem {
    OutputItem::Reasoning {
        id,
        summary: if summary {
            vec![json!({"type": "summary_text", "text": text})]
        } else {
            Vec::new()
        },
    }
}

/// Whether the request asked for reasoning summaries (`reasoning.summary` set).
pub(crate) fn wants_summary(response: &ResponseObject) -> bool {
    response
        .reasoning
        .get("summary")
        .is_some_and(|s| !s.is_null())
}

fn message_item(id: String, text: String, logprobs: Vec<Value>, status: &str) -> OutputItem {
    OutputItem::Message {
        id,
        status: status.into(),
        role: "assistant".into(),
        content: vec![OutputText {
            logprobs,
            ..OutputText::new(text)
        }],
    }
}

/// Token log probabilities as the Responses API writes them (asked for with
/// `include: ["message.output_text.logprobs"]`; empty otherwise).
fn logprob_values(tokens: &[TokenLogprob]) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|(token, bytes, logprob)| json!({"token": token, "logprob": logprob, "bytes": bytes}))
                .collect();
            json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes, "top_logprobs": top})
        })
        .collect()
}

/// An event as an SSE frame: `event: TYPE` and `data: JSON`.
pub(crate) fn sse_frame(event: &Value) -> Bytes {
    chunk(event).sse()
}

/// An event as a chunk named by its type.
fn chunk(event: &Value) -> Chunk {
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    Chunk::named(kind, event)
}

/// An event that carries the whole response (`response.created`, `.completed`, ...).
#[derive(Serialize)]
struct WithResponse<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    response: &'a ResponseObject,
}

/// `response.output_text.delta`.
#[derive(Serialize)]
struct TextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    delta: &'a str,
    logprobs: &'a [Value],
}

/// The message being streamed.
#[derive(Debug)]
struct OpenMessage {
    index: usize,
    id: String,
    text: String,
    logprobs: Vec<Value>,
}

/// What the renderer hands over when the stream completes (to be stored).
pub(crate) type OnDone = Box<dyn FnOnce(ResponseObject) + Send>;

/// Renders a generation as Responses API events, each an SSE frame (`event:` and `data:`).
pub(crate) struct EventRenderer {
    response: ResponseObject,
    sequence: u64,
    reasoning: Option<OpenMessage>,
    summary: bool,
    message: Option<OpenMessage>,
    output: Vec<OutputItem>,
    finished: Option<Finished>,
    on_done: Option<OnDone>,
}

impl std::fmt::Debug for EventRenderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRenderer")
            .field("response", &self.response.id)
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

impl EventRenderer {
    /// A renderer for `response` (in progress); `on_done` gets the final object.
    pub(crate) fn new(response: ResponseObject, on_done: Option<OnDone>) -> Self {
        Self {
            summary: wants_summary(&response),
            response,
            sequence: 0,
            reasoning: None,
            message: None,
            output: Vec::new(),
            finished: None,
            on_done,
        }
    }

    fn emit(&mut self, out: &mut Vec<Chunk>, kind: &str, mut fields: Value) {
        if let Some(object) = fields.as_object_mut() {
            object.insert("type".into(), Value::String(kind.into()));
            object.insert("sequence_number".into(), json!(self.sequence));
        }
        out.push(chunk(&fields));
        self.sequence += 1;
    }

    /// An event that carries the whole response, serialised from it straight into the frame.
    fn emit_response(&mut self, out: &mut Vec<Chunk>, kind: &'static str) {
        let event = WithResponse {
            kind,
            sequence_number: self.sequence,
            response: &self.response,
        };
        out.push(Chunk::named(kind, &event));
        self.sequence += 1;
    }

    /// Reasoning text: opens the reasoning item on its first piece; the text goes out as
    /// summary deltas when a summary was asked for.
    fn push_reasoning(&mut self, out: &mut Vec<Chunk>, text: &str) {
        if self.reasoning.is_none() {
            let r = OpenMessage {
                index: self.output.len(),
                id: new_id("rs_"),
                text: String::new(),
                logprobs: Vec::new(),
            };
            let item = reasoning_item(r.id.clone(), "", false);
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": r.index, "item": item}),
            );
            if self.summary {
                let part = json!({"type": "summary_text", "text": ""});
                let at = json!({"item_id": r.id, "output_index": r.index, "summary_index": 0, "part": part});
                self.emit(out, "response.reasoning_summary_part.added", at);
            }
            self.reasoning = Some(r);
        }
        let summary = self.summary;
        let Some(r) = self.reasoning.as_mut() else {
            return;
        };
        r.text.push_str(text);
        let fields =
            json!({"item_id": r.id, "output_index": r.index, "summary_index": 0, "delta": text});
        if summary {
            self.emit(out, "response.reasoning_summary_text.delta", fields);
        }
    }

    fn close_reasoning(&mut self, out: &mut Vec<Chunk>) {
        let Some(r) = self.reasoning.take() else {
            return;
        };
        if self.summary {
            let at = |extra: Value| {
                let mut v = json!({"item_id": r.id, "output_index": r.index, "summary_index": 0});
                if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                    o.extend(e.clone());
                }
                v
            };
            self.emit(
                out,
                "response.reasoning_summary_text.done",
                at(json!({"text": r.text})),
            );
            let part = json!({"type": "summary_text", "text": r.text});
            self.emit(
                out,
                "response.reasoning_summary_part.done",
                at(json!({"part": part})),
            );
        }
        let item = reasoning_item(r.id.clone(), &r.text, self.summary);
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": r.index, "item": item}),
        );
        self.output.push(item);
    }

    fn close_message(&mut self, out: &mut Vec<Chunk>, status: &str) {
        let Some(m) = self.message.take() else { return };
        let part = OutputText {
            logprobs: m.logprobs.clone(),
            ..OutputText::new(m.text.clone())
        };
        let item = message_item(m.id.clone(), m.text.clone(), m.logprobs.clone(), status);
        let at = |extra: Value| {
            let mut v = json!({"item_id": m.id, "output_index": m.index, "content_index": 0});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        self.emit(
            out,
            "response.output_text.done",
            at(json!({"text": m.text, "logprobs": m.logprobs})),
        );
        self.emit(out, "response.content_part.done", at(json!({"part": part})));
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": m.index, "item": item}),
        );
        self.output.push(item);
    }
}

impl EventRenderer {
    /// `response.created` and `response.in_progress`.
    pub(crate) fn opening_events(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.emit_response(&mut out, "response.created");
        self.emit_response(&mut out, "response.in_progress");
        out
    }

    /// The opening events of a response that waits for its place in the model's queue:
    /// `response.created` and `response.queued`, with status `queued`.
    pub(crate) fn queued_events(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.response.status = "queued".into();
        self.emit_response(&mut out, "response.created");
        self.emit_response(&mut out, "response.queued");
        out
    }

    /// `response.in_progress`, once a queued response got its place.
    pub(crate) fn started_events(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.response.status = "in_progress".into();
        self.emit_response(&mut out, "response.in_progress");
        out
    }

    /// The events one generation event makes.
    pub(crate) fn events(&mut self, event: &GenEvent) -> Vec<Chunk> {
        let mut out = Vec::new();
        match event {
            GenEvent::Reasoning { text, .. } => self.push_reasoning(&mut out, text),
            GenEvent::Text { text, logprobs, .. } => {
                if self.message.is_none() {
                    if text.trim().is_empty() {
                        return out;
                    }
                    self.close_reasoning(&mut out);
                    let m = OpenMessage {
                        index: self.output.len(),
                        id: new_id("msg_"),
                        text: String::new(),
                        logprobs: Vec::new(),
                    };
                    let item = OutputItem::Message {
                        id: m.id.clone(),
                        status: "in_progress".into(),
                        role: "assistant".into(),
                        content: Vec::new(),
                    };
                    self.emit(
                        &mut out,
                        "response.output_item.added",
                        json!({"output_index": m.index, "item": item}),
                    );
                    self.emit(
                        &mut out,
                        "response.content_part.added",
                        json!({"item_id": m.id, "output_index": m.index, "content_index": 0, "part": OutputText::new(String::new())}),
                    );
                    self.message = Some(m);
                }
                let sequence_number = self.sequence;
                if let Some(m) = self.message.as_mut() {
                    // The hot path of a stream: serialised straight into the frame.
                    m.text.push_str(text);
                    let logprobs = logprob_values(logprobs);
                    let delta = TextDelta {
                        kind: "response.output_text.delta",
                        sequence_number,
                        item_id: &m.id,
                        output_index: m.index,
                        content_index: 0,
                        delta: text,
                        logprobs: &logprobs,
                    };
                    out.push(Chunk::named(delta.kind, &delta));
                    m.logprobs.extend(logprobs);
                    self.sequence += 1;
                }
            }
            GenEvent::ToolCall {
                id,
                name,
                arguments,
                ..
            } => {
                self.close_reasoning(&mut out);
                self.close_message(&mut out, "completed");
                let index = self.output.len();
                let item_id = new_id("fc_");
                let item = |arguments: &str, status: &str| OutputItem::FunctionCall {
                    id: item_id.clone(),
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.to_string(),
                    status: status.into(),
                };
                self.emit(
                    &mut out,
                    "response.output_item.added",
                    json!({"output_index": index, "item": item("", "in_progress")}),
                );
                self.emit(
                    &mut out,
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": arguments}),
                );
                self.emit(
                    &mut out,
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "name": name, "arguments": arguments}),
                );
                let done = item(arguments, "completed");
                self.emit(
                    &mut out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": done}),
                );
                self.output.push(done);
            }
            GenEvent::ServerTool(run) => {
                self.close_reasoning(&mut out);
                self.close_message(&mut out, "completed");
                let index = self.output.len();
                let done = mcp_call_item(run);
                let mut added = done.clone();
                if let OutputItem::McpCall {
                    output,
                    error,
                    status,
                    ..
                } = &mut added
                {
                    (*output, *error) = (None, None);
                    *status = "in_progress".into();
                }
                self.emit(
                    &mut out,
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                self.emit(
                    &mut out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": done}),
                );
                self.output.push(done);
            }
            GenEvent::Finish { reason, .. } => self.finished = Some(*reason),
            GenEvent::Usage(t) => {
                let cut = self.finished == Some(Finished::Length);
                self.close_reasoning(&mut out);
                self.close_message(&mut out, if cut { "incomplete" } else { "completed" });
                let output = std::mem::take(&mut self.output);
                let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning)
                    .with_cost(t.cost.map(|c| c.0));
                self.response = finish(
                    self.response.clone(),
                    output,
                    self.finished,
                    usage,
                    crate::clock::unix_now(),
                );
                let kind = if cut {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit_response(&mut out, kind);
                if let Some(done) = self.on_done.take() {
                    done(self.response.clone());
                }
            }
            GenEvent::Error(_) => {}
        }
        out
    }

    /// `response.failed` for a failure after the head.
    pub(crate) fn failure_events(&mut self, error: &ErrorDetail) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.close_reasoning(&mut out);
        self.close_message(&mut out, "incomplete");
        self.response.status = "failed".into();
        self.response.output = std::mem::take(&mut self.output);
        self.response.error = Some(
            json!({"code": error.code.as_deref().unwrap_or("server_error"), "message": error.message}),
        );
        self.emit_response(&mut out, "response.failed");
        out
    }

    /// The response as it stands (final once the last event was made).
    pub(crate) fn response(&self) -> &ResponseObject {
        &self.response
    }
}

impl Render for EventRenderer {
    fn opening(&mut self) -> Vec<Chunk> {
        self.opening_events()
    }

    fn event(&mut self, event: &GenEvent) -> Vec<Chunk> {
        self.events(event)
    }

    fn failure(&mut self, error: &ErrorDetail) -> Option<Vec<Chunk>> {
        Some(self.failure_events(error))
    }
}
