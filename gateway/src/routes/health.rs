//! `GET /health`: 200 when every engine can serve, 503 naming those that cannot.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

/// Asks each engine for its health.
pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let mut seen = Vec::new();
    let mut failing = serde_json::Map::new();
    for model in state.registry.iter() {
        if seen.contains(&model.engine_name) {
            continue;
        }
        seen.push(model.engine_name.clone());
        if let Err(e) = model.engine.health() {
            failing.insert(model.engine_name.to_string(), Value::String(e.to_string()));
        }
    }
    if failing.is_empty() {
        (StatusCode::OK, Json(json!({"status": "ok"})))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "engines": failing})),
        )
    }
}
