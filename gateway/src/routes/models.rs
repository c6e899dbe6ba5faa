//! `GET /v1/models` and `GET /v1/models/{model}`.

use axum::Json;
use axum::extract::{Path, State};

use super::AppState;
use super::error::ApiError;
use crate::engine_host::ServedModel;
use crate::openai::models::{Model, ModelList};

fn wire(model: &ServedModel) -> Model {
    Model {
        id: model.info.id.clone(),
        object: "model",
        created: model.created,
        owned_by: model
            .info
            .owned_by
            .clone()
            .unwrap_or_else(|| model.engine.plugin().name.clone()),
    }
}

/// Lists every served model.
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: state.registry.iter().map(wire).collect(),
    })
}

/// Describes one model.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Model>, ApiError> {
    state
        .registry
        .get(&id)
        .map(|m| Json(wire(m)))
        .ok_or(ApiError::ModelNotFound(id))
}
