//! Embeddings (`POST /v1/embeddings`): inputs in four forms, vectors as float lists or base64
//! (little-endian float32, what both official SDKs ask for by default).

use base64::Engine as _;

use super::{Call, Reply};
use crate::error::ApiError;
use crate::generation::EmbeddingRequest as Inputs;
use crate::generation::record::RequestRecord;
use crate::ids::new_id;
use crate::openai::embeddings::{
    Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Vector,
};

/// Embeds `req`'s inputs and answers with the list of vectors.
pub(crate) async fn embed(call: Call<'_>, req: EmbeddingRequest) -> Result<Reply, ApiError> {
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
    let inputs = Inputs {
        model: req.model.clone(),
        input: req.input,
        dimensions: super::numbers::count("dimensions", req.dimensions.as_ref(), 0, u32::MAX)?,
    };
    let embedded = call
        .generator
        .embed(call.caller, &inputs, call.started)
        .await?;
    let record = RequestRecord::new(
        new_id("embd-"),
        "embeddings",
        embedded.model_id,
        req.user,
        false,
        call.started,
    )
    .correlated(call.caller.correlation.clone());
    record.ended(embedded.prompt_tokens, 0);
    let data = embedded
        .vectors
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
            prompt_tokens: embedded.prompt_tokens,
            total_tokens: embedded.prompt_tokens,
        },
    };
    Ok(Reply::json(Some(record.id.clone()), &body))
}
