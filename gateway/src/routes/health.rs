//! `GET /health` (the process is alive) and `GET /ready` (every engine answers and can serve,
//! and the server is not stopping: once a stop signal arrives `/ready` answers 503 with
//! `"status": "draining"` so load balancers stop sending work while requests in flight finish).
//!
//! `/ready` also reports the state store (`"state": "ok"` or `"unavailable"`). A store that does
//! not answer makes the gateway not ready (503) only when generations cannot be served without
//! it: a request, token or concurrency limit set to fail closed. With the default (fail open)
//! the gateway goes on serving, unlimited, and stays ready; the body and the gauge
//! `turnpike_state_store_up` say the store is away.
//!
//! With the admin API on, the body's `admin_state` says `"ok"`, or `"store_regressed"` while
//! the store is behind the admin state this replica holds (until the replica has put it back).
//! That does not make the replica unready: it goes on serving the state it holds, which is the
//! newest.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

/// Liveness: always 200 while the process serves HTTP.
pub(super) async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long engines get to answer a probe; one that hangs makes the gateway not ready rather
/// than hanging the probe.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Readiness: 200 when every engine is healthy, 503 naming those that are not.
pub(super) async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if state.generator.lifecycle().is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        );
    }
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
    let checked = tokio::time::timeout(PROBE_TIMEOUT, task)
        .await
        .ok()
        .and_then(Result::ok);
    let store_up = state.tenancy.store_health.is_up();
    let (status, Json(mut body)) = respond(checked, store_up, state.tenancy.needs_store);
    if let Some(admin) = &state.admin {
        body["admin_state"] = json!(if admin.is_regressed() {
            "store_regressed"
        } else {
            "ok"
        });
    }
    (status, Json(body))
}

fn respond(
    checked: Option<serde_json::Map<String, Value>>,
    store_up: bool,
    needs_store: bool,
) -> (StatusCode, Json<Value>) {
    let store = if store_up { "ok" } else { "unavailable" };
    let mut body = json!({"status": "ready", "state": store});
    let engines_ok = match checked {
        Some(failing) if failing.is_empty() => true,
        Some(failing) => {
            body["engines"] = Value::Object(failing);
            false
        }
        None => false,
    };
    if engines_ok && (store_up || !needs_store) {
        return (StatusCode::OK, Json(body));
    }
    body["status"] = json!("unavailable");
    (StatusCode::SERVICE_UNAVAILABLE, Json(body))
}
