//! `POST /v1/completions` (legacy).

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond;
use crate::error::ApiError;
use crate::openai::completions::CompletionRequest;
use crate::protocols::completions;
use crate::tenancy::Caller;

/// Handles a legacy completion.
pub(super) async fn completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    completions::complete(call, &req).await.map(respond)
}
