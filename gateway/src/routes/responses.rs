//! `POST /v1/responses` and the stored-response endpoints (`GET` and `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`).
//!
//! A Responses request is translated into a chat request (its conversation as chat messages,
//! its settings as chat parameters) and then runs exactly as chat does: one validation, one
//! admission under the tenant's limits, one generation stream. Only the rendering differs.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::FutureExt;
use serde_json::{Value, json};

use super::background;
use super::chat::{Prepared, prepare};
use super::deliver::{Delivered, deliver};
use super::extract::JsonBody;
use super::{AppState, new_id, unix_now, with_request_id};
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::chat::{ChatCompletionRequest, Tool};
use crate::openai::responses::{InputItemList, ResponseObject, ResponseUsage, ResponsesRequest};
use crate::pipeline::prompt;
use crate::pipeline::run::{self, Job};
use crate::responses::render::{self, EventRenderer, OnDone};
use crate::responses::stored::{StoredResponse, not_found};
use crate::responses::translate::{
    chat_format, chat_tool_choice, chat_tools, in_progress, refuse_unsupported,
};
use crate::responses::{ResponseStore, input, truncate};
use crate::tenancy::Caller;

/// A Responses request validated, translated and admitted: ready to run.
pub(super) struct Turn {
    /// `resp_...`.
    pub id: String,
    /// The response object before any output.
    pub base: ResponseObject,
    /// What to run.
    pub job: Job,
    /// The served model's id.
    pub model_id: String,
    /// Whether to store the response.
    pub keep: bool,
    /// The caller's tenant (stored responses are kept per tenant).
    pub tenant: String,
    /// The conversation so far: earlier turns' items, then this turn's input.
    pub items: Vec<Value>,
}

/// The conversation `req` makes: the items of the response it continues (the connection's
/// `last` one, else the stored one), then its own input.
pub(super) async fn conversation(
    state: &AppState,
    tenant: &str,
    req: &ResponsesRequest,
    last: Option<&StoredResponse>,
) -> Result<Vec<Value>, ApiError> {
    let mut items = Vec::new();
    if let Some(previous) = &req.previous_response_id {
        let stored = match last.filter(|l| &l.response.id == previous) {
            Some(cached) => cached.clone(),
            None => state
                .responses
                .load(tenant, previous)
                .await?
                .ok_or_else(|| not_found(previous, Some("previous_response_id")))?,
        };
        items = stored.input_items;
        items.extend(stored.response.output.iter().map(input::from_output));
    }
    let this_turn = req
        .input
        .as_ref()
        .ok_or_else(|| ApiError::MissingParam("input".into()))?;
    items.extend(input::normalise(this_turn)?);
    Ok(items)
}

/// Handles `POST /v1/responses/input_tokens`: the prompt tokens a request would use, counted
/// with the model's own template and tokenizer, without running it.
pub async fn input_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let model = state.model(&req.model)?;
    state.tenancy.check_model(&caller, &model, &req.model)?;
    let items = conversation(&state, &caller.principal.tenant.name, &req, None).await?;
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let count = prompt_length(&model, &req, tools.as_deref().unwrap_or_default(), &items)?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": count})).into_response())
}

/// The prompt tokens `items` make for `req` on `model`, counted with the model's own template
/// and tokenizer.
fn prompt_length(
    model: &ServedModel,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &[Value],
) -> Result<usize, ApiError> {
    let messages =
        prompt::template_messages(&input::to_messages(req.instructions.as_deref(), items))?;
    let tools = match tools {
        [] => None,
        tools => Some(prompt::template_tools(tools)?),
    };
    let ids = prompt::chat_prompt(
        model,
        &messages,
        tools.as_ref(),
        req.chat_template_kwargs.as_ref(),
        model.context_length as usize,
    )?;
    Ok(ids.len())
}

