//! `GET /v1/models` and `GET /v1/models/{model}` (ids may hold `/`, as `org/name` ones do).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::{Extension, Json};

use super::AppState;
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::openai::models::{Model, ModelList};
use crate::tenancy::Caller;

fn wire(id: &str, model: &ServedModel) -> Model {
    Model {
        id: id.to_string(),
        object: "model",
        created: model.created,
        owned_by: model.owned_by.clone(),
        shutdown_date: model.shutdown_date.clone(),
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
            .listing()
            .filter(|(id, m)| caller.principal.may_use([*id, m.id.as_str()].into_iter()))
            .map(|(id, m)| wire(id, m))
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
    let model = state.model(&id)?;
    // A model the caller may not use is, to the caller, one that does not exist.
    if !caller
        .principal
        .may_use([id.as_str(), model.id.as_str()].into_iter())
    {
        return Err(ApiError::ModelNotFound(id));
    }
    Ok(Json(wire(&id, &model)))
}
