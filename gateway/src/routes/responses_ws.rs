//! The Responses API over WebSocket (`GET /v1/responses` with an upgrade), as
//! `client.responses.connect()` speaks it: the client sends `response.create` messages (flat, or
//! nested under `response`), the server sends the same events as the SSE stream, one JSON object
//! per text frame. Turns run one after another; a message that arrives during a turn waits for
//! it. The connection remembers its last response, so `previous_response_id` continues it even
//! with `store: false`. `generate: false` warms up: the response is created and completed with no
//! output. A bad message gets an error event, never a close; the connection is closed after
//! `server.websocket_max_duration`. A socket that goes away cancels the running turn. A message
//! may carry an `idempotency_key`, which works as the `Idempotency-Key` header does on HTTP (its
//! turn then outlives the socket for the resume window, and `resume_after` picks it up on a new
//! one).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::Response;
use serde_json::{Value, json};

use super::AppState;
use super::turn::{Turn, forward, guarded};
use super::websocket::{
    Closed, Turns, Waiting, accept, error_event, send, send_text, take_key, take_resume,
};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::openai::responses::{ResponseUsage, ResponsesRequest};
use crate::protocols::responses::api::{conversation, respond};
use crate::protocols::responses::render::{self, EventRenderer};
use crate::protocols::responses::stored::StoredResponse;
use crate::protocols::responses::translate::in_progress;
use crate::tenancy::Caller;

/// Handles the upgrade.
pub(super) async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let turns = ResponseTurns {
        state: state.clone(),
        caller,
        last: None,
    };
    accept(state, &uri, &headers, upgrade, &["realtime"], turns)
}

/// A connection's turns and the response it remembers.
struct ResponseTurns {
    state: AppState,
    caller: Caller,
    last: Option<Arc<StoredResponse>>,
}

impl Turns for ResponseTurns {
    fn caller(&self) -> &Caller {
        &self.caller
    }

    async fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut Waiting,
    ) -> Result<(), Closed> {
        handle(
            socket,
            &self.state,
            &self.caller,
            &text,
            &mut self.last,
            waiting,
        )
        .await
    }
}

/// What a `response.create` message asks for.
struct Create {
    /// The request (the message without its envelope).
    request: ResponsesRequest,
    /// The request as sent, which an idempotency key is bound to.
    body: Value,
    /// Whether to generate (`generate: false` warms up).
    generate: bool,
    /// The message's `idempotency_key`.
    key: Option<String>,
    /// The message's `resume_after`.
    resume_after: Option<u64>,
}

/// Reads a `response.create` message (flat, or nested under `response`).
fn request_of(text: &str) -> Result<Create, ApiError> {
    let mut message: Value =
        serde_json::from_str(text).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let kind = message.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "response.create" {
        return Err(ApiError::invalid(
            "type",
            format!("unknown message type '{kind}'; send 'response.create'"),
        ));
    }
    let envelope = message
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let (mut key, mut resume_after) = (None, None);
    let mut body = envelope.clone();
    if let Some(Value::Object(nested)) = envelope.get("response") {
        key = take_key(&mut body)?;
        resume_after = take_resume(&mut body)?;
        body = nested.clone();
    }
    key = take_key(&mut body)?.or(key);
    resume_after = take_resume(&mut body)?.or(resume_after);
    let generate = match body
        .remove("generate")
        .or_else(|| envelope.get("generate").cloned())
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
    for field in ["type", "stream", "stream_id", "event_id"] {
        body.remove(field);
    }
    if body.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::unsupported(
            "background",
            "background responses are not available over WebSocket",
        ));
    }
    let body = Value::Object(body);
    let request =
        serde_json::from_value(body.clone()).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    Ok(Create {
        request,
        body,
        generate,
        key,
        resume_after,
    })
}

