//! `POST /v1/responses` and the stored-response endpoints (`GET` and `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`).
//!
//! A Responses request is translated into a chat request (its conversation as chat messages,
//! its settings as chat parameters) and then runs exactly as chat does: one validation, one
//! admission under the tenant's limits, one generation stream. Only the rendering differs.

use std::collections::HashMap;
use std::sync::Arc;
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
use crate::openai::chat::ChatCompletionRequest;
use crate::openai::responses::{InputItemList, ResponseObject, ResponseUsage, ResponsesRequest};
use crate::pipeline::run::{self, Job};
use crate::pipeline::{fold, prompt};
use crate::responses::render::{self, EventRenderer, OnDone};
use crate::responses::stored::{StoredResponse, not_found};
use crate::responses::translate::{
    chat_format, chat_tool_choice, chat_tools, in_progress, refuse_unsupported,
};
use crate::responses::{ResponseStore, input};
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
async fn conversation(
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
    let messages =
        prompt::template_messages(&input::to_messages(req.instructions.as_deref(), &items))?;
    let tools = match req.tools.as_deref().map(chat_tools).transpose()? {
        Some(tools) if !tools.is_empty() => Some(prompt::template_tools(&tools)?),
        _ => None,
    };
    let ids = prompt::chat_prompt(
        &model,
        &messages,
        tools.as_ref(),
        req.chat_template_kwargs.as_ref(),
    )?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": ids.len()})).into_response())
}

/// Validates `req`, finds the conversation it continues (in `last`, a WebSocket connection's
/// previous response, else in the store), and admits it as a chat generation.
pub(super) async fn begin(
    state: &AppState,
    caller: &Caller,
    req: &ResponsesRequest,
    started: Instant,
    last: Option<&StoredResponse>,
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
    } = prepare(state, caller, &chat, &id, started).await?;
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
    let started = Instant::now();
    let turn = begin(&state, &caller, &req, started, None).await?;
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
    }
    let prompt_tokens: usize = turn.job.prompts.iter().map(Vec::len).sum();
    let stream = run::start(turn.job).inspect_err(|e| record.failed(e))?;
    if req.background == Some(true) {
        // Usage so far: the prompt is known, nothing is generated yet.
        let base = ResponseObject {
            usage: Some(ResponseUsage::new(prompt_tokens as u64, 0, 0, 0)),
            ..turn.base
        };
        return in_background(&state, turn.tenant, base, turn.items, stream, record).await;
    }
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
        Delivered::Streamed(response) => return Ok(response),
        Delivered::Folded { folded, record, .. } => (folded, record),
    };
    let (output, finished) = render::folded_output(&folded, render::wants_summary(&turn.base));
    let t = folded.totals;
    let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning);
    let response = render::finish(turn.base, output, finished, usage, unix_now());
    if turn.keep {
        let stored = StoredResponse {
            response: response.clone(),
            input_items: turn.items,
        };
        state.responses.save(&turn.tenant, &stored).await?;
    }
    Ok(with_request_id(Json(response).into_response(), &record.id))
}

/// Stores the response `in_progress`, answers with it, and runs the generation on a task that
/// stores the result (completed, incomplete or failed).
async fn in_background(
    state: &AppState,
    tenant: String,
    base: ResponseObject,
    items: Vec<Value>,
    stream: run::GenStream,
    record: RequestRecord,
) -> Result<Response, ApiError> {
    let stored = StoredResponse {
        response: base.clone(),
        input_items: items,
    };
    state.responses.save(&tenant, &stored).await?;
    let id = base.id.clone();
    let (responses, running) = (state.responses.clone(), Arc::clone(&state.background));
    let task_tenant = tenant.clone();
    let limit = state.server.request_timeout;
    let task = tokio::spawn(async move {
        let work = tokio::time::timeout(limit, fold::fold(stream, 1));
        // A cancel on another replica (shared Redis state) marks the stored response; watch for
        // it, and stop (dropping the stream cancels the engine's work).
        let cancelled = watch_for_cancel(&responses, &task_tenant, &stored.response.id);
        let folded = tokio::select! {
            folded = work => folded.unwrap_or(Err(ApiError::Timeout(limit))),
            () = cancelled => {
                // Dropping the record unsettled logs it as abandoned by the client.
                drop(record);
                running.remove(&task_tenant, &stored.response.id);
                return;
            }
        };
        let StoredResponse {
            response,
            input_items,
        } = stored;
        let response = match folded {
            Ok(folded) => {
                record.ended(folded.totals.prompt, folded.totals.completion);
                let (output, finished) =
                    render::folded_output(&folded, render::wants_summary(&response));
                let t = folded.totals;
                let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning);
                render::finish(response, output, finished, usage, unix_now())
            }
            Err(e) => {
                e.log();
                record.failed(&e);
                let detail = e.detail();
                ResponseObject {
                    status: "failed".into(),
                    error: Some(
                        json!({"code": detail.code.unwrap_or("server_error"), "message": detail.message}),
                    ),
                    ..response
                }
            }
        };
        let done = StoredResponse {
            response,
            input_items,
        };
        // A cancel that landed while the result was being made wins.
        let cancelled = matches!(
            responses.load(&task_tenant, &done.response.id).await,
            Ok(Some(now)) if now.response.status == "cancelled"
        );
        if !cancelled && let Err(e) = responses.save(&task_tenant, &done).await {
            e.log();
        }
        running.remove(&task_tenant, &done.response.id);
    });
    state.background.insert(&tenant, &id, task.abort_handle());
    Ok(with_request_id(Json(base).into_response(), &id))
}

/// How often a background response checks whether it was cancelled elsewhere.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Resolves once `tenant`'s stored response `id` is marked cancelled (by any replica).
async fn watch_for_cancel(responses: &ResponseStore, tenant: &str, id: &str) {
    loop {
        tokio::time::sleep(CANCEL_POLL).await;
        if let Ok(Some(now)) = responses.load(tenant, id).await
            && now.response.status == "cancelled"
        {
            return;
        }
    }
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
/// running and stores it `cancelled`; a finished one is returned as it is.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    let mut stored = stored_or_404(&state, tenant, &id).await?;
    if !stored.response.background {
        return Err(ApiError::invalid(
            "response_id",
            "only background responses can be cancelled",
        ));
    }
    if matches!(stored.response.status.as_str(), "queued" | "in_progress") {
        if let Some(task) = state.background.remove(tenant, &id) {
            // Dropping the task's stream cancels the engine's work.
            task.abort();
        }
        stored.response.status = "cancelled".into();
        state.responses.save(tenant, &stored).await?;
    }
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

/// Handles `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    let stored = stored_or_404(&state, tenant, &id).await?;
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
