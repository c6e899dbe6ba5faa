//! Tool calls as grammars, in the model's own tool-call envelope (the format its configured
//! parser reads, so streamed and non-streamed calls come back exactly as unconstrained ones),
//! with each function's `parameters` schema applied to its arguments (its objects closed to the
//! properties they declare). The engine must constrain output by grammar (its model's
//! capability says so).
//!
//! [`forced`]: `tool_choice: "required"` or a named function; the answer is calls only.
//! - `llama3_json`: one JSON call, `{"name": NAME, "parameters": {...}}`;
//! - `hermes`: `<tool_call>` blocks of `{"name": NAME, "arguments": {...}}`, one, or as many as
//!   the model writes when parallel calls are allowed;
//! - `mistral`: the `[TOOL_CALLS]` control token (by its id, so the model writes the token and
//!   not its text) and a JSON list of `{"name": NAME, "arguments": {...}}`, of one call or more.
//!
//! [`auto`]: `tool_choice: "auto"` with a function marked `strict`; the model writes what it
//! likes until it opens a call, and from there the call is held to the schemas: after
//! `<tool_call>` (hermes, through a lazy match that ends at the tag), after the control token
//! (mistral), or as the whole answer when it begins a JSON value (`llama3_json`, whose parser
//! reads any answer that begins with `{` or `[` as calls).

use serde_json::{Value, json};
use turnpike_engine_api::json::Grammar;

use crate::text::tools::ToolCallFormat;

/// `schema` with every object that lists its `properties` and says nothing of others closed to
/// them (`additionalProperties: false`): a function's arguments are the parameters it declares,
/// and a small model left an open object invents keys until `max_tokens`.
fn closed(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = serde_json::Map::with_capacity(map.len() + 1);
    for (key, value) in map {
        let value = match (key.as_str(), value) {
            ("properties" | "$defs" | "definitions", Value::Object(children)) => Value::Object(
                children
                    .iter()
                    .map(|(k, v)| (k.clone(), closed(v)))
                    .collect(),
            ),
            ("items" | "additionalItems" | "not", v) => closed(v),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(list)) => {
                Value::Array(list.iter().map(closed).collect())
            }
            (_, v) => v.clone(),
        };
        out.insert(key.clone(), value);
    }
    let open = !map.contains_key("additionalProperties")
        && !map.contains_key("patternProperties")
        && !map.contains_key("unevaluatedProperties");
    if map.contains_key("properties") && open {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

/// One call's JSON Schema over `tools` (name and arguments schema each, closed); compact, or
/// with the whitespace the model likes where `flexible`. Llama 3 JSON calls name their
/// arguments `parameters` (its template's word) or `arguments` (which its parser also reads).
fn call_schema(format: ToolCallFormat, tools: &[(&str, &Value)], flexible: bool) -> Value {
    let keys: &[&str] = match format {
        ToolCallFormat::Llama3Json => &["parameters", "arguments"],
        ToolCallFormat::Hermes | ToolCallFormat::Mistral => &["arguments"],
    };
    let calls: Vec<Value> = tools
        .iter()
        .flat_map(|(name, schema)| {
            let schema = closed(schema);
            keys.iter().map(move |arguments| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, *arguments: schema},
                    "required": ["name", arguments],
                    "additionalProperties": false,
                })
            })
        })
        .collect();
    let mut call = if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    // JSON text is valid Lark `%json` content as is.
    if let Value::Object(map) = &mut call {
        map.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": flexible}),
        );
    }
    call
}

/// The control token as a Lark terminal: by `control` id, else its text.
fn control_terminal(format: ToolCallFormat, control: Option<u32>) -> String {
    match (control, format.control_token()) {
        (Some(id), _) => format!("<[{id}]>"),
        (None, Some(text)) => Value::from(text).to_string(),
        (None, None) => String::new(),
    }
}

