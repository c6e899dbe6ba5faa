//! The Responses API over WebSocket (`GET /v1/responses` with an upgrade), as
//! `client.responses.connect()` speaks it: the client sends `response.create` messages (flat, or
//! nested under `response`), the server sends the same events as the SSE stream, one JSON object
//! per text frame. Turns run one after another; a message that arrives during a turn waits for
//! it. The connection remembers its last response, so `previous_response_id` continues it even
//! with `store: false`. `generate: false` warms up: the response is created and completed with no
//! output. A bad message gets an error event, never a close; the connection is closed after
//! `server.websocket_max_duration`. A socket that goes away cancels the running turn.

use std::collections::VecDeque;
use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use super::AppState;
use super::responses::{Turn, begin};
use crate::error::ApiError;
use crate::observability::metrics;
use crate::observability::requests::RequestRecord;
use crate::openai::responses::{ResponseUsage, ResponsesRequest};
use crate::pipeline::run::{self, GenEvent};
use crate::responses::render::{self, EventRenderer};
use crate::responses::stored::StoredResponse;
use crate::tenancy::Caller;

/// Messages kept while a turn runs; more are refused with an error event.
const MAX_WAITING: usize = 16;

/// The socket went away.
struct Closed;

/// Handles the upgrade.
pub async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let permit = std::sync::Arc::clone(&state.websockets)
        .try_acquire_owned()
        .ok();
    upgrade
        .protocols(["realtime"])
        .on_upgrade(move |socket| session(socket, state, caller, permit))
}

/// The error event clients expect: `{"type": "error", "status", "error": {...}}`.
pub fn error_event(e: &ApiError) -> Value {
    json!({"type": "error", "status": e.status().as_u16(), "error": e.detail()})
}

async fn send(socket: &mut WebSocket, event: &Value) -> Result<(), Closed> {
    socket
        .send(Message::Text(event.to_string().into()))
        .await
        .map_err(|_| Closed)
}

/// What one received frame is.
enum Frame {
    Text(String),
    Skip,
    Gone,
}

fn frame(received: Option<Result<Message, axum::Error>>) -> Frame {
    match received {
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => Frame::Gone,
        Some(Ok(Message::Text(text))) => Frame::Text(text.to_string()),
        Some(Ok(Message::Binary(bytes))) => {
            Frame::Text(String::from_utf8_lossy(&bytes).into_owned())
        }
        Some(Ok(Message::Ping(_) | Message::Pong(_))) => Frame::Skip,
    }
}

async fn session(
    mut socket: WebSocket,
    state: AppState,
    caller: Caller,
    permit: Option<OwnedSemaphorePermit>,
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
    let mut last: Option<StoredResponse> = None;
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
        if handle(&mut socket, &state, &caller, &text, &mut last, &mut waiting)
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// The request a `response.create` message carries, and whether to generate.
fn request_of(text: &str) -> Result<(ResponsesRequest, bool), ApiError> {
    let message: Value =
        serde_json::from_str(text).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let kind = message.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "response.create" {
        return Err(ApiError::invalid(
            "type",
            format!("unknown message type '{kind}'; send 'response.create'"),
        ));
    }
    let mut body = match message.get("response") {
        Some(Value::Object(nested)) => nested.clone(),
        _ => message.as_object().cloned().unwrap_or_default(),
    };
    let generate = match body
        .remove("generate")
        .or_else(|| message.get("generate").cloned())
    {
        None => true,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(ApiError::invalid(
                "generate",
                "'generate' must be a boolean",
            ));
        }
    };
    for envelope in ["type", "stream", "stream_id", "event_id"] {
        body.remove(envelope);
    }
    if body.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::unsupported(
            "background",
            "background responses are not available over WebSocket",
        ));
    }
    let request = serde_json::from_value(Value::Object(body))
        .map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    Ok((request, generate))
}

