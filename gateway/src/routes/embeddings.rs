//! `POST /v1/embeddings`: inputs in four forms, vectors as float lists or base64 (little-endian
//! float32, what both official SDKs ask for by default).

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use turnpike_engine_api::EmbedParams;

use super::extract::JsonBody;
use super::{AppState, new_id, with_request_id};
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::embeddings::{
    Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Vector,
};
use crate::pipeline::{params, prompt};
use crate::tenancy::Caller;

/// Handles an embeddings request.
pub async fn embeddings(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model(&req.model)?;
    state.tenancy.check_model(&caller, &model, &req.model)?;
    if !model.backend.supports_embeddings() || model.info.embedding_dim.is_none() {
        return Err(ApiError::unsupported(
            "model",
            format!("model `{}` does not serve embeddings", model.id),
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', got '{other}'"),
            ));
        }
    };
    let dimensions = match &req.dimensions {
        Some(d) => Some(params::integer(
            "dimensions",
            d,
            1,
            i64::from(model.info.embedding_dim.unwrap_or(1)),
        )? as u32),
        None => None,
    };
    let inputs = prompt::text_inputs(
        &req.input,
        "input",
        &model,
        true,
        model.context_length as usize,
    )?;
    if let Some((i, _)) = inputs
        .iter()
        .enumerate()
        .find(|(_, input)| input.text.is_empty() && input.ids.len() <= 1)
    {
        return Err(ApiError::invalid("input", format!("input {i} is empty")));
    }
    let context = model.context_length as usize;
    if let Some(long) = inputs.iter().find(|i| i.ids.len() > context) {
        return Err(ApiError::ContextLengthExceeded {
            param: "input".into(),
            message: format!(
                "This model's maximum context length is {context} tokens, but an input has {} tokens.",
                long.ids.len()
            ),
        });
    }
    let ids: Vec<Vec<u32>> = inputs.into_iter().map(|i| i.ids).collect();
    let prompt_tokens: u64 = ids.iter().map(|v| v.len() as u64).sum();
    let backend = std::sync::Arc::clone(&model.backend);
    let engine_model = model.info.id.clone();
    let embed_params = EmbedParams { dimensions };
    let record = RequestRecord::new(
        new_id("embd-"),
        "embeddings",
        model.id.clone(),
        req.user.clone(),
        false,
        started,
    );
    // Embeddings carry no metadata: they wait at the default priority.
    let priority = 0;
    let admission = state
        .tenancy
        .admit(
            &caller,
            &model,
            prompt_tokens,
            0,
            priority,
            started + state.server.request_timeout,
            true,
        )
        .await?;
    let deadline = tokio::time::Instant::from_std(started + state.server.request_timeout);
    // The admission lives as long as the engine works, also past a client that left.
    let task = tokio::task::spawn_blocking(move || {
        let embedded = backend.embed(&engine_model, &ids, &embed_params);
        admission.settle(prompt_tokens);
        embedded
    });
    let vectors = tokio::time::timeout_at(deadline, task)
        .await
        .map_err(|_| ApiError::Timeout(state.server.request_timeout))
        .and_then(|joined| {
            joined.map_err(|e| ApiError::Internal {
                detail: format!("embedding task failed: {e}"),
            })
        })
        .and_then(|embedded| {
            embedded.map_err(|e| ApiError::from_engine(e, state.server.retry_after))
        })
        .inspect_err(|e| record.failed(e))?;
    record.ended(prompt_tokens, 0);
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Vector::Float(vector)
            };
            Embedding {
                object: "embedding",
                index: index as u32,
                embedding,
            }
        })
        .collect();
    let body = EmbeddingList {
        object: "list",
        data,
        model: req.model,
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    };
    Ok(with_request_id(Json(body).into_response(), &record.id))
}