/// The grammar of a forced call to one of `tools` (name and `parameters` schema each) in
/// `format`; several calls only where `parallel` and the format has a way to write them.
/// `control` is the id of the format's control token in the model's vocabulary (else its
/// text is written).
pub(crate) fn forced(
    format: ToolCallFormat,
    tools: &[(&str, &Value)],
    parallel: bool,
    control: Option<u32>,
) -> Grammar {
    // Compact: a call the model must make leaves it no room to wander in whitespace.
    let call = call_schema(format, tools, false);
    match format {
        ToolCallFormat::Llama3Json => Grammar::JsonSchema { schema: call },
        ToolCallFormat::Mistral => {
            let marker = control_terminal(format, control);
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

/// The grammar of a free answer whose calls, once begun, are calls of `tools` (name and the
/// schema its arguments are held to) in `format`; arguments as [`forced`].
pub(crate) fn auto(
    format: ToolCallFormat,
    tools: &[(&str, &Value)],
    parallel: bool,
    control: Option<u32>,
) -> Grammar {
    // The model's own spacing: a call it chose to make is written as it was taught.
    let call = call_schema(format, tools, true);
    let repeat = if parallel { "*" } else { "?" };
    let grammar = match format {
        ToolCallFormat::Llama3Json => {
            format!("start: call | text\ncall: %json {call}\ntext: /(?s:\\s*([^\\s{{\\[].*)?)/\n")
        }
        ToolCallFormat::Hermes => format!(
            "start: (pre call){repeat} text\npre[suffix=\"<tool_call>\"]: /(?s:.*)/\n\
             text: /(?s:.*)/\ncall: \"\\n\" %json {call} \"\\n</tool_call>\"\n"
        ),
        ToolCallFormat::Mistral => {
            let more = if parallel { " (\",\" call)*" } else { "" };
            let calls = format!("\"[\" call{more} \"]\"");
            match control {
                // A control token is no text: the text ends where the model writes it.
                Some(id) => format!(
                    "start: text | text <[{id}]> {calls}\ntext: /(?s:.*)/\ncall: %json {call}\n"
                ),
                None => format!(
                    "start: text | pre {calls}\npre[suffix={}]: /(?s:.*)/\n\
                     text: /(?s:.*)/\ncall: %json {call}\n",
                    control_terminal(format, None)
                ),
            }
        }
    };
    Grammar::Lark { grammar }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_gets_its_own_envelope() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let Grammar::JsonSchema { schema: one } = forced(
            ToolCallFormat::Llama3Json,
            &[("get_weather", &schema)],
            true,
            None,
        ) else {
            panic!("llama3_json is a JSON Schema");
        };
        assert_eq!(
            one["anyOf"][0]["properties"]["name"]["const"],
            "get_weather"
        );
        assert_eq!(one["anyOf"][0]["properties"]["parameters"], closed(&schema));
        assert_eq!(one["anyOf"][1]["properties"]["arguments"], closed(&schema));
        let Grammar::Lark { grammar: lark } = forced(
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
            forced(ToolCallFormat::Mistral, &[("a", &schema)], true, Some(9))
        else {
            panic!("mistral is Lark");
        };
        assert!(
            lark.starts_with("start: <[9]> \"[\" call (\",\" call)* \"]\"\n"),
            "{lark}"
        );
    }

    #[test]
    fn declared_parameters_close_their_objects() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
            "free": {"type": "object"}, "open": {"type": "object", "properties": {}, "additionalProperties": true}}});
        let c = closed(&schema);
        assert_eq!(c["additionalProperties"], false);
        assert_eq!(c["properties"]["where"]["additionalProperties"], false);
        assert_eq!(
            c["properties"]["tags"]["items"]["additionalProperties"],
            false
        );
        assert!(
            c["properties"]["free"]
                .get("additionalProperties")
                .is_none()
        );
        assert_eq!(c["properties"]["open"]["additionalProperties"], true);
    }

    #[test]
    fn auto_lets_text_through_until_a_call_begins() {
        let schema = json!({"type": "object"});
        let tools = [("a", &schema)];
        let lark = |format, parallel, control| match auto(format, &tools, parallel, control) {
            Grammar::Lark { grammar } => grammar,
            other => panic!("{other:?}"),
        };
        let hermes = lark(ToolCallFormat::Hermes, true, None);
        assert!(hermes.starts_with("start: (pre call)* text\n"), "{hermes}");
        assert!(hermes.contains("pre[suffix=\"<tool_call>\"]"), "{hermes}");
        assert!(lark(ToolCallFormat::Hermes, false, None).starts_with("start: (pre call)? text"));
        let mistral = lark(ToolCallFormat::Mistral, true, Some(7));
        assert!(
            mistral.starts_with("start: text | text <[7]> \"[\" call (\",\" call)* \"]\"\n"),
            "{mistral}"
        );
        let by_text = lark(ToolCallFormat::Mistral, false, None);
        assert!(
            by_text.contains("pre[suffix=\"[TOOL_CALLS]\"]"),
            "{by_text}"
        );
        let llama = lark(ToolCallFormat::Llama3Json, true, None);
        assert!(llama.starts_with("start: call | text\n"), "{llama}");
        assert!(llama.contains("\"whitespace_flexible\":true"), "{llama}");
    }
}
