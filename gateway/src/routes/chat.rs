//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond;
use crate::error::ApiError;
use crate::openai::chat::ChatCompletionRequest;
use crate::protocols::chat;
use crate::tenancy::Caller;

/// Handles a chat completion.
pub(super) async fn chat(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    chat::complete(call, &req).await.map(respond)
}
