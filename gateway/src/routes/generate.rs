//! `POST /generate`: the token-level node endpoint (SGLang's native API; see
//! [`crate::protocols::generate`]).

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond;
use crate::error::ApiError;
use crate::protocols::generate::{self, GenerateRequest};
use crate::tenancy::Caller;

/// Handles a token-level generation.
pub(super) async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<GenerateRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    generate::generate(call, &req).await.map(respond)
}
