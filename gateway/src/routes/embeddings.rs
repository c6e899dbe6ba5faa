//! `POST /v1/embeddings`.

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond;
use crate::error::ApiError;
use crate::openai::embeddings::EmbeddingRequest;
use crate::protocols::embeddings;
use crate::tenancy::Caller;

/// Handles an embeddings request.
pub(super) async fn embeddings(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    embeddings::embed(call, req).await.map(respond)
}
