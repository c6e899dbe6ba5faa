//! `/v1/batches`: create, retrieve, list and cancel (the work is the batch worker's).

use std::collections::HashMap;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::extract::JsonBody;
use crate::batches::CreateBatch;
use crate::error::ApiError;
use crate::tenancy::Caller;

/// A list's `limit`: 1 to 10,000, `default` when absent.
pub(super) fn limit(query: &HashMap<String, String>, default: usize) -> Result<usize, ApiError> {
    match query.get("limit") {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=10_000).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                "limit",
                format!("'limit' must be an integer from 1 to 10000, got {text:?}"),
            )),
        },
    }
}

/// `POST /v1/batches`.
pub(super) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CreateBatch>,
) -> Result<Response, ApiError> {
    let batch = state.batches.create(&caller.principal, req).await?;
    Ok(Json(batch).into_response())
}

/// `GET /v1/batches`.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = limit(&query, 20)?;
    let tenant = &caller.principal.tenant.name;
    let after = query.get("after").map(String::as_str);
    Ok(Json(state.batches.list(tenant, after, limit).await?).into_response())
}

/// `GET /v1/batches/{id}`.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    Ok(Json(state.batches.retrieve(tenant, &id).await?).into_response())
}

/// `POST /v1/batches/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = &caller.principal.tenant.name;
    Ok(Json(state.batches.cancel(tenant, &id).await?).into_response())
}
