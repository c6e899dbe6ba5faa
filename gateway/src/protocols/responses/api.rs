//! The Responses API's turns: the conversation a request continues, truncated when asked,
//! translated into the facade's generation request, and answered whole, streamed, or run in the
//! background ([`super::runner`]). The stored-response operations are in
//! [`super::operations`].

use std::borrow::Cow;
use std::time::Instant;

use futures_util::FutureExt;
use serde_json::{Value, json};

use super::render::{self, EventRenderer, OnDone};
use super::stored::{StoredResponse, not_found};
use super::translate::{
    NAMES, chat_tools, generation_request, hosted_servers, in_progress, refuse_unsupported,
};
use super::{ResponseStore, Responses, input, runner, translate, truncate};
use crate::clock::unix_now;
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::generation::record::RequestRecord;
use crate::generation::{GenerationRequest, Generator, Started};
use crate::ids::new_id;
use crate::openai::chat::Tool;
use crate::openai::responses::{ResponseObject, ResponseUsage, ResponsesRequest};
use crate::protocols::deliver::{Delivered, deliver};
use crate::protocols::{Call, Reply};

/// A Responses request validated and translated: ready for the facade.
#[derive(Debug)]
pub(crate) struct Turn {
    /// `resp_...`.
    pub id: String,
    /// What to generate.
    pub generation: GenerationRequest,
    /// The function tools offered.
    pub tools: Vec<Tool>,
    /// Whether to store the response.
    pub keep: bool,
    /// The caller's tenant (stored responses are kept per tenant).
    pub tenant: String,
    /// The conversation so far: earlier turns' items, then this turn's input.
    pub items: Vec<Value>,
}

impl Turn {
    /// The response object `req` makes before any output (`logprobs`: the alternatives per
    /// token it returns, if any).
    pub(crate) fn base(&self, req: &ResponsesRequest, logprobs: Option<u32>) -> ResponseObject {
        let top = logprobs.unwrap_or(0);
        in_progress(req, &self.id, unix_now(), &self.tools, self.keep, top)
    }

    /// The record of the turn `req` asked for, served by `model` (the name it asked for until
    /// the facade knows the served model).
    pub(crate) fn record(
        &self,
        req: &ResponsesRequest,
        model: &str,
        started: Instant,
    ) -> RequestRecord {
        let stream = req.stream.unwrap_or(false);
        let (id, user) = (self.id.clone(), req.user.clone());
        RequestRecord::new(id, "responses", model.to_string(), user, stream, started)
    }
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
    let turn = input::normalise(this_turn)?;
    input::check_outputs(&items, &turn)?;
    items.extend(turn);
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
    let conversation = translate::prompt(req, items, tools)?;
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

/// Validates `req` and finds the conversation it continues (in `last`, a WebSocket
/// connection's previous response, else in the store), truncated when it asks for that.
pub(crate) async fn begin(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
    last: Option<&StoredResponse>,
) -> Result<Turn, ApiError> {
    refuse_unsupported(req)?;
    let tenant = call.caller.principal.tenant.name.clone();
    let keep = req.store.unwrap_or(true);
    let items = conversation(&responses.store, &tenant, req, last).await?;
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let tools = tools.unwrap_or_default();
    let shown = visible(call, req, &tools, &items)?;
    let mut generation = generation_request(req, &shown, &tools)?;
    generation.tools.hosted = req
        .tools
        .as_deref()
        .map(hosted_servers)
        .transpose()?
        .flatten();
    Ok(Turn {
        id: new_id("resp_"),
        generation,
        tools,
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
    let turn = begin(call, responses, req, last).await?;
    if req.background == Some(true) {
        return background(call, responses, req, turn).await;
    }
    let Started {
        stream,
        record,
        logprobs,
        ..
    } = call
        .generator
        .generate(
            call.caller,
            &turn.generation,
            &turn.id,
            turn.record(req, &req.model, call.started)
                .correlated(call.caller.correlation.clone()),
        )
        .await?;
    let base = turn.base(req, logprobs);
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
    let renderer = EventRenderer::new(base.clone(), on_done);
    let id = turn.id.clone();
    let folded = match deliver(stream, record, call.streams, 1, renderer).await? {
        Delivered::Streamed(events) => return Ok((Reply::Events { id, events }, turn.items)),
        Delivered::Folded { folded, .. } => folded,
    };
    let (output, finished) = render::folded_output(&folded, render::wants_summary(&base));
    let t = folded.totals;
    let usage = ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning)
        .with_cost(t.cost.map(|c| c.0));
    let response = render::finish(base, output, finished, usage, unix_now());
    if turn.keep {
        let stored = StoredResponse {
            response: response.clone(),
            input_items: turn.items.clone(),
        };
        responses.store.save(&turn.tenant, &stored).await?;
    }
    Ok((Reply::json(Some(id), &response), turn.items))
}

/// A background turn: admitted without waiting for its place in the model's queue, then run
/// on a task ([`runner`]).
async fn background(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
    turn: Turn,
) -> Result<(Reply, Vec<Value>), ApiError> {
    let prepared = call
        .generator
        .prepare(
            call.caller,
            &turn.generation,
            &turn.id,
            "responses",
            call.started,
            false,
        )
        .await?;
    let record = turn
        .record(req, &prepared.model.id, call.started)
        .correlated(call.caller.correlation.clone());
    responses.running.check_room()?;
    let base = turn.base(req, prepared.logprobs());
    let items = turn.items.clone();
    let streamed = req.stream == Some(true);
    let reply = runner::start(call, responses, turn, base, prepared, record, streamed).await?;
    Ok((reply, items))
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
