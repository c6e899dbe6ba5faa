//! Tool calls out of generated text, once in the gateway for every engine.
//!
//! A model calls tools by writing them in its own format; the model's configuration names the
//! format (`tool_call_parser`), as its chat template taught the model:
//!
//! - `llama3_json`: the whole answer is a JSON call `{"name": ..., "arguments"|"parameters": {...}}`,
//!   a list of them, or several separated by `;`. An answer that starts with `{` or `[` is held
//!   until it ends; one that does not is plain text and streams as it comes.
//! - `hermes` (also `qwen`: Qwen 2.5 and 3 write the same blocks): calls are
//!   `<tool_call>{json}</tool_call>` blocks; text around them is content and streams as it
//!   comes, less any tail that could still begin a block.
//! - `mistral`: the `[TOOL_CALLS]` control token, then a JSON list of calls or `NAME[ARGS]{...}`
//!   calls ([`mistral`]); text before it is content and streams, the calls are held until the
//!   answer ends. The token is special, so the decoder keeps special tokens for this format.
//!
//! The parser sits after stop strings in the one stream every response is made from, so a
//! streamed response and a non-streamed one always carry the same calls. Only functions the
//! request offered become calls; anything that does not parse, or names another function, stays
//! text, so nothing the model wrote is lost. A forced call (`tool_choice` `required` or named)
//! that the answer's end cuts short (`max_tokens`) is still a call: its name and the arguments
//! written so far, as OpenAI returns it ([`ToolCallParser::forced`]).

mod mistral;

use serde::Deserialize;
use serde_json::Value;

/// A model's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// Llama 3.x JSON calls.
    Llama3Json,
    /// `<tool_call>` blocks (Hermes, Qwen).
    #[serde(alias = "qwen")]
    Hermes,
    /// `[TOOL_CALLS]` then the calls (Mistral).
    Mistral,
}

impl ToolCallFormat {
    /// Whether the envelope holds special tokens, which the decoder must then keep.
    pub fn needs_special_tokens(self) -> bool {
        self.control_token().is_some()
    }

    /// The control token that opens the envelope, where the format has one.
    pub fn control_token(self) -> Option<&'static str> {
        match self {
            Self::Mistral => Some(mistral::MARKER),
            Self::Llama3Json | Self::Hermes => None,
        }
    }
}

/// A parsed call: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// Function name.
    pub name: String,
    /// Arguments, a JSON object as text (`{}` when the model gave none).
    pub arguments: String,
}

/// What the parser lets through, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// Content text.
    Text(String),
    /// A call.
    Call(ParsedCall),
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Llama 3 JSON: only whitespace so far.
    Undecided,
    /// Text that streams through (`hermes`: outside a block).
    Text,
    /// Held: a JSON answer, or the inside of a `<tool_call>` block.
    Held,
}

/// Per-choice parser state.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// The functions the request offered.
    names: Vec<String>,
    /// Most calls to return (1 when `parallel_tool_calls` is false).
    max_calls: usize,
    calls: usize,
    state: State,
    buf: String,
    /// `hermes`, inside a block: bytes of `buf` already searched for the closing tag.
    scanned: usize,
    /// `hermes`, outside blocks: whitespace held back, as it is content only if text follows.
    ws: String,
    /// Content has been sent.
    said: bool,
    /// The request forces a call: one cut short is returned as a call.
    forced: bool,
}

impl ToolCallParser {
    /// A parser for `format` accepting calls of `names`, at most `max_calls` of them.
    pub fn new(format: ToolCallFormat, names: Vec<String>, max_calls: usize) -> Self {
        let state = match format {
            ToolCallFormat::Llama3Json => State::Undecided,
            ToolCallFormat::Hermes | ToolCallFormat::Mistral => State::Text,
        };
        Self {
            format,
            names,
            max_calls,
            calls: 0,
            state,
            buf: String::new(),
            scanned: 0,
            ws: String::new(),
            said: false,
            forced: false,
        }
    }

    /// The same parser for a request that forces a call (`tool_choice` `required` or named):
    /// a call the answer's end cuts short is returned as a call of its name with the arguments
    /// written so far (which may not be whole JSON), not as text.
    pub fn forced(self) -> Self {
        Self {
            forced: true,
            ..self
        }
    }

