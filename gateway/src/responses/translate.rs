//! Translating a Responses request into what the chat pipeline and the response object need:
//! function tools as chat tools, `tool_choice` and `text.format` in chat form, the settings the
//! response object echoes, and the refusals of what the gateway does not do.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::openai::chat::{FunctionDefinition, JsonSchemaFormat, ResponseFormat, Tool};
use crate::openai::responses::{ResponseObject, ResponsesRequest};

/// Function tools as chat tools; other tool types are refused.
pub fn chat_tools(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("tool type '{kind}' is not supported; only function tools are"),
                ));
            }
            // The flat Responses form, or the nested chat form.
            let function = tool.get("function").unwrap_or(tool);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::MissingParam(format!("{at}.name")))?;
            Ok(Tool {
                kind: "function".into(),
                function: FunctionDefinition {
                    name: name.to_string(),
                    description: function
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    parameters: function.get("parameters").cloned(),
                    strict: function.get("strict").and_then(Value::as_bool),
                },
            })
        })
        .collect()
}

/// `tool_choice` in chat form: strings pass; `{type: function, name}` becomes the chat object.
pub fn chat_tool_choice(choice: Option<&Value>) -> Option<Value> {
    match choice {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Some(
                json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}}),
            )
        }
        other => other.cloned(),
    }
}

/// `text.format` as a chat `response_format`.
pub fn chat_format(text: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => Ok(Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: format
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                schema: format.get("schema").cloned(),
                strict: format.get("strict").and_then(Value::as_bool),
            },
        })),
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("'{other}' is not a format; expected text, json_object or json_schema"),
        )),
    }
}

/// Response `id` to `req`, in progress and with no output yet: the request's settings echoed
/// with OpenAI's defaults, every other key empty.
pub fn in_progress(
    req: &ResponsesRequest,
    id: &str,
    created_at: u64,
    tools: &[Tool],
    store: bool,
    top_logprobs: u32,
) -> ResponseObject {
    ResponseObject {
        id: id.to_string(),
        object: "response".into(),
        created_at,
        status: "in_progress".into(),
        completed_at: None,
        error: None,
        incomplete_details: None,
        max_tool_calls: None,
        model: req.model.clone(),
        output: Vec::new(),
        output_text: String::new(),
        prompt_cache_key: None,
        safety_identifier: None,
        service_tier: "default".into(),
        usage: None,
        background: req.background.unwrap_or(false),
        instructions: req.instructions.clone(),
        max_output_tokens: req
            .max_output_tokens
            .as_ref()
            .and_then(serde_json::Number::as_u64),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: json!({
            "effort": req.reasoning.as_ref().and_then(|r| r.get("effort")).cloned().unwrap_or(Value::Null),
            "summary": req.reasoning.as_ref().and_then(|r| r.get("summary")).cloned().unwrap_or(Value::Null),
        }),
        store,
        temperature: req.temperature.unwrap_or(1.0),
        text: req
            .text
            .clone()
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools: tools
            .iter()
            .map(|t| {
                let f = &t.function;
                json!({"type": "function", "name": f.name, "description": f.description,
                       "parameters": f.parameters, "strict": f.strict})
            })
            .collect(),
        top_logprobs,
        top_p: req.top_p.unwrap_or(1.0),
        truncation: req.truncation.clone().unwrap_or_else(|| "disabled".into()),
        user: req.user.clone(),
        metadata: req.metadata.clone().unwrap_or_default(),
    }
}

/// Checks what the gateway does not do (yet) and the shapes of the echoed settings.
pub fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) && req.store == Some(false) {
        return Err(ApiError::invalid(
            "store",
            "background responses must be stored",
        ));
    }
    if let Some(t) = &req.truncation
        && t != "disabled"
        && t != "auto"
    {
        return Err(ApiError::invalid(
            "truncation",
            format!("'{t}' is not a truncation mode; expected disabled or auto"),
        ));
    }
    if let Some(metadata) = &req.metadata {
        if metadata.len() > 16 {
            return Err(ApiError::invalid(
                "metadata",
                "'metadata' holds at most 16 pairs",
            ));
        }
        if let Some((key, _)) = metadata.iter().find(|(_, v)| !v.is_string()) {
            return Err(ApiError::invalid(
                format!("metadata.{key}"),
                "metadata values must be strings",
            ));
        }
    }
    Ok(())
}