/// One message: runs its turn (as `POST /v1/responses` with `stream: true` would, under its
/// idempotency key if it has one), or answers with an error event.
async fn handle(
    socket: &mut WebSocket,
    state: &AppState,
    caller: &Caller,
    text: &str,
    last: &mut Option<Arc<StoredResponse>>,
    waiting: &mut Waiting,
) -> Result<(), Closed> {
    let started = Instant::now();
    let Create {
        request: mut req,
        body,
        generate,
        key,
        resume_after,
    } = match request_of(text) {
        Ok(create) => create,
        Err(e) => return send(socket, &error_event(&e)).await,
    };
    req.stream = Some(true);
    if !generate {
        // Warm-up: the model must exist and the caller may use it; nothing runs.
        if let Err(e) = state.generator.model_for(caller, &req.model) {
            return send(socket, &error_event(&e)).await;
        }
        return warm_up(socket, &req, last).await;
    }
    // The turn's work may outlive this socket (a joiner with the same key still listens), so
    // it shares what it reads (the request and the conversation so far, without copying them)
    // and hands its conversation back through `ran`.
    let req = Arc::new(req);
    let ran: Arc<Mutex<Option<Vec<Value>>>> = Arc::default();
    let (slot, request, previous) = (Arc::clone(&ran), Arc::clone(&req), last.clone());
    let (owned_state, owned_caller) = (state.clone(), caller.clone());
    let work = move || async move {
        let call = owned_state.call(&owned_caller, started);
        let (reply, items) =
            respond(call, &owned_state.responses, &request, previous.as_deref()).await?;
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(items);
        Ok(reply)
    };
    let deadline = started + state.server.request_timeout;
    let turn = Turn {
        path: "/v1/responses",
        body: &body,
        deadline,
        done_frame: false,
        resume_after,
    };
    let answer = guarded(state, caller, turn, key, work).await;
    let final_event = forward(socket, answer, waiting).await?;
    // The connection remembers the response the turn made, for `previous_response_id`.
    let finished: Option<_> = final_event
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .filter(|e| {
            matches!(
                e.get("type").and_then(Value::as_str),
                Some("response.completed" | "response.incomplete")
            )
        })
        .and_then(|mut e| serde_json::from_value(e["response"].take()).ok());
    if finished.is_none() {
        // A continuation that failed evicts the response it continued, as OpenAI's WebSocket
        // mode does: continuing it again is `previous_response_not_found` (unless stored).
        if let Some(previous) = &req.previous_response_id
            && last.as_ref().is_some_and(|l| &l.response.id == previous)
        {
            *last = None;
        }
        return Ok(());
    }
    if let Some(response) = finished {
        let ran = ran.lock().unwrap_or_else(PoisonError::into_inner).take();
        let input_items = match ran {
            Some(items) => items,
            // A replayed turn: its conversation, as it ran.
            None => conversation(
                &state.responses.store,
                &caller.principal.tenant.name,
                &req,
                last.as_deref(),
            )
            .await
            .unwrap_or_default(),
        };
        *last = Some(Arc::new(StoredResponse {
            response,
            input_items,
        }));
    }
    Ok(())
}

async fn warm_up(
    socket: &mut WebSocket,
    req: &ResponsesRequest,
    last: &mut Option<Arc<StoredResponse>>,
) -> Result<(), Closed> {
    let id = crate::ids::new_id("resp_");
    let store = req.store.unwrap_or(true);
    let base = in_progress(req, &id, unix_now(), &[], store, 0);
    let mut renderer = EventRenderer::new(base.clone(), None);
    for chunk in renderer.opening_events() {
        send_text(socket, String::from_utf8_lossy(chunk.json()).into_owned()).await?;
    }
    let done = render::finish(base, Vec::new(), None, ResponseUsage::default(), unix_now());
    send(
        socket,
        &json!({"type": "response.completed", "sequence_number": 2, "response": done}),
    )
    .await?;
    *last = Some(Arc::new(StoredResponse {
        response: done,
        input_items: Vec::new(),
    }));
    Ok(())
}
