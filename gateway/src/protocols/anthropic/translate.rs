//! An Anthropic Messages request as the facade's generation request: the system prompt and the
//! messages in the chat template's shape (text blocks joined, `tool_use` blocks as the
//! assistant's tool calls, `tool_result` blocks as tool messages), tools and `tool_choice`,
//! sampling, stop sequences. Blocks a text model cannot take (images, documents) are refused
//! with a 400 naming the block.

use serde_json::{Value, json};

use crate::anthropic::MessagesRequest;
use crate::error::ApiError;
use crate::generation::{
    GenerationRequest, OutputFormat, ParamNames, Prompt, Sampling, ToolChoice, Tools,
};
use crate::generation::{SamplingExtensions, template_tool};
use crate::protocols::numbers;
use crate::protocols::wire_sampling::top_k_param;

/// Anthropic's names for the parameters errors point at.
pub(crate) const NAMES: ParamNames = ParamNames {
    prompt: "messages",
    max_tokens: "max_tokens",
    top_logprobs: "top_k",
    output: "output_format",
    schema: "output_format.schema",
    tool_choice: "tool_choice",
    reasoning_effort: "thinking",
};

/// The text of a block list (or a string), refusing any block but text.
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::new();
            for (k, block) in blocks.iter().enumerate() {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(
                        block
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| ApiError::MissingParam(format!("{at}[{k}].text")))?,
                    ),
                    other => return Err(refused(&format!("{at}[{k}]"), other)),
                }
            }
            Ok(texts.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid(
            at,
            "expected a string or a list of content blocks",
        )),
    }
}

fn refused(at: &str, kind: Option<&str>) -> ApiError {
    let kind = kind.unwrap_or("(none)");
    ApiError::unsupported(
        format!("{at}.type"),
        format!("`{kind}` blocks are not supported here: this model takes text only"),
    )
}

/// The conversation in the template's shape.
fn template_messages(req: &MessagesRequest) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        out.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, message) in req.messages.iter().enumerate() {
        let at = format!("messages[{i}].content");
        let role = message.role.as_str();
        if !matches!(role, "user" | "assistant") {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "`{role}` is not a role: use `user` or `assistant` (and `system` at the top level)"
                ),
            ));
        }
        let blocks = match &message.content {
            Value::String(text) => {
                out.push(json!({"role": role, "content": text}));
                continue;
            }
            Value::Array(blocks) => blocks,
            _ => {
                return Err(ApiError::invalid(
                    at,
                    "expected a string or a list of content blocks",
                ));
            }
        };
        let (mut texts, mut calls, mut results) = (Vec::new(), Vec::new(), Vec::new());
        for (j, block) in blocks.iter().enumerate() {
            let place = format!("{at}[{j}]");
            let field = |key: &str| {
                block
                    .get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::MissingParam(format!("{place}.{key}")))
            };
            match block.get("type").and_then(Value::as_str) {
                Some("text") => texts.push(field("text")?.to_string()),
                Some("tool_use") if role == "assistant" => calls.push(json!({
                    "id": field("id")?,
                    "type": "function",
                    "function": {"name": field("name")?, "arguments": block.get("input").cloned().unwrap_or(json!({}))},
                })),
                Some("tool_result") if role == "user" => {
                    let mut text = text_of(block.get("content").unwrap_or(&Value::Null), &format!("{place}.content"))?;
                    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                        text = format!("error: {text}");
                    }
                    results.push(json!({"role": "tool", "tool_call_id": field("tool_use_id")?, "content": text}));
                }
                // Earlier reasoning is not shown to the model again.
                Some("thinking" | "redacted_thinking") => {}
                other => return Err(refused(&place, other)),
            }
        }
        out.extend(results);
        if role == "assistant" {
            let mut m = json!({"role": "assistant", "content": texts.join("\n")});
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            out.push(m);
        } else if !texts.is_empty() {
            out.push(json!({"role": "user", "content": texts.join("\n")}));
        }
    }
    Ok(out)
}