    /// Adds text; returns what may be sent now.
    pub fn push(&mut self, text: &str, out: &mut Vec<ToolOutput>) {
        self.buf.push_str(text);
        match self.format {
            ToolCallFormat::Llama3Json => self.push_json(out),
            ToolCallFormat::Hermes => self.push_hermes(out),
            ToolCallFormat::Mistral => self.push_mistral(out),
        }
    }

    /// The text has ended: returns everything still held.
    pub fn finish(&mut self, out: &mut Vec<ToolOutput>) {
        let held = std::mem::take(&mut self.buf);
        if self.forced && self.state == State::Held && self.finish_cut(&held, out) {
            return;
        }
        match (self.format, self.state) {
            (ToolCallFormat::Llama3Json, State::Held) => match json_calls(&held) {
                Some(calls) if calls.iter().all(|c| self.offered(c)) => {
                    for call in calls {
                        self.emit(call, out);
                    }
                }
                _ => text(out, held),
            },
            (ToolCallFormat::Hermes, State::Held) => {
                // A block the model did not close before it stopped.
                match block_call(&held).filter(|c| self.offered(c)) {
                    Some(call) => self.emit(call, out),
                    None => self.content(out, &format!("{OPEN}{held}"), false),
                }
            }
            (ToolCallFormat::Mistral, State::Held) => match mistral::calls(&held) {
                Some(calls) if calls.iter().all(|c| self.offered(c)) => {
                    for call in calls {
                        self.emit(call, out);
                    }
                }
                _ => self.content(out, &format!("{}{held}", mistral::MARKER), false),
            },
            (ToolCallFormat::Hermes | ToolCallFormat::Mistral, _) => {
                self.content(out, &held, false);
                // An answer of nothing but whitespace is still the answer.
                if self.calls == 0 {
                    text(out, std::mem::take(&mut self.ws));
                }
            }
            _ => text(out, held),
        }
    }

    /// A forced answer cut short: its whole calls, then the one cut, as calls; whether it
    /// held one.
    fn finish_cut(&mut self, held: &str, out: &mut Vec<ToolOutput>) -> bool {
        let (whole, rest) = whole_calls(held);
        let Some(cut) = partial_call(rest, &self.names) else {
            return false;
        };
        let whole: Vec<ParsedCall> = whole.into_iter().filter(|c| self.offered(c)).collect();
        for call in whole {
            self.emit(call, out);
        }
        self.emit(cut, out);
        true
    }

    fn offered(&self, call: &ParsedCall) -> bool {
        self.names.contains(&call.name)
    }

    fn emit(&mut self, call: ParsedCall, out: &mut Vec<ToolOutput>) {
        if self.calls < self.max_calls {
            out.push(ToolOutput::Call(call));
        }
        self.calls += 1;
    }

    fn push_json(&mut self, out: &mut Vec<ToolOutput>) {
        if self.state == State::Undecided {
            match self.buf.trim_start().chars().next() {
                None => return,
                Some('{' | '[') => self.state = State::Held,
                Some(_) => self.state = State::Text,
            }
        }
        if self.state == State::Text {
            text(out, std::mem::take(&mut self.buf));
        }
    }

    fn push_hermes(&mut self, out: &mut Vec<ToolOutput>) {
        loop {
            match self.state {
                State::Held => {
                    // Only the new bytes are searched (and a tag's length before them).
                    let start = self.scanned.saturating_sub(CLOSE.len() - 1);
                    let Some(at) = find_bytes(&self.buf.as_bytes()[start..], CLOSE.as_bytes())
                    else {
                        self.scanned = self.buf.len();
                        return;
                    };
                    let at = start + at; // the tag is ASCII, so `at` is a character boundary
                    let body: String = self.buf.drain(..at + CLOSE.len()).collect();
                    let body = &body[..at];
                    match block_call(body).filter(|c| self.offered(c)) {
                        Some(call) => self.emit(call, out),
                        None => {
                            self.content(out, &format!("{OPEN}{body}{CLOSE}"), false);
                        }
                    }
                    self.state = State::Text;
                    self.scanned = 0;
                }
                _ => {
                    if let Some(at) = self.buf.find(OPEN) {
                        let before: String = self.buf.drain(..at + OPEN.len()).collect();
                        self.content(out, &before[..at], true);
                        self.state = State::Held;
                        continue;
                    }
                    let hold = held_prefix(&self.buf, OPEN);
                    let ready: String = self.buf.drain(..self.buf.len() - hold).collect();
                    self.content(out, &ready, false);
                    return;
                }
            }
        }
    }

