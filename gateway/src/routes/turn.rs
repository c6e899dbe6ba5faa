//! A WebSocket turn's answer: the same typed [`Reply`] its HTTP request gets, sent as messages
//! one for one ([`messages`]): each event's JSON, a failure after the start as the protocol's own
//! events or an error event with the failure's status. So a turn meets the same validation,
//! tenant limits and deadlines as HTTP. An `idempotency_key` in a message goes through the same
//! idempotency service as an `Idempotency-Key` header (a repeated turn replays, joins or
//! conflicts like a repeated POST): what it records is the turn's messages, as numbered
//! server-sent events, so a replay sends what the first run sent and a message with the key and
//! `resume_after` (the index of the last message read) gets the ones after it. [`forward`]
//! sends a turn while it watches the socket, so a client that goes away cancels the engine's
//! work (a keyed turn's after its resume window).

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use futures_util::{FutureExt, SinkExt, StreamExt};
use serde_json::{Value, json};

use super::AppState;
use super::websocket::{Closed, Frame, Waiting, error_event, frame, send, too_big};
use crate::error::ApiError;
use crate::idempotency::record;
use crate::idempotency::resume::EventIds;
use crate::protocols::Reply;
use crate::protocols::render::Out;
use crate::tenancy::Caller;

/// A turn's messages, as they come.
pub(super) type Messages = std::pin::Pin<Box<dyn Stream<Item = String> + Send>>;

/// What a turn answers with.
pub(super) enum Answer {
    /// Refused before it started: one error event.
    Refused(ApiError),
    /// Its messages.
    Messages(Messages),
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(e) => f.debug_tuple("Refused").field(e).finish(),
            Self::Messages(_) => f.write_str("Messages"),
        }
    }
}

/// A protocol's reply as a turn's messages: each event's JSON, `[DONE]` at the end only when
/// `done_frame`, a failure as the protocol's own events or an error event with its status.
pub(super) fn messages(reply: Reply, done_frame: bool) -> Messages {
    match reply {
        Reply::Json { body, .. } => {
            let text = String::from_utf8_lossy(&body).into_owned();
            Box::pin(futures_util::stream::iter([text]))
        }
        Reply::Events { events, .. } => {
            Box::pin(events.flat_map(move |out| futures_util::stream::iter(texts(out, done_frame))))
        }
        // Background responses are refused on a socket; a log has no typed events.
        Reply::Log { .. } => {
            let e = ApiError::unsupported(
                "background",
                "background responses are not available over WebSocket",
            );
            Box::pin(futures_util::stream::iter([error_event(&e).to_string()]))
        }
    }
}

/// The messages one item of a stream makes.
fn texts(out: Out, done_frame: bool) -> Vec<String> {
    let text = |json: &[u8]| String::from_utf8_lossy(json).into_owned();
    let done = || done_frame.then(|| "[DONE]".to_string());
    match out {
        Out::Chunk(chunk) => vec![text(chunk.json())],
        Out::KeepAlive => Vec::new(),
        Out::Done => done().into_iter().collect(),
        Out::Failed {
            chunks: Some(chunks),
            ..
        } => chunks
            .iter()
            .map(|c| text(c.json()))
            .chain(done())
            .collect(),
        Out::Failed {
            status,
            error,
            chunks: None,
        } => vec![json!({"type": "error", "status": status.as_u16(), "error": error}).to_string()],
    }
}

/// A WebSocket turn as its idempotency record knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn<'a> {
    /// The endpoint the turn stands for (`/v1/responses`).
    pub(super) path: &'a str,
    /// The request the key is bound to.
    pub(super) body: &'a Value,
    /// When the turn times out.
    pub(super) deadline: Instant,
    /// Whether the turn's messages end with chat's `[DONE]` frame.
    pub(super) done_frame: bool,
    /// The index of the last message a client read before it lost its socket: the turn
    /// resumes after it (with the turn's key; see [`crate::idempotency::resume`]).
    pub(super) resume_after: Option<u64>,
}

