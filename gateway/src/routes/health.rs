//! `GET /health` (the process is alive) and `GET /ready` (every engine answers and can serve).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

/// Liveness: always 200 while the process serves HTTP.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Readiness: 200 when every engine is healthy, 503 naming those that are not.
pub async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let registry = std::sync::Arc::clone(&state.registry);
    let checked = tokio::task::spawn_blocking(move || {
        registry
            .engines()
            .filter_map(|(name, backend)| {
                backend
                    .health()
                    .err()
                    .map(|e| (name.to_string(), Value::String(e.to_string())))
            })
            .collect::<serde_json::Map<String, Value>>()
    })
    .await;
    match checked {
        Ok(failing) if failing.is_empty() => (StatusCode::OK, Json(json!({"status": "ready"}))),
        Ok(failing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "engines": failing})),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable"})),
        ),
    }
}
