//! The Responses API's requests: a turn (the conversation it continues, truncated when asked,
//! translated into the facade's generation request and admitted), answered whole, streamed, or
//! run in the background ([`super::runner`]); and the stored-response operations (retrieve,
//! delete, cancel, input items).

use std::borrow::Cow;
use std::collections::HashMap;

use futures_util::FutureExt;
use serde_json::{Value, json};

use super::render::{self, EventRenderer, OnDone};
use super::stored::{StoredResponse, not_found};
use super::translate::{NAMES, chat_tools, generation_request, in_progress, refuse_unsupported};
use super::{ResponseStore, Responses, input, runner, truncate};
use crate::clock::unix_now;
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::generation::record::RequestRecord;
use crate::generation::{Generator, Prepared, Prompt};
use crate::ids::new_id;
use crate::openai::chat::Tool;
use crate::openai::responses::{InputItemList, ResponseObject, ResponseUsage, ResponsesRequest};
use crate::protocols::deliver::{Delivered, deliver};
use crate::protocols::messages;
use crate::protocols::{Call, Reply, StreamSettings};

/// A Responses request validated, translated and admitted: ready to run.
#[derive(Debug)]
pub(crate) struct Turn {
    /// `resp_...`.
    pub id: String,
    /// The response object before any output.
    pub base: ResponseObject,
    /// What to run.
    pub prepared: Prepared,
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
pub(crate) async fn conversation(
    store: &ResponseStore,
    tenant: &str,
    req: &ResponsesRequest,
    last: Option<&StoredResponse>,
) -> Result<Vec<Value>, ApiError> {
    let mut items = Vec::new();
    if let Some(previous) = &req.previous_response_id {
        let stored = match last.filter(|l| &l.response.id == previous) {
            Some(cached) => cached.clone(),
            None => store
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

/// The prompt tokens a request would use (`POST /v1/responses/input_tokens`), counted with the
/// model's own template and tokenizer, without running it.
pub(crate) async fn input_tokens(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
) -> Result<Reply, ApiError> {
    let model = call.generator.model_for(call.caller, &req.model)?;
    let tenant = &call.caller.principal.tenant.name;
    let items = conversation(&responses.store, tenant, req, None).await?;
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let tools = tools.as_deref().unwrap_or_default();
    let count = prompt_length(call.generator, &model, req, tools, &items)?;
    Ok(Reply::json(
        None,
        &json!({"object": "response.input_tokens", "input_tokens": count}),
    ))
}

/// The prompt tokens `items` make for `req` on `model`, counted with the model's own template
/// and tokenizer.
fn prompt_length(
    generator: &Generator,
    model: &ServedModel,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &[Value],
) -> Result<usize, ApiError> {
    let messages =
        messages::template_messages(&input::to_messages(req.instructions.as_deref(), items))?;
    let tools = match tools {
        [] => None,
        tools => Some(messages::template_tools(tools)?),
    };
    let conversation = Prompt::Chat {
        messages,
        tools,
        template_kwargs: req.chat_template_kwargs.clone(),
    };
    generator.count_chat_prompt(model, &conversation, NAMES.prompt)
}

/// The items of `items` the model is shown: all of them, or with `truncation: "auto"` those
/// [`fit`] keeps.
fn visible<'a>(
    call: Call<'_>,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &'a [Value],
) -> Result<Cow<'a, [Value]>, ApiError> {
    if req.truncation.as_deref() != Some("auto") {
        return Ok(Cow::Borrowed(items));
    }
    let model = call.generator.model_for(call.caller, &req.model)?;
    let reserve = output_reserve(call.generator, &model, req);
    Ok(Cow::Owned(fit(
        call.generator,
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
pub(crate) fn output_reserve(
    generator: &Generator,
    model: &ServedModel,
    req: &ResponsesRequest,
) -> usize {
    let default = generator
        .defaults()
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
pub(crate) fn fit(
    generator: &Generator,
    model: &ServedModel,
    req: &ResponsesRequest,
    tools: &[Tool],
    items: &[Value],
    tail: &[Value],
    reserve: usize,
) -> Vec<Value> {
    let context = model.context_length as usize;
    let prompt_limit = (generator.defaults().max_request_tokens as usize).min(context);
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
        prompt_length(generator, model, req, tools, &[head, kept, tail].concat())
    });
    [head, &rest[first..], tail].concat()
}

/// Validates `req`, finds the conversation it continues (in `last`, a WebSocket connection's
/// previous response, else in the store), and admits it (waiting for its place in the model's
/// queue when `wait`).
pub(crate) async fn begin(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
    last: Option<&StoredResponse>,
    wait: bool,
) -> Result<Turn, ApiError> {
    refuse_unsupported(req)?;
    let tenant = call.caller.principal.tenant.name.clone();
    let keep = req.store.unwrap_or(true);
    let items = conversation(&responses.store, &tenant, req, last).await?;
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let tools = tools.unwrap_or_default();
    let shown = visible(call, req, &tools, &items)?;
    let generation = generation_request(req, &shown, &tools)?;
    let id = new_id("resp_");
    let prepared = call
        .generator
        .prepare(call.caller, &generation, &id, call.started, wait)
        .await?;
    let base = in_progress(
        req,
        &id,
        unix_now(),
        &tools,
        keep,
        prepared.logprobs.unwrap_or(0),
    );
    Ok(Turn {
        id,
        base,
        model_id: prepared.model.id.clone(),
        prepared,
        keep,
        tenant,
        items,
    })
}

/// Runs `req` and answers as `POST /v1/responses` does (a response object, a stream, or a
/// background response), with the conversation it ran. `last` is a WebSocket connection's
/// previous response.
pub(crate) async fn respond(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
    last: Option<&StoredResponse>,
) -> Result<(Reply, Vec<Value>), ApiError> {
    let background = req.background == Some(true);
    let turn = begin(call, responses, req, last, !background).await?;
    let record = RequestRecord::new(
        turn.id.clone(),
        "responses",
        turn.model_id.clone(),
        req.user.clone(),
        req.stream.unwrap_or(false),
        call.started,
    );
    if background {
        responses.running.check_room()?;
        let items = turn.items.clone();
        let streamed = req.stream == Some(true);
        let reply = runner::start(call, responses, turn, record, streamed).await?;
        return Ok((reply, items));
    }
    let stream = turn.prepared.start().inspect_err(|e| record.failed(e))?;
    let on_done: Option<OnDone> = turn.keep.then(|| {
        let (store, tenant, input_items) = (
            responses.store.clone(),
            turn.tenant.clone(),
            turn.items.clone(),
        );
        Box::new(move |response| {
            save_soon(
                store,
                tenant,
                StoredResponse {
                    response,
                    input_items,
                },
            );
        }) as OnDone
    });
    let renderer = EventRenderer::new(turn.base.clone(), on_done);
    let id = turn.id.clone();
    let folded = match deliver(stream, record, call.streams, 1, renderer).await? {
        Delivered::Streamed(events) => return Ok((Reply::Events { id, events }, turn.items)),
        Delivered::Folded { folded, .. } => folded,
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
        responses.store.save(&turn.tenant, &stored).await?;
    }
    Ok((Reply::json(Some(id), &response), turn.items))
}

/// `tenant`'s stored response `id`, or 404 `response_not_found`.
async fn stored_or_404(
    store: &ResponseStore,
    tenant: &str,
    id: &str,
) -> Result<StoredResponse, ApiError> {
    store
        .load(tenant, id)
        .await?
        .ok_or_else(|| not_found(id, None))
}

/// `POST /v1/responses/{id}/cancel`: stops `tenant`'s background response that is still
/// queued or running and stores it `cancelled`; a finished one is returned as it is.
pub(crate) async fn cancel(
    responses: &Responses,
    tenant: &str,
    id: &str,
) -> Result<Reply, ApiError> {
    let stored = stored_or_404(&responses.store, tenant, id).await?;
    if !stored.response.background {
        return Err(ApiError::invalid(
            "response_id",
            "only background responses can be cancelled",
        ));
    }
    let stored = runner::cancel(responses, tenant, stored).await?;
    Ok(Reply::json(None, &stored.response))
}

/// Stores a streamed response as its last event is sent: at once when the store answers at
/// once (memory), else on a task (Redis), logging a failure.
pub(crate) fn save_soon(responses: ResponseStore, tenant: String, stored: StoredResponse) {
    let mut save = Box::pin(async move {
        if let Err(e) = responses.save(&tenant, &stored).await {
            e.log();
        }
    });
    if (&mut save).now_or_never().is_none() {
        tokio::spawn(save);
    }
}

/// `GET /v1/responses/{id}`: `tenant`'s response, or with `stream=true` the event stream of
/// a streamed background response (after `starting_after`, when given).
pub(crate) async fn retrieve(
    responses: &Responses,
    streams: StreamSettings,
    tenant: &str,
    id: &str,
    query: &HashMap<String, String>,
) -> Result<Reply, ApiError> {
    let stored = stored_or_404(&responses.store, tenant, id).await?;
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
        return runner::resume(responses, streams, tenant, &stored, starting_after).await;
    }
    Ok(Reply::json(None, &stored.response))
}

/// `DELETE /v1/responses/{id}`: stops `tenant`'s response if it runs here, and forgets it.
pub(crate) async fn delete(
    responses: &Responses,
    tenant: &str,
    id: &str,
) -> Result<Reply, ApiError> {
    runner::stop(responses, tenant, id);
    if !responses.store.delete(tenant, id).await? {
        return Err(not_found(id, None));
    }
    Ok(Reply::json(
        None,
        &json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// `GET /v1/responses/{id}/input_items`: `tenant`'s response's input items (`limit` 1..=100,
/// default 20; `order` `desc` (default) or `asc`; `after` an item id).
pub(crate) async fn input_items(
    responses: &Responses,
    tenant: &str,
    id: &str,
    query: &HashMap<String, String>,
) -> Result<Reply, ApiError> {
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
    let stored = stored_or_404(&responses.store, tenant, id).await?;
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
    Ok(Reply::json(None, &list))
}
