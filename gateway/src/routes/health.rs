//! `GET /health` (the process is alive) and `GET /ready` (every engine answers and can serve).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

/// Liveness: always 200 while the process serves HTTP.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long engines get to answer a probe; one that hangs makes the gateway not ready rather
/// than hanging the probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Readiness: 200 when every engine is healthy, 503 naming those that are not.
pub async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let registry = std::sync::Arc::clone(&state.registry);
    let task = tokio::task::spawn_blocking(move || {
        registry
            .engines()
            .filter_map(|(name, backend)| {
                backend
                    .health()
                    .err()
                    .map(|e| (name.to_string(), Value::String(e.to_string())))
            })
            .collect::<serde_json::Map<String, Value>>()
    });
    match tokio::time::timeout(PROBE_TIMEOUT, task).await {
        Ok(checked) => respond(checked.ok()),
        Err(_) => respond(None),
    }
}

fn respond(checked: Option<serde_json::Map<String, Value>>) -> (StatusCode, Json<Value>) {
    match checked {
        Some(failing) if failing.is_empty() => (StatusCode::OK, Json(json!({"status": "ready"}))),
        Some(failing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "engines": failing})),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable"})),
        ),
    }
}
