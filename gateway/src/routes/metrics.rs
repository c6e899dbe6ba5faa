//! `GET /metrics`: Prometheus text exposition.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::observability::metrics;

/// Renders every metric.
pub async fn metrics() -> Response {
    let mut response = metrics::render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
