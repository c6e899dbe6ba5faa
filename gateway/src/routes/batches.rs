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
use crate::protocols::paging;
use crate::tenancy::Caller;

/// Most items one page of files or batches holds.
pub(super) const LIST_MOST: usize = 10_000;

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
    let limit = paging::limit(&query, 20, LIST_MOST)?;
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
