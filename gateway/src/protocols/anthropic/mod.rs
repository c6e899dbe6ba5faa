//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): one more
//! translator onto the same generation request, so every engine serves the Anthropic SDKs too.
//! [`translate`] reads the request; [`render`] writes the message, its event stream and errors
//! in Anthropic's shapes.

pub(crate) mod render;
pub(crate) mod translate;

use serde_json::json;

use super::deliver::{Delivered, deliver};
use super::{Call, Reply};
use crate::anthropic::MessagesRequest;
use crate::error::ApiError;
use crate::generation::Started;
use crate::ids::new_id;

/// Runs `req` and answers as `POST /v1/messages` does: one message, or its event stream.
pub(crate) async fn create(call: Call<'_>, req: &MessagesRequest) -> Result<Reply, ApiError> {
    let id = new_id("msg_");
    let generation = translate::generation_request(req, false)?;
    let thinking = translate::thinking(req)?;
    let user = req.metadata.as_ref().and_then(|m| m.user_id.clone());
    let record = call.record(
        &id,
        "messages",
        &req.model,
        user,
        req.stream.unwrap_or(false),
    );
    let Started {
        stream,
        record,
        prompt_tokens,
        ..
    } = call
        .generator
        .generate(call.caller, &generation, &id, record)
        .await?;
    let stops = req.stop_sequences.clone().unwrap_or_default();
    let renderer = render::EventRenderer::new(
        id.clone(),
        req.model.clone(),
        prompt_tokens,
        thinking,
        stops.clone(),
    );
    match deliver(stream, record, call.streams, 1, renderer).await? {
        Delivered::Streamed(events) => Ok(Reply::Events { id, events }),
        Delivered::Folded { folded, .. } => {
            let message = render::message(id.clone(), req.model.clone(), folded, thinking, &stops);
            Ok(Reply::json(Some(id), &message))
        }
    }
}

/// The prompt tokens `req` makes on its model (`POST /v1/messages/count_tokens`), counted with
/// the model's own template and tokenizer, as `usage.input_tokens` counts them.
pub(crate) fn count_tokens(call: Call<'_>, req: &MessagesRequest) -> Result<Reply, ApiError> {
    let model = call.generator.model_for(call.caller, &req.model)?;
    let generation = translate::generation_request(req, true)?;
    let count =
        call.generator
            .count_chat_prompt(&model, &generation.prompt, translate::NAMES.prompt)?;
    Ok(Reply::json(None, &json!({"input_tokens": count})))
}
