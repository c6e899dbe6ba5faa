//! `POST /v1/responses/compact`: the conversation (a stored response's, the input's, or both)
//! summarised by the model into a `compaction` item (see [`super::compaction`]).
//! The answer's `output` is the conversation's user messages followed by that item; a client
//! sends it as the input of its next request in place of the turns it replaces.
//!
//! The summary is made by an ordinary generation: the conversation, then an instruction to
//! summarise it, run greedily through the same validation, admission and tenant limits as
//! `POST /v1/responses`. A conversation too long for the context is summarised from its newest
//! items, truncated as `truncation: "auto"` does with room left for the summary (the default
//! output budget); the instruction itself is never what is left. An empty summary is an error,
//! not an answer a client would replace its history with. Nothing is stored.

use serde_json::{Value, json};

use super::api::{begin, conversation, fit, output_reserve};
use super::{Responses, compaction};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::generation::GenEvent;
use crate::generation::Started;
use crate::ids::new_id;
use crate::openai::responses::{ResponseInput, ResponseUsage, ResponsesRequest};
use crate::protocols::deliver::{Delivered, deliver};
use crate::protocols::render::{Chunk, Render};
use crate::protocols::{Call, Reply};

/// `POST /v1/responses/compact` (`model`, `input`, `previous_response_id`, `instructions`;
/// the prompt-cache and service-tier hints are accepted and ignored).
pub(crate) async fn compact(
    call: Call<'_>,
    responses: &Responses,
    req: &ResponsesRequest,
) -> Result<Reply, ApiError> {
    let tenant = &call.caller.principal.tenant.name;
    let items = match (&req.input, &req.previous_response_id) {
        // The stored conversation alone.
        (None, Some(_)) => {
            let stored_only = ResponsesRequest {
                input: Some(ResponseInput::Items(Vec::new())),
                ..req.clone()
            };
            conversation(&responses.store, tenant, &stored_only, None).await?
        }
        _ => conversation(&responses.store, tenant, req, None).await?,
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "there is nothing to compact: send input or a previous_response_id",
        ));
    }
    // The newest of the conversation that fits with the instruction and the summary's budget.
    let model = call.generator.model_for(call.caller, &req.model)?;
    let budget = output_reserve(call.generator, &model, req);
    let instruction = json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": compaction::INSTRUCTION}]});
    let shown = fit(
        call.generator,
        &model,
        req,
        &[],
        &items,
        &[instruction],
        budget,
    );
    let summarise = ResponsesRequest {
        input: Some(ResponseInput::Items(shown)),
        previous_response_id: None,
        store: Some(false),
        background: None,
        stream: Some(false),
        truncation: None,
        temperature: Some(0.0),
        top_p: None,
        max_output_tokens: Some(budget.into()),
        tools: None,
        tool_choice: None,
        text: None,
        include: None,
        metadata: None,
        ..req.clone()
    };
    let turn = begin(call, responses, &summarise, None).await?;
    let record = turn
        .record(&summarise, &req.model, call.started)
        .correlated(call.caller.correlation.clone());
    let Started {
        stream,
        record,
        model,
        ..
    } = call
        .generator
        .generate(call.caller, &turn.generation, &turn.id, record)
        .await?;
    let turn_model = model.id.clone();
    let Delivered::Folded { folded, record, .. } =
        deliver(stream, record, call.streams, 1, NoStream).await?
    else {
        return Err(ApiError::Internal {
            detail: "a compaction was streamed".into(),
        });
    };
    let summary = folded
        .choices
        .first()
        .map(|c| c.text.trim().to_string())
        .unwrap_or_default();
    if summary.is_empty() {
        // Nothing to replace the conversation with: a client must not drop its history for it.
        return Err(ApiError::Internal {
            detail: format!("model `{turn_model}` wrote an empty summary"),
        });
    }
    let mut output: Vec<Value> = items
        .into_iter()
        .filter(|item| item["type"] == "message" && item["role"] == "user")
        .collect();
    output.push(compaction::item(&summary));
    let t = folded.totals;
    let body = json!({
        "id": new_id("resp_"),
        "object": "response.compaction",
        "created_at": unix_now(),
        "output": output,
        "usage": ResponseUsage::new(t.prompt, t.completion, t.cached, t.reasoning)
            .with_cost(t.cost.map(|c| c.0)),
    });
    Ok(Reply::json(Some(record.id.clone()), &body))
}

/// The renderer of a generation that is never streamed.
struct NoStream;

impl Render for NoStream {
    fn opening(&mut self) -> Vec<Chunk> {
        Vec::new()
    }

    fn event(&mut self, _: &GenEvent) -> Vec<Chunk> {
        Vec::new()
    }
}
