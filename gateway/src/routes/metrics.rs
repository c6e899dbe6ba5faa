//! `GET /metrics`: Prometheus text exposition, with each engine's own counters read at scrape
//! time.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::observability::metrics;

/// Renders every metric.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let registry = std::sync::Arc::clone(&state.registry);
    let task = tokio::task::spawn_blocking(move || {
        for (name, backend) in registry.engines() {
            if let Ok(stats) = backend.stats() {
                metrics::engine_stats(name, &stats);
            }
        }
    });
    // An engine that does not answer in time leaves its last numbers in place.
    let _ = tokio::time::timeout(super::health::PROBE_TIMEOUT, task).await;
    let mut response = metrics::render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
