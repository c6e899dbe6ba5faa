//! `GET /v1/models` and `GET /v1/models/{model}` (ids may hold `/`, as `org/name` ones do).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::{Extension, Json};

use super::AppState;
use crate::engine_host::ListedModel;
use crate::error::ApiError;
use crate::openai::models::{Model, ModelList};
use crate::tenancy::Caller;

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
) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: state
            .registry
            .entries()
            .into_iter()
            .filter(|m| {
                caller
                    .principal
                    .may_use([m.id.as_str(), m.model.id.as_str()].into_iter())
            })
            .map(wire)
            .collect(),
    })
}

/// Describes one model id.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Model>, ApiError> {
    let Path(id) = id.map_err(|e| {
        ApiError::invalid(
            "model",
            format!("the model id in the path is not valid: {e}"),
        )
    })?;
    let listed = state
        .registry
        .entries()
        .into_iter()
        .find(|m| m.id == id)
        .ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    // A model the caller may not use is, to the caller, one that does not exist.
    if !caller
        .principal
        .may_use([id.as_str(), listed.model.id.as_str()].into_iter())
    {
        return Err(ApiError::ModelNotFound(id));
    }
    Ok(Json(wire(listed)))
}
