//! What the WebSocket endpoints share: the connection's bounds (a permit per connection, a time
//! limit), turns taken one at a time with later messages waiting (bounded), error events that
//! never close the socket, and pumping a generation into frames while watching the socket, so a
//! client that goes away cancels the engine's work (the stream is dropped).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use super::AppState;
use crate::error::ApiError;
use crate::observability::metrics;
use crate::pipeline::run::{GenEvent, GenStream};

/// Accepts a WebSocket route's upgrade and runs its connection with `turns` (offering
/// `protocols`, if any). A plain `GET` (no upgrade) is the 405 it was before the route took
/// WebSockets; a connection past the limit gets an error event (see [`session`]).
pub fn accept<T: Turns + 'static>(
    state: AppState,
    uri: &Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    protocols: &'static [&'static str],
    turns: T,
) -> Response {
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
    let permit = std::sync::Arc::clone(&state.websockets)
        .try_acquire_owned()
        .ok();
    upgrade
        .protocols(protocols.iter().copied())
        .on_upgrade(move |socket| async move { session(socket, &state, permit, turns).await })
}

/// Messages kept while a turn runs; more are refused with an error event.
pub const MAX_WAITING: usize = 16;

/// The socket went away.
#[derive(Debug)]
pub struct Closed;

/// The error event clients expect: `{"type": "error", "status", "error": {...}}`.
pub fn error_event(e: &ApiError) -> Value {
    json!({"type": "error", "status": e.status().as_u16(), "error": e.detail()})
}

/// Sends one text frame.
pub async fn send_text(socket: &mut WebSocket, text: String) -> Result<(), Closed> {
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|_| Closed)
}

/// Sends one JSON object as a text frame.
pub async fn send(socket: &mut WebSocket, event: &Value) -> Result<(), Closed> {
    send_text(socket, event.to_string()).await
}

/// What one received frame is.
#[derive(Debug)]
pub enum Frame {
    /// A message (text, or binary read as UTF-8).
    Text(String),
    /// A ping or pong.
    Skip,
    /// The socket closed or failed.
    Gone,
}

/// Classifies what `socket.recv()` returned.
pub fn frame(received: Option<Result<Message, axum::Error>>) -> Frame {
    match received {
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => Frame::Gone,
        Some(Ok(Message::Text(text))) => Frame::Text(text.to_string()),
        Some(Ok(Message::Binary(bytes))) => {
            Frame::Text(String::from_utf8_lossy(&bytes).into_owned())
        }
        Some(Ok(Message::Ping(_) | Message::Pong(_))) => Frame::Skip,
    }
}

/// An endpoint's turns: what one message makes happen on the socket.
pub trait Turns: Send {
    /// Handles one message; messages arriving meanwhile go to `waiting`.
    fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut VecDeque<String>,
    ) -> impl std::future::Future<Output = Result<(), Closed>> + Send;
}

/// Runs a connection: refuses it past the connection limit (no `permit`), then takes its
/// messages one at a time until it closes or its time is up.
pub async fn session(
    mut socket: WebSocket,
    state: &AppState,
    permit: Option<OwnedSemaphorePermit>,
    mut turns: impl Turns,
) {
    let Some(_permit) = permit else {
        let e = ApiError::Forbidden {
            param: None,
            code: "websocket_connection_limit_reached",
            message: format!(
                "This gateway holds at most {} WebSocket connections; close one and retry.",
                state.server.websocket_max_connections
            ),
        };
        let mut event = error_event(&e);
        event["status"] = json!(429);
        let _ = send(&mut socket, &event).await;
        let _ = socket.send(Message::Close(None)).await;
        return;
    };
    let _open = metrics::WebSocketGuard::open();
    let deadline = Instant::now() + state.server.websocket_max_duration;
    let mut waiting: VecDeque<String> = VecDeque::new();
    loop {
        let text = match waiting.pop_front() {
            Some(text) => text,
            None => match tokio::time::timeout_at(deadline.into(), socket.recv()).await {
                Err(_) => {
                    let expired = json!({"type": "error", "status": 408, "error": {
                        "type": "invalid_request_error", "code": "websocket_connection_expired", "param": null,
                        "message": "This WebSocket connection reached its time limit; open a new one."}});
                    let _ = send(&mut socket, &expired).await;
                    break;
                }
                Ok(received) => match frame(received) {
                    Frame::Text(text) => text,
                    Frame::Skip => continue,
                    Frame::Gone => return,
                },
            },
        };
        if turns.handle(&mut socket, text, &mut waiting).await.is_err() {
            return;
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// How a pumped generation ended.
#[derive(Debug)]
pub enum Pumped {
    /// Its last event (the usage) was sent, or the stream ended.
    Ended,
    /// The engine failed (or the turn ran out of time) after the head.
    Failed(ApiError),
}

/// Sends a generation's frames as `render` makes them from each event, until its usage, while
/// keeping messages that arrive (at most [`MAX_WAITING`]). Returns `Closed` when the socket
/// goes away: the caller returns and drops the stream, which cancels the engine's work.
pub async fn pump(
    socket: &mut WebSocket,
    stream: &mut GenStream,
    deadline: Instant,
    limit: Duration,
    waiting: &mut VecDeque<String>,
    mut render: impl FnMut(&GenEvent) -> Vec<String>,
) -> Result<Pumped, Closed> {
    loop {
        tokio::select! {
            event = tokio::time::timeout_at(deadline.into(), stream.next()) => {
                let event = event.unwrap_or(Some(GenEvent::Error(ApiError::Timeout(limit))));
                match event {
                    None => return Ok(Pumped::Ended),
                    Some(GenEvent::Error(e)) => return Ok(Pumped::Failed(e)),
                    Some(event) => {
                        for text in render(&event) {
                            send_text(socket, text).await?;
                        }
                        if matches!(event, GenEvent::Usage(_)) {
                            return Ok(Pumped::Ended);
                        }
                    }
                }
            }
            received = socket.recv() => match frame(received) {
                Frame::Gone => return Err(Closed),
                Frame::Skip => {}
                Frame::Text(text) if waiting.len() < MAX_WAITING => waiting.push_back(text),
                Frame::Text(_) => {
                    let e = ApiError::invalid(
                        "type",
                        format!("at most {MAX_WAITING} messages may wait for a running turn"),
                    );
                    send(socket, &error_event(&e)).await?;
                }
            },
        }
    }
}
