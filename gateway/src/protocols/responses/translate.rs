//! Translating a Responses request into the facade's generation request (under the Responses
//! API's own parameter names) and what the response object needs: function tools,
//! `tool_choice` and `text.format`, the settings the
//! response object echoes, and the refusals of what the gateway does not do.

use serde_json::{Value, json};

use super::conversation;
use crate::error::ApiError;
use crate::generation::{
    GenerationRequest, HostedServer, MAX_TOP_LOGPROBS, OutputFormat, ParamNames, Prompt, Sampling,
};
use crate::openai::chat::{FunctionDefinition, Tool};
use crate::openai::responses::{ResponseObject, ResponsesRequest};
use crate::protocols::numbers::{self, count};
use crate::protocols::{messages, wire_sampling};

/// The `mcp` tools of a request: servers the gateway runs tools of, named by their label (the
/// gateway calls only servers its operator configured, never a `server_url` a client gives).
pub(crate) fn hosted_servers(tools: &[Value]) -> Result<Option<Vec<HostedServer>>, ApiError> {
    let mut servers = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("mcp") {
            continue;
        }
        let at = format!("tools[{i}]");
        let label = tool
            .get("server_label")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::MissingParam(format!("{at}.server_label")))?;
        match tool.get("require_approval") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "never" => {}
            Some(_) => {
                return Err(ApiError::unsupported(
                    format!("{at}.require_approval"),
                    "this gateway runs its MCP tools without approvals; set require_approval to \"never\"",
                ));
            }
        }
        let allowed =
            match tool.get("allowed_tools") {
                None | Some(Value::Null) => None,
                Some(Value::Array(names)) => Some(
                    names
                        .iter()
                        .map(|n| n.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| {
                            ApiError::invalid(format!("{at}.allowed_tools"), "a list of tool names")
                        })?,
                ),
                Some(Value::Object(filter)) => filter
                    .get("tool_names")
                    .and_then(Value::as_array)
                    .map(|names| {
                        names
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    }),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.allowed_tools"),
                        "a list of tool names",
                    ));
                }
            };
        servers.push(HostedServer {
            label: label.to_string(),
            allowed,
            param: at,
        });
    }
    Ok((!servers.is_empty()).then_some(servers))
}

/// Function tools as chat tools (`mcp` tools are the gateway's own, see [`hosted_servers`]);
/// other tool types are refused.
pub(crate) fn chat_tools(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .filter(|(_, tool)| tool.get("type").and_then(Value::as_str) != Some("mcp"))
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("tool type '{kind}' is not supported; only function and mcp tools are"),
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

/// `text.format` as the output format.
pub(crate) fn output_format(text: Option<&Value>) -> Result<OutputFormat, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")) else {
        return Ok(OutputFormat::Text);
    };
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(OutputFormat::Text),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => Ok(OutputFormat::JsonSchema(
            format.get("schema").cloned().unwrap_or_else(|| json!({})),
        )),
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("'{other}' is not a format; expected text, json_object or json_schema"),
        )),
    }
}

/// The Responses API's names for the parameters errors point at.
pub(crate) const NAMES: ParamNames = ParamNames {
    prompt: "input",
    max_tokens: "max_output_tokens",
    top_logprobs: "top_logprobs",
    output: "text.format",
    schema: "text.format.schema",
    tool_choice: "tool_choice",
    reasoning_effort: "reasoning.effort",
};

/// The conversation `items` of `req` (its instructions first) and the `tools` offered, in the
/// chat template's shape.
pub(crate) fn prompt(
    req: &ResponsesRequest,
    items: &[Value],
    tools: &[Tool],
) -> Result<Prompt, ApiError> {
    let messages = conversation::template_messages(req.instructions.as_deref(), items)?;
    let tools = match tools {
        [] => None,
        tools => Some(messages::template_tools(tools)?),
    };
    Ok(Prompt::Chat {
        messages,
        tools,
        template_kwargs: req.chat_template_kwargs.clone(),
    })
}

/// `req` as the facade's generation request: the conversation `shown` (with the instructions
/// first) for the chat template, `tools` offered, and the settings under the Responses API's
/// own names.
pub(crate) fn generation_request(
    req: &ResponsesRequest,
    shown: &[Value],
    tools: &[Tool],
) -> Result<GenerationRequest, ApiError> {
    let wants_logprobs = req
        .include
        .iter()
        .flatten()
        .any(|i| i == "message.output_text.logprobs");
    let beams =
        req.extensions.best_of.is_some() || req.nvext.as_ref().is_some_and(|e| e.best_of.is_some());
    if beams {
        // A response has one output: there is nothing to return the other beams in.
        return Err(ApiError::unsupported(
            "best_of",
            "beam search ('best_of') is offered by chat and legacy completions",
        ));
    }
    let extensions = wire_sampling::extensions(&req.extensions, req.nvext.as_ref())?;
    Ok(GenerationRequest {
        model: req.model.clone(),
        prompt: prompt(req, shown, tools)?,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            n: None,
            seed: numbers::seed(req.seed.as_ref())?,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            stop: wire_sampling::stops(req.stop.as_ref()),
            logit_bias: None,
            best_of: None,
            extensions,
        },
        max_tokens: count(
            "max_output_tokens",
            req.max_output_tokens.as_ref(),
            1,
            u32::MAX,
        )?,
        default_max_tokens: None,
        logprobs: wants_logprobs,
        top_logprobs: count(
            "top_logprobs",
            req.top_logprobs.as_ref().filter(|_| wants_logprobs),
            0,
            MAX_TOP_LOGPROBS,
        )?,
        tools: messages::tools(
            tools,
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            true,
        ),
        output: output_format(req.text.as_ref())?,
        reasoning_effort: req
            .reasoning
            .as_ref()
            .and_then(|r| r.get("effort"))
            .and_then(Value::as_str)
            .map(str::to_string),
        metadata: req.metadata.clone().map(Value::Object),
        names: NAMES,
    })
}

/// Response `id` to `req`, in progress and with no output yet: the request's settings echoed
/// with OpenAI's defaults, every other key empty.
pub(crate) fn in_progress(
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
pub(crate) fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
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