/// The items of `items` the model is shown: all of them, or with `truncation: "auto"` those
/// [`fit`] keeps.
fn visible<'a>(
    state: &AppState,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &'a [Value],
) -> Result<Cow<'a, [Value]>, ApiError> {
    if req.truncation.as_deref() != Some("auto") {
        return Ok(Cow::Borrowed(items));
    }
    let model = state.model(&req.model)?;
    let reserve = output_reserve(state, &model, req);
    Ok(Cow::Owned(fit(
        state,
        &model,
        req,
        tools,
        items,
        &[],
        reserve,
    )))
}

/// The output tokens a truncated prompt leaves room for: the request's `max_output_tokens`,
/// else the default output budget (at most half the context).
pub(super) fn output_reserve(
    state: &AppState,
    model: &ServedModel,
    req: &ResponsesRequest,
) -> usize {
    let default = state
        .defaults
        .max_output_tokens
        .min(model.max_output_tokens)
        .min(model.context_length / 2);
    req.max_output_tokens
        .as_ref()
        .and_then(serde_json::Number::as_u64)
        .map_or(default as usize, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        })
}

/// `items` truncated (see [`truncate`]) so that their prompt, followed by `tail`, leaves
/// `reserve` tokens of the context for output; then `tail`. Leading system and developer
/// messages are kept, as instructions are; tools count when the model is shown them.
pub(super) fn fit(
    state: &AppState,
    model: &ServedModel,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &[Value],
    tail: &[Value],
    reserve: usize,
) -> Vec<Value> {
    let context = model.context_length as usize;
    let prompt_limit = (state.defaults.max_request_tokens as usize).min(context);
    let limit = prompt_limit
        .saturating_sub(1)
        .min(context.saturating_sub(reserve));
    let tools = match &req.tool_choice {
        Some(Value::String(choice)) if choice == "none" => &[],
        _ => tools,
    };
    let pinned = items
        .iter()
        .take_while(|i| matches!(i["role"].as_str(), Some("system" | "developer")))
        .count();
    let (head, rest) = items.split_at(pinned);
    let first = truncate::first_kept(rest, limit, |kept| {
        prompt_length(model, req, tools, &[head, kept, tail].concat())
    });
    [head, &rest[first..], tail].concat()
}

/// Validates `req`, finds the conversation it continues (in `last`, a WebSocket connection's
/// previous response, else in the store), and admits it as a chat generation.
pub(super) async fn begin(
    state: &AppState,
    caller: &Caller,
    req: &ResponsesRequest,
    started: Instant,
    last: Option<&StoredResponse>,
    wait: bool,
) -> Result<Turn, ApiError> {
    refuse_unsupported(req)?;
    let tenant = caller.principal.tenant.name.clone();
    let keep = req.store.unwrap_or(true);
    let items = conversation(state, &tenant, req, last).await?;
    let wants_logprobs = req
        .include
        .iter()
        .flatten()
        .any(|i| i == "message.output_text.logprobs");
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let shown = visible(state, req, tools.as_deref().unwrap_or_default(), &items)?;
    let chat = ChatCompletionRequest {
        model: req.model.clone(),
        messages: input::to_messages(req.instructions.as_deref(), &shown),
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
        reasoning_effort: req
            .reasoning
            .as_ref()
            .and_then(|r| r.get("effort"))
            .and_then(Value::as_str)
            .map(str::to_string),
        extensions: req.extensions.clone(),
        nvext: req.nvext.clone(),
    };
    let id = new_id("resp_");
    let Prepared {
        job,
        model,
        logprobs,
        ..
    } = prepare(state, caller, &chat, &id, started, wait).await?;
    let base = in_progress(
        req,
        &id,
        unix_now(),
        tools.as_deref().unwrap_or_default(),
        keep,
        logprobs.unwrap_or(0),
    );
    Ok(Turn {
        id,
        base,
        job,
        model_id: model.id.clone(),
        keep,
        tenant,
        items,
    })
}

/// Handles `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let (response, _) = respond(&state, &caller, &req, Instant::now(), None).await?;
    Ok(response)
}

