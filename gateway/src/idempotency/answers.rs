//! What the idempotency service answers with besides the work's own response: a replay of a
//! stored record, a listener's view of a live run, and the refusals (conflicts, nothing to
//! resume).

use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use super::hub;
use super::record::Recorded;
use super::resume;
use crate::error::ApiError;

pub(super) fn conflict(code: &'static str, message: &str) -> Response {
    ApiError::Idempotency {
        code,
        message: message.to_string(),
    }
    .into_response()
}

/// What a listener reads, as a response (marked when it is not the original request's; after
/// event `resume` when it resumes a stream), or `None` when the work was dropped before its
/// head (every listener had left).
pub(super) async fn respond(
    listener: hub::Listener,
    replay: bool,
    resume: Option<u64>,
) -> Option<Response> {
    let (status, headers, body) = listener.into_response().await?;
    let body = match resume {
        Some(_) if !resume::is_stream(status, &headers) => return Some(resume::not_a_stream()),
        Some(last) => resume::body_after(body, last),
        None => body,
    };
    if replay {
        return Some(replayed(status, headers, body));
    }
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Some(response)
}

/// Answered when a key is let go (its work dropped) and taken again, over and over, until the
/// caller's deadline: a retryable 409, never a 500.
pub(super) fn still_running() -> Response {
    conflict(
        "idempotency_request_in_progress",
        "A request with this Idempotency-Key is still running. Retry after it finishes.",
    )
}

fn replayed(
    status: axum::http::StatusCode,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// Answered to a resume whose key has no stream: never sent, or its record is gone.
pub(super) fn resume_unknown(ttl: Duration) -> Response {
    ApiError::NotFound {
        param: Some("Idempotency-Key".into()),
        code: "stream_not_found",
        message: format!(
            "No stream with this Idempotency-Key is running or kept: ended streams are kept for {} s, and a stream every client left goes on only for the resume window.",
            ttl.as_secs()
        ),
    }
    .into_response()
}

/// A stored response, sent again (after event `resume` when it resumes a stream).
pub(super) fn replay(bytes: &[u8], resume: Option<u64>) -> Response {
    let Ok(recorded) = serde_json::from_slice::<Recorded>(bytes) else {
        return ApiError::Internal {
            detail: "an idempotency record cannot be read".into(),
        }
        .into_response();
    };
    let Some(chunks) = recorded.chunks.clone() else {
        if recorded.unstored {
            return conflict(
                "idempotency_response_not_stored",
                "The request with this Idempotency-Key finished, but it set `store: false`, so its response was not kept. Send it again with a new Idempotency-Key to run it again.",
            );
        }
        return conflict(
            "idempotency_response_unavailable",
            "The request with this Idempotency-Key finished, but its response was too large to keep for replay.",
        );
    };
    let (status, headers) = recorded.head();
    let chunks: Vec<axum::body::Bytes> = match resume {
        None => chunks.into_iter().map(axum::body::Bytes::from).collect(),
        Some(_) if !resume::is_stream(status, &headers) => return resume::not_a_stream(),
        Some(last) => match resume::chunks_after(&chunks, last) {
            Some(chunks) => chunks,
            None => {
                return ApiError::NotFound {
                    param: Some("Last-Event-ID".into()),
                    code: "event_not_found",
                    message: format!(
                        "The stream with this Idempotency-Key has no event {last}: it ended before."
                    ),
                }
                .into_response();
            }
        },
    };
    let body = Body::from_stream(futures_util::stream::iter(
        chunks.into_iter().map(Ok::<_, std::convert::Infallible>),
    ));
    replayed(status, headers, body)
}
