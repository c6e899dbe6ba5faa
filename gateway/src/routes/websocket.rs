//! What the WebSocket endpoints share: the connection's bounds (a slot per connection, within
//! the replica's and the tenant's caps; a time limit; an idle limit while no turn runs), turns
//! taken one at a time with later messages waiting (bounded), error events that never close the
//! socket.
//!
//! Messages and frames are bounded by `server.max_body_bytes`, as HTTP bodies are (a larger
//! message closes the socket with 1009 "message too big"), and the messages waiting for a
//! running turn by count ([`MAX_WAITING`]) and in all by the same byte limit. An upgrade that
//! carries an `Origin` the CORS allow-list does not name is refused (403), as the browser would
//! refuse a cross-origin HTTP call: browsers do not apply CORS to WebSockets.
//!
//! What one turn answers with, and how it reaches the socket, is in [`super::turn`].

use std::collections::VecDeque;
use std::time::Instant;

use axum::extract::ws::{CloseFrame, close_code};
use axum::http::HeaderMap;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::websocket_slots::{NoSlot, Slot};
use crate::error::ApiError;
use crate::idempotency::record;
use crate::observability::metrics;
use crate::tenancy::Caller;
use crate::tenancy::limits::LimitReport;

/// Accepts a WebSocket route's upgrade and runs its connection with `turns` (offering
/// `protocols`, if any). A plain `GET` (no upgrade) is the 405 it was before the route took
/// WebSockets; a connection past the limit gets an error event (see [`session`]).
pub(super) fn accept<T: Turns + 'static>(
    state: AppState,
    uri: &Uri,
    headers: &HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    protocols: &'static [&'static str],
    turns: T,
) -> Response {
    if let Err(e) = super::cors::check_websocket_origin(headers, &state.server.cors) {
        return e.into_response();
    }
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(_) => {
            return ApiError::MethodNotAllowed {
                method: "GET".into(),
                path: uri.path().to_string(),
            }
            .into_response();
        }
    };
    let slot = state.websockets.take(&turns.caller().principal.tenant);
    let limit = state.server.max_body_bytes;
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .protocols(protocols.iter().copied())
        .on_upgrade(move |socket| async move { session(socket, &state, slot, turns).await })
}

/// Messages kept while a turn runs; more are refused with an error event.
pub(super) const MAX_WAITING: usize = 16;

/// The messages that arrived while a turn ran, at most [`MAX_WAITING`] of them and `max_bytes`
/// in all.
#[derive(Debug)]
pub(super) struct Waiting {
    queue: VecDeque<String>,
    bytes: usize,
    pub(super) max_bytes: usize,
}

impl Waiting {
    /// An empty queue holding at most `max_bytes` of messages.
    pub(super) fn new(max_bytes: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// The oldest message.
    pub(super) fn pop(&mut self) -> Option<String> {
        let text = self.queue.pop_front()?;
        self.bytes -= text.len();
        Some(text)
    }

    /// Keeps `text`, or says why it cannot.
    pub(super) fn push(&mut self, text: String) -> Result<(), ApiError> {
        if self.queue.len() >= MAX_WAITING || self.bytes + text.len() > self.max_bytes {
            return Err(ApiError::invalid(
                "type",
                format!(
                    "at most {MAX_WAITING} messages, {} bytes in all, may wait for a running turn",
                    self.max_bytes
                ),
            ));
        }
        self.bytes += text.len();
        self.queue.push_back(text);
        Ok(())
    }
}

/// The socket went away.
#[derive(Debug)]
pub(super) struct Closed;

/// The error event clients expect: `{"type": "error", "status", "error": {...}}`.
pub(super) fn error_event(e: &ApiError) -> Value {
    json!({"type": "error", "status": e.status().as_u16(), "error": e.detail()})
}

/// Sends one text frame.
pub(super) async fn send_text(socket: &mut WebSocket, text: String) -> Result<(), Closed> {
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|_| Closed)
}

/// Sends one JSON object as a text frame.
pub(super) async fn send(socket: &mut WebSocket, event: &Value) -> Result<(), Closed> {
    send_text(socket, event.to_string()).await
}

/// What one received frame is.
#[derive(Debug)]
pub(super) enum Frame {
    /// A message (text, or binary read as UTF-8).
    Text(String),
    /// A ping or pong.
    Skip,
    /// A message larger than the limit: the socket is closed with 1009.
    TooBig,
    /// The socket closed or failed.
    Gone,
}

/// Classifies what `socket.recv()` returned.
pub(super) fn frame(received: Option<Result<Message, axum::Error>>) -> Frame {
    match received {
        // The library's capacity error (its only way of saying so) for a message or frame
        // past `max_message_size` / `max_frame_size`.
        Some(Err(e)) if e.to_string().contains("Space limit exceeded") => Frame::TooBig,
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => Frame::Gone,
        Some(Ok(Message::Text(text))) => Frame::Text(text.to_string()),
        Some(Ok(Message::Binary(bytes))) => {
            Frame::Text(String::from_utf8_lossy(&bytes).into_owned())
        }
        Some(Ok(Message::Ping(_) | Message::Pong(_))) => Frame::Skip,
    }
}