/// The tools offered (custom tools only), in the template's and the pipeline's shapes.
fn tools(req: &MessagesRequest) -> Result<(Option<Value>, Tools), ApiError> {
    let offered = req.tools.as_deref().unwrap_or_default();
    let mut shown = Vec::new();
    let mut tools = Tools {
        parallel: true,
        ..Tools::default()
    };
    for (i, tool) in offered.iter().enumerate() {
        let at = format!("tools[{i}]");
        if let Some(kind) = tool
            .get("type")
            .and_then(Value::as_str)
            .filter(|k| *k != "custom")
        {
            return Err(ApiError::unsupported(
                format!("{at}.type"),
                format!(
                    "`{kind}` tools are not supported; only custom tools (name, description, input_schema) are"
                ),
            ));
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::MissingParam(format!("{at}.name")))?;
        let schema = tool
            .get("input_schema")
            .cloned()
            .ok_or_else(|| ApiError::MissingParam(format!("{at}.input_schema")))?;
        if !schema.is_object() {
            return Err(ApiError::InvalidSchema {
                param: format!("{at}.input_schema"),
                message: format!("the input_schema of tool `{name}` must be a JSON Schema object"),
            });
        }
        let description = tool.get("description").and_then(Value::as_str);
        shown.push(template_tool(
            name,
            description.unwrap_or_default(),
            &schema,
        ));
        tools.names.push(name.to_string());
        tools.schemas.push(schema);
        tools.strict.push(false);
    }
    if let Some(choice) = &req.tool_choice {
        tools.choice = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => ToolChoice::Named(
                choice
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::MissingParam("tool_choice.name".into()))?
                    .to_string(),
            ),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "use `auto`, `any`, `tool` or `none`",
                ));
            }
        };
        if choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool)
            == Some(true)
        {
            tools.parallel = false;
        }
    }
    let shown = (!shown.is_empty()).then_some(Value::Array(shown));
    Ok((shown, tools))
}

/// Whether `thinking` asks for the model's reasoning.
pub(crate) fn thinking(req: &MessagesRequest) -> Result<bool, ApiError> {
    match req
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        None | Some("disabled") => Ok(false),
        Some("enabled" | "adaptive") => Ok(true),
        Some(other) => Err(ApiError::invalid(
            "thinking.type",
            format!("`{other}` is not `enabled` or `disabled`"),
        )),
    }
}

/// `req` as the facade's generation request; `count` reads it for `count_tokens`, where
/// `max_tokens` is not needed.
pub(crate) fn generation_request(
    req: &MessagesRequest,
    count: bool,
) -> Result<GenerationRequest, ApiError> {
    if !count && req.max_tokens.is_none() {
        return Err(ApiError::MissingParam("max_tokens".into()));
    }
    if let Some(tier) = req
        .service_tier
        .as_deref()
        .filter(|t| !matches!(*t, "auto" | "standard_only"))
    {
        return Err(ApiError::invalid(
            "service_tier",
            format!("`{tier}` is not `auto` or `standard_only`"),
        ));
    }
    thinking(req)?;
    let (shown, tools) = tools(req)?;
    Ok(GenerationRequest {
        model: req.model.clone(),
        prompt: Prompt::Chat {
            messages: template_messages(req)?,
            tools: shown,
            template_kwargs: None,
        },
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            n: None,
            seed: None,
            presence_penalty: None,
            frequency_penalty: None,
            stop: req.stop_sequences.clone().unwrap_or_default(),
            logit_bias: None,
            best_of: None,
            extensions: SamplingExtensions {
                // Counting reads the prompt only: sampling and the budget are not checked.
                top_k: top_k_param(req.top_k.as_ref().filter(|_| !count))?,
                ..SamplingExtensions::default()
            },
        },
        max_tokens: numbers::count(
            "max_tokens",
            req.max_tokens.as_ref().filter(|_| !count),
            1,
            u32::MAX,
        )?,
        default_max_tokens: None,
        logprobs: false,
        top_logprobs: None,
        tools,
        output: OutputFormat::Text,
        reasoning_effort: None,
        metadata: None,
        names: NAMES,
    })
}
