//! Mistral's tool-call envelope: the `[TOOL_CALLS]` control token, then the calls, in either
//! of the two forms Mistral's tokenizers have taught its models:
//!
//! - a JSON list (or object) of `{"name": ..., "arguments": {...}}` (tokenizer v3 onwards);
//! - `NAME[ARGS]{...}` per call, each after its own `[TOOL_CALLS]` (tokenizer v11 onwards).

use super::{ParsedCall, call_of, json_calls};

/// The control token that opens the calls.
pub(super) const MARKER: &str = "[TOOL_CALLS]";
/// What separates a call's name from its arguments in the newer form.
const ARGS: &str = "[ARGS]";

/// The calls in everything after the first marker; `None` when any part is not a call.
pub(super) fn calls(after_marker: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    for part in after_marker.split(MARKER) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if part.starts_with('[') || part.starts_with('{') {
            calls.extend(json_calls(part)?);
            continue;
        }
        let (name, arguments) = part.split_once(ARGS)?;
        let arguments: serde_json::Value = serde_json::from_str(arguments.trim()).ok()?;
        calls.push(call_of(
            serde_json::json!({"name": name.trim(), "arguments": arguments}),
        )?);
    }
    (!calls.is_empty()).then_some(calls)
}
