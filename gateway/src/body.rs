//! Request bodies: a deadline for the whole body, and the one bounded read every layer uses.
//!
//! A client that sends its headers and then stalls (a `Content-Length` body that stops after a
//! few bytes, a chunked body that stops after one chunk) would otherwise hold its connection
//! and a handler forever: the request timeout starts only once a handler runs. [`with_deadline`]
//! makes the body fail once its deadline passes, so [`read`] answers 408 `request_timeout`
//! wherever the body is read (the JSON extractor, the idempotency fingerprint).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::observability::metrics;

/// The error a body past its deadline fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub(crate) struct BodyTimedOut(pub Duration);

/// Set once a request's body has been read to its end.
#[derive(Debug, Clone, Default)]
pub(crate) struct BodyEnded(Arc<AtomicBool>);

impl BodyEnded {
    /// Whether the body was read to its end. A response to a request whose body was not (a
    /// refusal before or while reading it) must close the connection: the rest of that body is
    /// still on the wire, where the next request would be read from.
    pub(crate) fn ended(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `body`, failing with [`BodyTimedOut`] unless it ends within `timeout` from now, and what
/// tells whether it was read to its end.
pub(crate) fn with_deadline(body: Body, timeout: Duration) -> (Body, BodyEnded) {
    let deadline = Instant::now() + timeout;
    let ended = BodyEnded::default();
    let flag = ended.clone();
    let frames = body.into_data_stream();
    let timed = futures_util::stream::unfold(Some(frames), move |frames| {
        let flag = flag.clone();
        async move {
            let mut frames = frames?;
            match tokio::time::timeout_at(deadline, frames.next()).await {
                Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(frames))),
                Ok(Some(Err(e))) => Some((Err(axum::BoxError::from(e)), None)),
                Ok(None) => {
                    flag.0.store(true, Ordering::Relaxed);
                    None
                }
                Err(_) => {
                    metrics::connection_closed("body_timeout");
                    Some((Err(axum::BoxError::from(BodyTimedOut(timeout))), None))
                }
            }
        }
    });
    (Body::from_stream(timed), ended)
}

/// Reads a whole body of at most `limit` bytes: 413 past the limit, 408 past its deadline.
pub(crate) async fn read(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(cause) = source {
            if let Some(timed_out) = cause.downcast_ref::<BodyTimedOut>() {
                return ApiError::BodyTimeout(timed_out.0);
            }
            if cause.to_string().contains("length limit") {
                return ApiError::PayloadTooLarge { limit };
            }
            source = cause.source();
        }
        ApiError::InvalidJson(format!("the body could not be read: {e}"))
    })
}

/// Whether a `Content-Type` value names JSON (`application/json` or `application/*+json`, with
/// any parameters).
pub(crate) fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for refused in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            "application/jsonx",
            "text/json+",
        ] {
            assert!(!is_json(refused), "{refused}");
        }
    }

    #[tokio::test]
    async fn a_stalled_body_times_out_and_a_whole_one_is_read() {
        let (whole, ended) = with_deadline(Body::from("{}"), Duration::from_secs(5));
        assert!(!ended.ended());
        assert_eq!(read(whole, 10).await, Ok(Bytes::from_static(b"{}")));
        assert!(ended.ended());
        let (too_big, ended) = with_deadline(Body::from("0123456789ab"), Duration::from_secs(5));
        assert!(matches!(
            read(too_big, 10).await,
            Err(ApiError::PayloadTooLarge { limit: 10 })
        ));
        assert!(!ended.ended());
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let _ = tx.send(Ok(Bytes::from_static(b"{\"a\""))).await;
        let stalled = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }));
        let (timed, _) = with_deadline(stalled, Duration::from_millis(50));
        assert!(matches!(
            read(timed, 1000).await,
            Err(ApiError::BodyTimeout(_))
        ));
        drop(tx);
    }
}
