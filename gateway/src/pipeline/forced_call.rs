//! Forced tool calls as grammars: `tool_choice: "required"` or a named function becomes a
//! grammar that produces the model's own tool-call envelope (the format its configured parser
//! reads, so streamed and non-streamed calls come back exactly as with `auto`), with each
//! function's `parameters` schema applied to its arguments. The engine must constrain output by
//! grammar (its model's capability says so); without one the request is refused.
//!
//! - `llama3_json`: one JSON call, `{"name": NAME, "parameters": {...}}`;
//! - `hermes`: `<tool_call>` blocks of `{"name": NAME, "arguments": {...}}`, one, or as many as
//!   the model writes when parallel calls are allowed;
//! - `mistral`: the `[TOOL_CALLS]` control token (by its id, so the model writes the token and
//!   not its text) and a JSON list of `{"name": NAME, "arguments": {...}}`, of one call or more.

use serde_json::{Value, json};
use turnpike_engine_api::docs::Grammar;

use crate::text::tools::ToolCallFormat;

/// The grammar of a forced call to one of `tools` (name and `parameters` schema each) in
/// `format`; several calls only where `parallel` and the format has a way to write them.
/// `control` is the id of the format's control token in the model's vocabulary (else its
/// text is written).
pub(crate) fn grammar(
    format: ToolCallFormat,
    tools: &[(&str, &Value)],
    parallel: bool,
    control: Option<u32>,
) -> Grammar {
    let arguments = match format {
        ToolCallFormat::Llama3Json => "parameters",
        ToolCallFormat::Hermes | ToolCallFormat::Mistral => "arguments",
    };
    let calls: Vec<Value> = tools
        .iter()
        .map(|(name, schema)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, arguments: schema},
                "required": ["name", arguments],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    // JSON text is valid Lark `%json` content as is; compact, as JSON answers are.
    let mut call = call;
    if let Value::Object(map) = &mut call {
        map.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
    }
    match format {
        ToolCallFormat::Llama3Json => Grammar::JsonSchema { schema: call },
        ToolCallFormat::Mistral => {
            let marker = match (control, format.control_token()) {
                (Some(id), _) => format!("<[{id}]>"),
                (None, Some(text)) => Value::from(text).to_string(),
                (None, None) => String::new(),
            };
            let more = if parallel { " (\",\" call)*" } else { "" };
            Grammar::Lark {
                grammar: format!("start: {marker} \"[\" call{more} \"]\"\ncall: %json {call}\n"),
            }
        }
        ToolCallFormat::Hermes => {
            let block = format!("\"<tool_call>\\n\" %json {call} \"\\n</tool_call>\"");
            let start = if parallel {
                "start: call (\"\\n\" call)*"
            } else {
                "start: call"
            };
            Grammar::Lark {
                grammar: format!("{start}\ncall: {block}\n"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_gets_its_own_envelope() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let Grammar::JsonSchema { schema: one } = grammar(
            ToolCallFormat::Llama3Json,
            &[("get_weather", &schema)],
            true,
            None,
        ) else {
            panic!("llama3_json is a JSON Schema");
        };
        assert_eq!(one["properties"]["name"]["const"], "get_weather");
        assert_eq!(one["properties"]["parameters"], schema);
        let Grammar::Lark { grammar: lark } = grammar(
            ToolCallFormat::Hermes,
            &[("a", &schema), ("b", &schema)],
            false,
            None,
        ) else {
            panic!("hermes is Lark");
        };
        assert!(lark.starts_with("start: call\n"), "{lark}");
        assert!(
            lark.contains("<tool_call>") && lark.contains("\"anyOf\""),
            "{lark}"
        );
        let Grammar::Lark { grammar: lark } =
            grammar(ToolCallFormat::Mistral, &[("a", &schema)], true, Some(9))
        else {
            panic!("mistral is Lark");
        };
        assert!(
            lark.starts_with("start: <[9]> \"[\" call (\",\" call)* \"]\"\n"),
            "{lark}"
        );
    }
}