/// Runs a turn's `work` (the protocol call), under the idempotency key `key` when the message
/// carried one and the gateway keeps keys. Without a key the messages go out as the protocol
/// makes them; with one they are recorded as a stream of server-sent events (`data:` the
/// message, numbered as an HTTP stream's events are), which a replay or a resume sends again.
pub(super) async fn guarded<F, Fut>(
    state: &AppState,
    caller: &Caller,
    turn: Turn<'_>,
    key: Option<String>,
    work: F,
) -> Answer
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Reply, ApiError>> + Send + 'static,
{
    let Turn {
        path,
        body,
        deadline,
        done_frame,
        resume_after,
    } = turn;
    if resume_after.is_some() && key.is_none() {
        return Answer::Refused(ApiError::invalid(
            "resume_after",
            "'resume_after' resumes a turn sent with an 'idempotency_key': send the turn's key with it",
        ));
    }
    if resume_after.is_some() && state.tenancy.idempotency.is_none() {
        return Answer::Refused(super::admission::resume_off());
    }
    let (Some(key), Some(idempotency)) = (key, &state.tenancy.idempotency) else {
        return match work().await {
            Ok(reply) => Answer::Messages(messages(reply, done_frame)),
            Err(e) => Answer::Refused(e),
        };
    };
    let fingerprint = record::fingerprint("WEBSOCKET", path, body.to_string().as_bytes());
    let tenant = &caller.principal.tenant.name;
    let recorded = move || {
        let ran = work();
        async move {
            match ran.await {
                Ok(reply) => {
                    let mut ids = EventIds::default();
                    let frames = messages(reply, done_frame).map(move |text| {
                        let frame = Bytes::from(format!("data: {text}\n\n"));
                        Ok::<_, std::convert::Infallible>(ids.tag(frame))
                    });
                    let mut response = Body::from_stream(frames).into_response();
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/event-stream"),
                    );
                    response
                }
                Err(e) => e.into_response(),
            }
        }
    };
    let response = idempotency
        .guard(tenant, &key, &fingerprint, deadline, resume_after, recorded)
        .await;
    replayed(response).await
}

/// Largest error body read from a refused turn.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The turn an idempotency record answers with: its error, or its messages (the `data:` of
/// each event).
async fn replayed(response: Response) -> Answer {
    let status = response.status();
    if !status.is_success() {
        let body = axum::body::to_bytes(response.into_body(), MAX_ERROR_BODY)
            .await
            .unwrap_or_default();
        let error = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|mut v| v.get_mut("error").map(Value::take))
            .unwrap_or_else(|| json!({"type": "server_error", "message": "the turn failed", "param": null, "code": null}));
        let event = json!({"type": "error", "status": status.as_u16(), "error": error});
        return Answer::Messages(Box::pin(futures_util::stream::iter([event.to_string()])));
    }
    let lines = futures_util::stream::unfold(
        (
            response.into_body().into_data_stream(),
            Vec::<u8>::new(),
            false,
        ),
        |(mut body, mut buffer, mut ended)| async move {
            loop {
                if let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = buffer.drain(..end + 2).collect();
                    let data = event
                        .split(|&b| b == b'\n')
                        .find_map(|line| line.strip_prefix(b"data: "));
                    if let Some(data) = data {
                        let text = String::from_utf8_lossy(data).into_owned();
                        return Some((text, (body, buffer, ended)));
                    }
                    continue;
                }
                if ended {
                    // A record written before turns were numbered: one message per line.
                    let end = buffer.iter().position(|&b| b == b'\n')?;
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&line[..end]).into_owned();
                    return Some((text, (body, buffer, ended)));
                }
                match body.next().await {
                    Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
                    Some(Err(_)) => {
                        let e = ApiError::Internal {
                            detail: "a turn's stream failed".into(),
                        };
                        ended = true;
                        buffer.clear();
                        return Some((error_event(&e).to_string(), (body, buffer, ended)));
                    }
                    None => ended = true,
                }
            }
        },
    );
    Answer::Messages(Box::pin(lines))
}

