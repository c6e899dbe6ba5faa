//! The Responses API's HTTP endpoints: `POST /v1/responses`, `GET` and `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST
//! /v1/responses/{id}/cancel`, `POST /v1/responses/input_tokens` and `POST
//! /v1/responses/compact`. Everything they do is in [`crate::protocols::responses`].

use std::collections::HashMap;
use std::time::Instant;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::Response;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond;
use crate::error::ApiError;
use crate::openai::responses::ResponsesRequest;
use crate::protocols::responses::{api, compact as compaction, operations};
use crate::tenancy::Caller;

/// Handles `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    let (reply, _) = api::respond(call, &state.responses, &req, None).await?;
    Ok(respond(reply))
}

/// Handles `POST /v1/responses/input_tokens`.
pub(super) async fn input_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    api::input_tokens(call, &state.responses, &req)
        .await
        .map(respond)
}

/// Handles `POST /v1/responses/compact`.
pub(super) async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    compaction::compact(call, &state.responses, &req)
        .await
        .map(respond)
}

/// Handles `GET /v1/responses/{id}` (`stream=true` follows a streamed background response).
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    operations::retrieve(&state.responses, state.streams(), tenant, &id, &query)
        .await
        .map(respond)
}

/// Handles `DELETE /v1/responses/{id}`.
pub(super) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    operations::delete(&state.responses, tenant, &id)
        .await
        .map(respond)
}

/// Handles `GET /v1/responses/{id}/input_items`.
pub(super) async fn input_items(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    operations::input_items(&state.responses, tenant, &id, &query)
        .await
        .map(respond)
}

/// Handles `POST /v1/responses/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    operations::cancel(&state.responses, tenant, &id)
        .await
        .map(respond)
}