/// One message: runs its turn, or answers with an error event.
async fn handle(
    socket: &mut WebSocket,
    state: &AppState,
    caller: &Caller,
    text: &str,
    last: &mut Option<StoredResponse>,
    waiting: &mut VecDeque<String>,
) -> Result<(), Closed> {
    let started = Instant::now();
    let (mut req, generate) = match request_of(text) {
        Ok(parsed) => parsed,
        Err(e) => return send(socket, &error_event(&e)).await,
    };
    req.stream = Some(true);
    if !generate {
        // Warm-up: the model must exist and the caller may use it; nothing runs.
        let check = state
            .model(&req.model)
            .and_then(|model| state.tenancy.check_model(caller, &model, &req.model));
        if let Err(e) = check {
            return send(socket, &error_event(&e)).await;
        }
        return warm_up(socket, &req, last).await;
    }
    let turn = match begin(state, caller, &req, started, last.as_ref()).await {
        Ok(turn) => turn,
        Err(e) => return send(socket, &error_event(&e)).await,
    };
    run_turn(socket, state, turn, &req, started, last, waiting).await
}

async fn warm_up(
    socket: &mut WebSocket,
    req: &ResponsesRequest,
    last: &mut Option<StoredResponse>,
) -> Result<(), Closed> {
    let id = crate::ids::new_id("resp_");
    let echo = crate::responses::translate::echo(req, &[], req.store.unwrap_or(true), 0);
    let base = render::in_progress(&id, super::unix_now(), &req.model, &echo);
    let mut renderer = EventRenderer::new(base.clone(), None);
    for event in renderer.opening_events() {
        send(socket, &event).await?;
    }
    let done = render::finish(
        base,
        Vec::new(),
        None,
        ResponseUsage::default(),
        super::unix_now(),
    );
    send(
        socket,
        &json!({"type": "response.completed", "sequence_number": 2, "response": done}),
    )
    .await?;
    *last = Some(StoredResponse {
        response: done,
        input_items: Vec::new(),
    });
    Ok(())
}

async fn run_turn(
    socket: &mut WebSocket,
    state: &AppState,
    turn: Turn,
    req: &ResponsesRequest,
    started: Instant,
    last: &mut Option<StoredResponse>,
    waiting: &mut VecDeque<String>,
) -> Result<(), Closed> {
    let record = RequestRecord::new(
        turn.id.clone(),
        "responses",
        turn.model_id.clone(),
        req.user.clone(),
        true,
        started,
    );
    let mut stream = match run::start(turn.job) {
        Ok(stream) => stream,
        Err(e) => {
            record.failed(&e);
            return send(socket, &error_event(&e)).await;
        }
    };
    let mut renderer = EventRenderer::new(turn.base, None);
    for event in renderer.opening_events() {
        send(socket, &event).await?;
    }
    let deadline = started + state.server.request_timeout;
    loop {
        tokio::select! {
            event = tokio::time::timeout_at(deadline.into(), stream.next()) => {
                let event = match event {
                    Ok(event) => event,
                    Err(_) => Some(GenEvent::Error(ApiError::Timeout(state.server.request_timeout))),
                };
                match event {
                    None => break,
                    Some(GenEvent::Error(e)) => {
                        e.log();
                        record.failed(&e);
                        for event in renderer.failure_events(&e.detail()) {
                            send(socket, &event).await?;
                        }
                        return Ok(());
                    }
                    Some(event) => {
                        let usage = match &event { GenEvent::Usage(t) => Some(*t), _ => None };
                        for out in renderer.events(&event) {
                            send(socket, &out).await?;
                        }
                        if let Some(t) = usage {
                            record.ended(t.prompt, t.completion);
                            break;
                        }
                    }
                }
            }
            received = socket.recv() => match frame(received) {
                // Dropping the stream on return cancels the engine's work.
                Frame::Gone => return Err(Closed),
                Frame::Skip => {}
                Frame::Text(text) if waiting.len() < MAX_WAITING => waiting.push_back(text),
                Frame::Text(_) => {
                    let e = ApiError::invalid("type", format!("at most {MAX_WAITING} messages may wait for a running response"));
                    send(socket, &error_event(&e)).await?;
                }
            },
        }
    }
    let stored = StoredResponse {
        response: renderer.response().clone(),
        input_items: turn.items,
    };
    if turn.keep
        && let Err(e) = state.responses.save(&turn.tenant, &stored).await
    {
        e.log();
    }
    *last = Some(stored);
    Ok(())
}
