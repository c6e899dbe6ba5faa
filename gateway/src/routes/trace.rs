//! The outermost middleware: every request's root trace span (`request`, the child of the
//! caller's W3C `traceparent` when it sends one), kept open until the response body's last
//! byte, so a stream's trace covers the whole stream; and `X-Request-Trace`, a caller's
//! correlation id, checked and echoed on the response (and carried into the request's log line
//! through the caller; see `admission`).
//!
//! With traces off (no `[tracing]`), the span is disabled and this is one header lookup.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::observability::traces;

/// The correlation id header.
pub(super) const REQUEST_TRACE: &str = "x-request-trace";

/// A caller's `X-Request-Trace`, when it is one: 1 to 128 visible ASCII characters.
pub(super) fn correlation_id(request: &Request) -> Option<&str> {
    let value = request.headers().get(REQUEST_TRACE)?.to_str().ok()?;
    (!value.is_empty() && value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(value)
}

/// Runs `request` inside its trace span and echoes its correlation id.
pub(super) async fn trace_request(request: Request, next: Next) -> Response {
    let echo = correlation_id(&request).and_then(|v| HeaderValue::from_str(v).ok());
    let span = tracing::info_span!(
        target: traces::TARGET,
        "request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        correlation_id = echo.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""),
    );
    if !span.is_disabled() {
        // Only a traced request pays for naming its span.
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| request.uri().path(), |p| p.as_str());
        span.record("otel.name", format!("{} {route}", request.method()));
        span.record("http.route", route);
    }
    let mut response = if span.is_disabled() {
        next.run(request).await
    } else {
        traces::follow(&span, request.headers());
        let response = next.run(request).instrument(span.clone()).await;
        span.record("http.response.status_code", response.status().as_u16());
        response.map(|body| Body::new(Spanned { body, span }))
    };
    if let Some(value) = echo {
        response.headers_mut().insert(REQUEST_TRACE, value);
    }
    response
}

/// A response body that holds its request's span open until it ends. It does not enter the span
/// at each poll: what runs in the body (the rendering of a stream) names its spans' parents
/// itself, and entering costs on every chunk. It enters once as it drops, because the span's
/// end time is its last exit (an entered span that is never entered again ends where the
/// handler returned, before the stream).
struct Spanned {
    body: Body,
    span: tracing::Span,
}

impl Drop for Spanned {
    fn drop(&mut self) {
        // The body first (its spans close inside the request's), then the request's end.
        drop(std::mem::replace(&mut self.body, Body::empty()));
        let _last = self.span.enter();
    }
}

impl HttpBody for Spanned {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