/// Runs `req` and answers as `POST /v1/responses` does (a response object, a stream, or a
/// background response), with the conversation it ran. `last` is a WebSocket connection's
/// previous response.
pub(super) async fn respond(
    state: &AppState,
    caller: &Caller,
    req: &ResponsesRequest,
    started: Instant,
    last: Option<&StoredResponse>,
) -> Result<(Response, Vec<Value>), ApiError> {
    let turn = begin(
        state,
        caller,
        req,
        started,
        last,
        req.background != Some(true),
    )
    .await?;
    let record = RequestRecord::new(
        turn.id.clone(),
        "responses",
        turn.model_id.clone(),
        req.user.clone(),
        req.stream.unwrap_or(false),
        started,
    );
    if req.background == Some(true) {
        state.background.check_room()?;
        let items = turn.items.clone();
        let streamed = req.stream == Some(true);
        let response = background::start(state, turn, record, streamed).await?;
        return Ok((response, items));
    }
    let stream = run::start(turn.job).inspect_err(|e| record.failed(e))?;
    let on_done: Option<OnDone> = turn.keep.then(|| {
        let (responses, tenant, input_items) = (
            state.responses.clone(),
            turn.tenant.clone(),
            turn.items.clone(),
        );
        Box::new(move |response| {
            save_soon(
                responses,
                tenant,
                StoredResponse {
                    response,
                    input_items,
                },
            );
        }) as OnDone
    });
    let renderer = EventRenderer::new(turn.base.clone(), on_done);
    let (folded, record) = match deliver(stream, record, &state.server, 1, renderer).await? {
        Delivered::Streamed(response) => return Ok((response, turn.items)),
        Delivered::Folded { folded, record, .. } => (folded, record),
    };
    let (output, finished) = render::folded_output(&folded, render::wants_summary(&turn.base));
    let t = folded.totals;
    let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning);
    let response = render::finish(turn.base, output, finished, usage, unix_now());
    if turn.keep {
        let stored = StoredResponse {
            response: response.clone(),
            input_items: turn.items.clone(),
        };
        state.responses.save(&turn.tenant, &stored).await?;
    }
    let body = with_request_id(Json(response).into_response(), &record.id);
    Ok((body, turn.items))
}

/// `tenant`'s stored response `id`, or 404 `response_not_found`.
async fn stored_or_404(
    state: &AppState,
    tenant: &str,
    id: &str,
) -> Result<StoredResponse, ApiError> {
    state
        .responses
        .load(tenant, id)
        .await?
        .ok_or_else(|| not_found(id, None))
}

/// Handles `POST /v1/responses/{id}/cancel`: stops a background response that is still
/// queued or running and stores it `cancelled`; a finished one is returned as it is.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    let stored = stored_or_404(&state, tenant, &id).await?;
    if !stored.response.background {
        return Err(ApiError::invalid(
            "response_id",
            "only background responses can be cancelled",
        ));
    }
    let stored = background::cancel(&state, tenant, stored).await?;
    Ok(Json(stored.response).into_response())
}

/// Stores a streamed response as its last event is sent: at once when the store answers at
/// once (memory), else on a task (Redis), logging a failure.
pub(super) fn save_soon(responses: ResponseStore, tenant: String, stored: StoredResponse) {
    let mut save = Box::pin(async move {
        if let Err(e) = responses.save(&tenant, &stored).await {
            e.log();
        }
    });
    if (&mut save).now_or_never().is_none() {
        tokio::spawn(save);
    }
}

/// Handles `GET /v1/responses/{id}`: the response, or with `stream=true` the event stream of
/// a streamed background response (after `starting_after`, when given).
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    let stored = stored_or_404(&state, tenant, &id).await?;
    let stream = match query.get("stream").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "stream",
                format!("'stream' must be true or false, not '{other}'"),
            ));
        }
    };
    let starting_after = match query.get("starting_after") {
        None => None,
        Some(n) => Some(n.parse::<u64>().map_err(|_| {
            ApiError::invalid(
                "starting_after",
                "'starting_after' must be a sequence number (an integer from 0)",
            )
        })?),
    };
    if stream {
        return background::resume(&state, tenant, &stored, starting_after).await;
    }
    Ok(Json(stored.response).into_response())
}

/// Handles `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    background::stop(&state, tenant, &id);
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
    let stored = stored_or_404(&state, tenant, &id).await?;
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