/// Sends a turn's answer over the socket: a refusal as one error event, else its messages.
/// Messages that arrive meanwhile are kept (at most [`MAX_WAITING`]). Returns the last message
/// sent (not `[DONE]`), or `Closed` when the socket goes away: dropping the messages then
/// cancels the turn's work.
pub(super) async fn forward(
    socket: &mut WebSocket,
    answer: Answer,
    waiting: &mut Waiting,
) -> Result<Option<String>, Closed> {
    let mut messages = match answer {
        Answer::Refused(e) => {
            send(socket, &error_event(&e)).await?;
            return Ok(None);
        }
        Answer::Messages(messages) => messages,
    };
    let mut last = None;
    loop {
        tokio::select! {
            message = messages.next() => {
                let mut next = Some(message);
                // What the turn has ready is taken without waiting and sent with one flush.
                let ended = loop {
                    match next.take() {
                        Some(Some(text)) => {
                            if text != "[DONE]" {
                                last = Some(text.clone());
                            }
                            socket.feed(Message::Text(text.into())).await.map_err(|_| Closed)?;
                        }
                        Some(None) => break true,
                        None => break false,
                    }
                    next = messages.next().now_or_never();
                };
                socket.flush().await.map_err(|_| Closed)?;
                if ended {
                    return Ok(last);
                }
            }
            received = socket.recv() => match frame(received) {
                Frame::Gone => return Err(Closed),
                Frame::TooBig => {
                    too_big(socket, waiting.max_bytes).await;
                    return Err(Closed);
                }
                Frame::Skip => {}
                Frame::Text(text) => {
                    if let Err(e) = waiting.push(text) {
                        send(socket, &error_event(&e)).await?;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::openai::error::ErrorDetail;
    use crate::protocols::render::Chunk;

    fn detail() -> ErrorDetail {
        ApiError::Timeout(std::time::Duration::from_secs(1)).detail()
    }

    #[test]
    fn each_item_of_a_stream_is_its_own_message() {
        let chunk = Chunk::data(&json!({"n": 1}));
        assert_eq!(texts(Out::Chunk(chunk.clone()), true), vec![r#"{"n":1}"#]);
        assert!(texts(Out::KeepAlive, true).is_empty());
        assert_eq!(texts(Out::Done, true), vec!["[DONE]"]);
        assert!(texts(Out::Done, false).is_empty());
        let failed = |chunks| Out::Failed {
            status: StatusCode::GATEWAY_TIMEOUT,
            error: detail(),
            chunks,
        };
        let event: Value = serde_json::from_str(&texts(failed(None), true)[0]).unwrap_or_default();
        assert_eq!(
            (event["type"].as_str(), event["status"].as_u64()),
            (Some("error"), Some(504))
        );
        assert_eq!(event["error"]["code"], "timeout");
        // A protocol's own failure events go as they are, then the end where the protocol
        // sends one.
        let own = texts(failed(Some(vec![chunk.clone()])), false);
        assert_eq!(own, vec![r#"{"n":1}"#]);
        let own = texts(failed(Some(vec![chunk])), true);
        assert_eq!(own, vec![r#"{"n":1}"#, "[DONE]"]);
    }

    #[tokio::test]
    async fn a_recorded_turn_replays_event_by_event_across_chunks() {
        let parts = [
            "id: 0\ndata: {\"a\":1}\n\nid: 1\ndata: {\"b\"",
            ":2}\n\n: keep-alive\n\nid: 2\ndata: [DONE]\n\n",
        ];
        let body = Body::from_stream(futures_util::stream::iter(
            parts.map(|p| Ok::<_, std::convert::Infallible>(p.to_string())),
        ));
        let Answer::Messages(messages) = replayed(body.into_response()).await else {
            panic!("a recorded turn is messages");
        };
        let all: Vec<String> = messages.collect().await;
        assert_eq!(all, vec![r#"{"a":1}"#, r#"{"b":2}"#, "[DONE]"]);
        // A record of the older format, a message per line, still replays.
        let legacy = Body::from("{\"a\":1}\n[DONE]\n".to_string());
        let Answer::Messages(messages) = replayed(legacy.into_response()).await else {
            panic!("a recorded turn is messages");
        };
        let all: Vec<String> = messages.collect().await;
        assert_eq!(all, vec![r#"{"a":1}"#, "[DONE]"]);
        let refused = replayed(ApiError::ModelNotFound("m".into()).into_response()).await;
        let Answer::Messages(messages) = refused else {
            panic!("a recorded refusal is one error event");
        };
        let all: Vec<String> = messages.collect().await;
        let event: Value = serde_json::from_str(&all[0]).unwrap_or_default();
        assert_eq!(event["status"], 404);
        assert_eq!(event["error"]["code"], "model_not_found");
    }
}