/// An endpoint's turns: what one message makes happen on the socket.
pub(super) trait Turns: Send {
    /// Who the connection is (each message counts against its tenant's request rates).
    fn caller(&self) -> &Caller;

    /// Handles one message; messages arriving meanwhile go to `waiting`.
    fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut Waiting,
    ) -> impl std::future::Future<Output = Result<(), Closed>> + Send;
}

/// Runs a connection: refuses it past the replica's or the tenant's connection limit (no
/// `slot`), then takes its messages one at a time until it closes, its time is up, or it stays
/// idle (no turn running, no message) past `server.websocket_idle_timeout`.
pub(super) async fn session(
    mut socket: WebSocket,
    state: &AppState,
    slot: Result<Slot, NoSlot>,
    mut turns: impl Turns,
) {
    let _slot = match slot {
        Ok(slot) => slot,
        Err(no) => {
            let (code, message) = match no {
                NoSlot::Server(most) => (
                    "websocket_connection_limit_reached",
                    format!(
                        "This gateway holds at most {most} WebSocket connections; close one and retry."
                    ),
                ),
                NoSlot::Tenant(most) => (
                    "websocket_tenant_limit_reached",
                    format!(
                        "Your plan allows at most {most} open WebSocket connections; close one and retry."
                    ),
                ),
            };
            let e = ApiError::Forbidden {
                param: None,
                code,
                message,
            };
            let mut event = error_event(&e);
            event["status"] = json!(429);
            let _ = send(&mut socket, &event).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    };
    let _open = metrics::OpenGuard::websocket();
    let deadline = Instant::now() + state.server.websocket_max_duration;
    let idle = state.server.websocket_idle_timeout;
    let mut waiting = Waiting::new(state.server.max_body_bytes);
    // Pings do not move it: only a message, or the end of a turn.
    let mut idle_until = Instant::now() + idle;
    loop {
        let text = match waiting.pop() {
            Some(text) => text,
            None => {
                match tokio::time::timeout_at(deadline.min(idle_until).into(), socket.recv()).await
                {
                    Err(_) => {
                        let (code, message, reason) = if Instant::now() >= deadline {
                            (
                                "websocket_connection_expired",
                                "This WebSocket connection reached its time limit; open a new one.",
                                "expired",
                            )
                        } else {
                            (
                                "websocket_idle_timeout",
                                "This WebSocket connection was idle too long; open a new one.",
                                "idle",
                            )
                        };
                        metrics::websocket_closed(reason);
                        let event = json!({"type": "error", "status": 408, "error": {
                            "type": "invalid_request_error", "code": code, "param": null,
                            "message": message}});
                        let _ = send(&mut socket, &event).await;
                        break;
                    }
                    Ok(received) => match frame(received) {
                        Frame::Text(text) => text,
                        Frame::Skip => continue,
                        Frame::TooBig => {
                            return too_big(&mut socket, waiting.max_bytes).await;
                        }
                        Frame::Gone => return,
                    },
                }
            }
        };
        let handled = match count_turn(state, turns.caller()).await {
            Ok(()) => turns.handle(&mut socket, text, &mut waiting).await,
            Err(e) => send(&mut socket, &error_event(&e)).await,
        };
        if handled.is_err() {
            return;
        }
        idle_until = Instant::now() + idle;
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// Closes a socket whose client sent a message past `limit` bytes: an error event, then a close
/// with 1009 (message too big).
pub(super) async fn too_big(socket: &mut WebSocket, limit: usize) {
    let e = ApiError::PayloadTooLarge { limit };
    let _ = send(socket, &error_event(&e)).await;
    let close = CloseFrame {
        code: close_code::SIZE,
        reason: "message too big".into(),
    };
    let _ = socket.send(Message::Close(Some(close))).await;
}

/// Counts a turn against the tenant's request rates, as an HTTP request is counted (the
/// upgrade itself was counted as one).
async fn count_turn(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    let mut report = LimitReport::default();
    state
        .tenancy
        .limiter
        .hit(&caller.principal, &mut report)
        .await
}

/// The place a message asks its turn to resume after (`resume_after`, with the turn's
/// `idempotency_key`: the index of the last message it read, from 0), taken out of `message`.
pub(super) fn take_resume(message: &mut Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match message.remove("resume_after") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(_) => Err(ApiError::invalid(
            "resume_after",
            "'resume_after' must be the index of a message of the turn: an integer from 0",
        )),
    }
}

/// The idempotency key a message carries in its `idempotency_key` field (taken out of
/// `message`), checked.
pub(super) fn take_key(message: &mut Map<String, Value>) -> Result<Option<String>, ApiError> {
    match message.remove("idempotency_key") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(key)) => record::valid_key(key.as_bytes())
            .map(Some)
            .map_err(|message| ApiError::invalid("idempotency_key", message)),
        Some(_) => Err(ApiError::invalid(
            "idempotency_key",
            "'idempotency_key' must be a string",
        )),
    }
}
