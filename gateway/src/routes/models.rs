//! `GET /v1/models` and `GET /v1/models/{model}` (ids may hold `/`, as `org/name` ones do), in
//! OpenAI's shape, or in Anthropic's when the caller sends `anthropic-version` (as Anthropic's
//! SDKs do).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use super::AppState;
use crate::engine_host::ListedModel;
use crate::error::ApiError;
use crate::openai::models::{Model, ModelList};
use crate::tenancy::Caller;

fn anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

fn anthropic_wire(listed: &ListedModel) -> crate::anthropic::Model {
    crate::anthropic::Model {
        kind: "model",
        id: listed.id.clone(),
        display_name: listed.id.clone(),
        created_at: crate::tenancy::keys_file::format_time(listed.model.created as i64),
    }
}

fn wire(listed: ListedModel) -> Model {
    Model {
        id: listed.id,
        object: "model",
        created: listed.model.created,
        owned_by: listed.model.owned_by.clone(),
        shutdown_date: listed.shutdown_date,
    }
}

/// Lists every public model id (names, pinned versions, aliases) the caller may use.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    let listed: Vec<ListedModel> = state
        .registry
        .entries()
        .into_iter()
        .filter(|m| {
            caller
                .principal
                .may_use([m.id.as_str(), m.model.id.as_str()].into_iter())
        })
        .collect();
    if anthropic(&headers) {
        let data: Vec<_> = listed.iter().map(anthropic_wire).collect();
        let body = json!({
            "data": data,
            "has_more": false,
            "first_id": listed.first().map(|m| m.id.clone()),
            "last_id": listed.last().map(|m| m.id.clone()),
        });
        return Json(body).into_response();
    }
    Json(ModelList {
        object: "list",
        data: listed.into_iter().map(wire).collect(),
    })
    .into_response()
}

/// Describes one model id.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|e| {
        ApiError::invalid(
            "model",
            format!("the model id in the path is not valid: {e}"),
        )
    })?;
    let listed = state
        .registry
        .entry(&id)
        .ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    // A model the caller may not use is, to the caller, one that does not exist.
    if !caller
        .principal
        .may_use([id.as_str(), listed.model.id.as_str()].into_iter())
    {
        return Err(ApiError::ModelNotFound(id));
    }
    if anthropic(&headers) {
        return Ok(Json(anthropic_wire(&listed)).into_response());
    }
    Ok(Json(wire(listed)).into_response())
}