    fn push_mistral(&mut self, out: &mut Vec<ToolOutput>) {
        if self.state == State::Held {
            return;
        }
        if let Some(at) = self.buf.find(mistral::MARKER) {
            let before: String = self.buf.drain(..at + mistral::MARKER.len()).collect();
            self.content(out, &before[..at], true);
            self.state = State::Held;
            return;
        }
        let hold = held_prefix(&self.buf, mistral::MARKER);
        let ready: String = self.buf.drain(..self.buf.len() - hold).collect();
        self.content(out, &ready, false);
    }

    /// Content outside blocks. Whitespace before any content or after a call is held until
    /// text follows (then it is sent with it); a block that follows drops it, so an answer of
    /// calls alone has no content.
    fn content(&mut self, out: &mut Vec<ToolOutput>, piece: &str, block_follows: bool) {
        if piece.trim().is_empty() && (self.calls > 0 || !self.said) {
            if block_follows {
                self.ws.clear();
            } else {
                self.ws.push_str(piece);
            }
            return;
        }
        let mut sent = std::mem::take(&mut self.ws);
        sent.push_str(piece);
        self.said |= !sent.is_empty();
        text(out, sent);
    }
}

/// Where `needle` first occurs in `haystack`.
fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn text(out: &mut Vec<ToolOutput>, text: String) {
    if !text.is_empty() {
        out.push(ToolOutput::Text(text));
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn held_prefix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&len| s.ends_with(&tag[..len]))
        .unwrap_or(0)
}

/// One call object: `{"name": ..., "arguments" | "parameters": {...} or "{...}"}`.
fn call_of(value: Value) -> Option<ParsedCall> {
    let Value::Object(mut map) = value else {
        return None;
    };
    let Some(Value::String(name)) = map.remove("name") else {
        return None;
    };
    let args = map.remove("arguments").or_else(|| map.remove("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::Object(o)) => Value::Object(o).to_string(),
        // Arguments already encoded as a string must hold a JSON object.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(o)) => Value::Object(o).to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

/// The calls that are whole at the start of `text` (a list's items, or `;`-separated objects)
/// and where the rest begins.
fn whole_calls(text: &str) -> (Vec<ParsedCall>, &str) {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    rest = rest.strip_prefix('[').unwrap_or(rest);
    loop {
        let next = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
        let mut values = serde_json::Deserializer::from_str(next).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => match call_of(value) {
                Some(call) => {
                    calls.push(call);
                    rest = &next[values.byte_offset()..];
                }
                None => return (calls, next),
            },
            _ => return (calls, next),
        }
    }
}

/// A call object cut short: its function (one of `names`; a cut name must begin exactly one)
/// and its arguments as written so far.
fn partial_call(text: &str, names: &[String]) -> Option<ParsedCall> {
    let after_key = |key: &str| -> Option<&str> {
        let at = text.find(key)? + key.len();
        text[at..]
            .trim_start()
            .strip_prefix(':')
            .map(str::trim_start)
    };
    let name_text = after_key("\"name\"")?.strip_prefix('"')?;
    let name = match name_text.find('"') {
        Some(end) => name_text[..end].to_string(),
        None => {
            let mut matching = names.iter().filter(|n| n.starts_with(name_text));
            let only = matching.next()?;
            if matching.next().is_some() {
                return None;
            }
            only.clone()
        }
    };
    if !names.contains(&name) {
        return None;
    }
    let arguments = after_key("\"arguments\"")
        .or_else(|| after_key("\"parameters\""))
        .unwrap_or_default()
        .trim_end()
        .to_string();
    Some(ParsedCall { name, arguments })
}

/// The inside of a `<tool_call>` block.
fn block_call(body: &str) -> Option<ParsedCall> {
    call_of(serde_json::from_str(body.trim()).ok()?)
}

/// A whole Llama 3 JSON answer: call objects, alone, in a list, or separated by `;`.
fn json_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        rest = &rest[values.byte_offset()..];
        match value {
            Value::Array(items) => {
                for item in items {
                    calls.push(call_of(item)?);
                }
            }
            other => calls.push(call_of(other)?),
        }
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests;
