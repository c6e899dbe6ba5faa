//! `POST /v1/responses` and the stored-response endpoints (`GET` and `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`).
//!
//! A Responses request is translated into a chat request (its conversation as chat messages,
//! its settings as chat parameters) and then runs exactly as chat does: one validation, one
//! admission under the tenant's limits, one generation stream. Only the rendering differs.

use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::FutureExt;
use serde_json::{Value, json};

use super::chat::{Prepared, prepare};
use super::deliver::{Delivered, deliver};
use super::extract::JsonBody;
use super::{AppState, new_id, unix_now, with_request_id};
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::chat::{
    ChatCompletionRequest, FunctionDefinition, JsonSchemaFormat, ResponseFormat, Tool,
};
use crate::openai::responses::{InputItemList, ResponseUsage, ResponsesRequest};
use crate::pipeline::run;
use crate::responses::render::{self, Echo, EventRenderer, OnDone};
use crate::responses::stored::{StoredResponse, not_found};
use crate::responses::{ResponseStore, input};
use crate::tenancy::Caller;

/// Function tools as chat tools; other tool types are refused.
fn chat_tools(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
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
fn chat_tool_choice(choice: Option<&Value>) -> Option<Value> {
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
fn chat_format(text: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
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

/// The settings the response object echoes, with OpenAI's defaults.
fn echo(req: &ResponsesRequest, tools: &[Tool], store: bool, top_logprobs: u32) -> Echo {
    Echo {
        background: false,
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
fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::unsupported(
            "background",
            "background responses are not supported yet; leave 'background' false",
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

/// Handles `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    refuse_unsupported(&req)?;
    let tenant = caller.principal.tenant.name.clone();
    let keep = req.store.unwrap_or(true);
    let mut items = Vec::new();
    if let Some(previous) = &req.previous_response_id {
        let stored = state
            .responses
            .load(&tenant, previous)
            .await?
            .ok_or_else(|| not_found(previous, Some("previous_response_id")))?;
        items = stored.input_items;
        items.extend(stored.response.output.iter().map(input::from_output));
    }
    items.extend(input::normalise(&req.input)?);
    let wants_logprobs = req
        .include
        .iter()
        .flatten()
        .any(|i| i == "message.output_text.logprobs");
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let chat = ChatCompletionRequest {
        model: req.model.clone(),
        messages: input::to_messages(req.instructions.as_deref(), &items),
        stream: req.stream,
        stream_options: None,
        max_tokens: None,
        max_completion_tokens: req.max_output_tokens.clone(),
        temperature: req.temperature,
        top_p: req.top_p,
        n: None,
        seed: req.seed.clone(),
        stop: req.stop.clone(),
        logprobs: Some(wants_logprobs),
        top_logprobs: req.top_logprobs.clone().filter(|_| wants_logprobs),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        logit_bias: None,
        user: req.user.clone(),
        metadata: req.metadata.clone().map(Value::Object),
        tools: tools.clone(),
        tool_choice: chat_tool_choice(req.tool_choice.as_ref()),
        parallel_tool_calls: req.parallel_tool_calls,
        response_format: chat_format(req.text.as_ref())?,
        chat_template_kwargs: req.chat_template_kwargs.clone(),
        extensions: req.extensions.clone(),
        nvext: req.nvext.clone(),
    };
    let id = new_id("resp_");
    let Prepared {
        job,
        model,
        logprobs,
        ..
    } = prepare(&state, &caller, &chat, &id, started).await?;
    let base = render::in_progress(
        &id,
        unix_now(),
        &req.model,
        &echo(
            &req,
            tools.as_deref().unwrap_or_default(),
            keep,
            logprobs.unwrap_or(0),
        ),
    );
    let record = RequestRecord::new(
        id.clone(),
        "responses",
        model.id.clone(),
        req.user.clone(),
        req.stream.unwrap_or(false),
        started,
    );
    let stream = run::start(job).inspect_err(|e| record.failed(e))?;
    let on_done: Option<OnDone> = keep.then(|| {
        let (responses, tenant, input_items) =
            (state.responses.clone(), tenant.clone(), items.clone());
        Box::new(move |response| {
            save_soon(
                responses,
                tenant,
                StoredResponse {
                    response,
                    input_items,
                },
            )
        }) as OnDone
    });
    let renderer = EventRenderer::new(base.clone(), on_done);
    let (folded, record) = match deliver(stream, record, &state.server, 1, renderer).await? {
        Delivered::Streamed(response) => return Ok(response),
        Delivered::Folded { folded, record, .. } => (folded, record),
    };
    let (output, finished) = render::folded_output(&folded);
    let t = folded.totals;
    let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, 0);
    let response = render::finish(base, output, finished, usage, unix_now());
    if keep {
        let stored = StoredResponse {
            response: response.clone(),
            input_items: items,
        };
        state.responses.save(&tenant, &stored).await?;
    }
    Ok(with_request_id(Json(response).into_response(), &record.id))
}

/// Stores a streamed response as its last event is sent: at once when the store answers at
/// once (memory), else on a task (Redis), logging a failure.
fn save_soon(responses: ResponseStore, tenant: String, stored: StoredResponse) {
    let mut save = Box::pin(async move {
        if let Err(e) = responses.save(&tenant, &stored).await {
            e.log();
        }
    });
    if (&mut save).now_or_never().is_none() {
        tokio::spawn(save);
    }
}

/// Handles `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    let stored = state
        .responses
        .load(tenant, &id)
        .await?
        .ok_or_else(|| not_found(&id, None))?;
    Ok(Json(stored.response).into_response())
}

/// Handles `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    if !state.responses.delete(tenant, &id).await? {
        return Err(not_found(&id, None));
    }
    Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
}

/// Handles `GET /v1/responses/{id}/input_items` (`limit` 1..=100, default 20; `order` `desc`
/// (default) or `asc`; `after` an item id).
pub async fn input_items(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = match query.get("limit") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| {
                ApiError::invalid("limit", "'limit' must be an integer from 1 to 100")
            })?,
        None => 20,
    };
    let ascending = match query.get("order").map(String::as_str) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "order",
                format!("'{other}' is not an order; expected asc or desc"),
            ));
        }
    };
    let tenant = &caller.principal.tenant.name;
    let stored = state
        .responses
        .load(tenant, &id)
        .await?
        .ok_or_else(|| not_found(&id, None))?;
    let mut items = stored.input_items;
    if !ascending {
        items.reverse();
    }
    if let Some(after) = query.get("after") {
        let at = items
            .iter()
            .position(|item| item.get("id").and_then(Value::as_str) == Some(after))
            .ok_or_else(|| {
                ApiError::invalid(
                    "after",
                    format!("no input item '{after}' in response '{id}'"),
                )
            })?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let id_of = |item: Option<&Value>| {
        item.and_then(|i| i.get("id"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let list = InputItemList {
        object: "list",
        first_id: id_of(items.first()),
        last_id: id_of(items.last()),
        has_more,
        data: items,
    };
    Ok(Json(list).into_response())
}
