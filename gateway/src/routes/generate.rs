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

/// `GET /model_info` (and `/get_model_info`): what the field's routers ask a node about its
/// model when they register it, in SGLang's shape.
pub(super) async fn model_info(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    let names: Vec<&str> = state.registry.listing().map(|(id, _)| id).collect();
    axum::Json(serde_json::json!({
        "model_path": names.first(),
        "tokenizer_path": serde_json::Value::Null,
        "is_generation": true,
        "served_model_names": names,
    }))
}

/// `GET /server_info` (and `/get_server_info`): the node's build and models.
pub(super) async fn server_info(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    let names: Vec<&str> = state.registry.listing().map(|(id, _)| id).collect();
    axum::Json(serde_json::json!({
        "server": "turnpike",
        "version": env!("CARGO_PKG_VERSION"),
        "served_model_names": names,
    }))
}
