//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, and what makes them Anthropic's:
//! stream framing with `ping` keep-alives and `error` events (no `[DONE]`), and every error on
//! these routes, the admission's included, in Anthropic's shape with the statuses its SDKs
//! expect (overload as 529).

use std::time::Instant;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::AppState;
use super::extract::JsonBody;
use super::sse::respond_with;
use crate::anthropic::MessagesRequest;
use crate::error::ApiError;
use crate::idempotency::hub::StreamFailed;
use crate::protocols::anthropic::{self, render};
use crate::protocols::render::{Chunk, Out};
use crate::tenancy::Caller;

/// One item of an Anthropic event stream.
fn frame(out: Out, failed: &StreamFailed) -> Bytes {
    match out {
        Out::Chunk(chunk) => chunk.sse(),
        Out::KeepAlive => Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n"),
        // `message_stop` ended it already.
        Out::Done => Bytes::new(),
        Out::Failed { error, chunks, .. } => {
            failed.0.store(true, std::sync::atomic::Ordering::Relaxed);
            let chunks = chunks.unwrap_or_else(|| {
                let (_, kind) = render::error_kind(500, error.code.as_deref());
                vec![Chunk::named(
                    "error",
                    &render::error_body(kind, error.message),
                )]
            });
            Bytes::from(chunks.iter().flat_map(|c| c.sse()).collect::<Vec<u8>>())
        }
    }
}

/// Handles a message.
pub(super) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    let reply = anthropic::create(call, &req).await?;
    Ok(respond_with(reply, frame))
}

/// Counts a message's input tokens.
pub(super) async fn count_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    let call = state.call(&caller, Instant::now());
    Ok(respond_with(anthropic::count_tokens(call, &req)?, frame))
}

/// Rewrites an error answered on these routes into Anthropic's shape.
pub(super) async fn error_shape(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status().as_u16() < 400 {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 16).await else {
        return (parts.status, "").into_response();
    };
    let detail = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("error").cloned());
    let Some(detail) = detail else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let code = detail.get("code").and_then(Value::as_str);
    let message = detail
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("error")
        .to_string();
    let (status, kind) = render::error_kind(parts.status.as_u16(), code);
    parts.status = StatusCode::from_u16(status).unwrap_or(parts.status);
    let body = serde_json::to_vec(&render::error_body(kind, message)).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}
