//! Embeddings through the facade: the same model lookup, tokenization and admission as a
//! generation, then one blocking engine call bounded by the request's deadline.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use turnpike_engine_api::EmbedParams;

use super::Generator;
use crate::error::ApiError;
use crate::pipeline::prompt;
use crate::tenancy::{AdmitRequest, Caller};

/// Inputs to embed.
#[derive(Debug, Clone)]
pub struct EmbeddingRequest {
    /// The public model name.
    pub model: String,
    /// One to many inputs: a string, strings, token ids, or lists of token ids.
    pub input: Value,
    /// Fewer dimensions than the model's, when asked for (checked against the model here).
    pub dimensions: Option<u32>,
}

/// Embedded inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens of all inputs.
    pub prompt_tokens: u64,
    /// The served model's id.
    pub model_id: String,
}

impl Generator {
    /// Embeds `req`'s inputs for `caller` (refused for a model that does not embed).
    pub async fn embed(
        &self,
        caller: &Caller,
        req: &EmbeddingRequest,
        started: Instant,
    ) -> Result<Embedded, ApiError> {
        let model = self.model_for(caller, &req.model)?;
        if !model.backend.supports_embeddings() || model.info.embedding_dim.is_none() {
            return Err(ApiError::unsupported(
                "model",
                format!("model `{}` does not serve embeddings", model.id),
            ));
        }
        let width = model.info.embedding_dim.unwrap_or(1);
        if let Some(d) = req.dimensions.filter(|&d| d == 0 || d > width) {
            return Err(ApiError::out_of_range(
                "dimensions",
                i64::from(d),
                1,
                i64::from(width),
            ));
        }
        let dimensions = req.dimensions;
        let context = model.context_length as usize;
        let inputs = prompt::text_inputs(&req.input, "input", &model, true, context)?;
        if let Some((i, _)) = inputs
            .iter()
            .enumerate()
            .find(|(_, input)| input.text.is_empty() && input.ids.len() <= 1)
        {
            return Err(ApiError::invalid("input", format!("input {i} is empty")));
        }
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
        let timing = self.timing;
        // Embeddings carry no metadata: they wait at the default priority (batch lines at the
        // lowest).
        let priority = if caller.batch.is_some() {
            crate::pipeline::params::BATCH_PRIORITY
        } else {
            0
        };
        let deadline = started + timing.request_timeout;
        let admission = self
            .tenancy
            .admit(
                caller,
                &model,
                AdmitRequest {
                    prompt: prompt_tokens,
                    most_new: 0,
                    priority,
                    deadline,
                    wait: true,
                    price: self
                        .price(&req.model, &model.id)
                        .map(|p| p.for_embeddings()),
                    record: super::record_context(
                        caller,
                        &crate::ids::new_id("embd-"),
                        "embeddings",
                        &req.model,
                        &model.id,
                        started,
                    ),
                },
            )
            .await?;
        let backend = Arc::clone(&model.backend);
        let engine_model = model.info.id.clone();
        let embed_params = EmbedParams { dimensions };
        // The admission lives as long as the engine works, also past a client that left.
        let task = tokio::task::spawn_blocking(move || {
            let embedded = backend.embed(&engine_model, &ids, &embed_params);
            let settled = if embedded.is_ok() {
                Some(admission.settle(prompt_tokens))
            } else {
                admission.fail();
                None
            };
            (embedded, settled)
        });
        let (embedded, settled) = tokio::time::timeout_at(deadline.into(), task)
            .await
            .map_err(|_| ApiError::Timeout(timing.request_timeout))?
            .map_err(|e| ApiError::Internal {
                detail: format!("embedding task failed: {e}"),
            })?;
        // The answer is complete only once its usage record is written.
        if let Some(admission) = settled {
            admission.written().await;
        }
        let vectors = embedded.map_err(|e| ApiError::from_engine(e, timing.retry_after))?;
        Ok(Embedded {
            vectors,
            prompt_tokens,
            model_id: model.id.clone(),
        })
    }
}
