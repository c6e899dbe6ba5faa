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
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::Response;
use serde_json::{Value, json};

use super::AppState;
use super::responses::{Turn, begin};
use super::websocket::{Closed, Pumped, Turns, accept, error_event, pump, send};
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::responses::{ResponseUsage, ResponsesRequest};
use crate::pipeline::run::{self, GenEvent};
use crate::responses::render::{self, EventRenderer};
use crate::responses::stored::StoredResponse;
use crate::responses::translate::in_progress;
use crate::tenancy::Caller;

/// Handles the upgrade.
pub async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let turns = ResponseTurns {
        state: state.clone(),
        caller,
        last: None,
    };
    accept(state, &uri, upgrade, &["realtime"], turns)
}

/// A connection's turns and the response it remembers.
struct ResponseTurns {
    state: AppState,
    caller: Caller,
    last: Option<StoredResponse>,
}

impl Turns for ResponseTurns {
    async fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut VecDeque<String>,
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
    let store = req.store.unwrap_or(true);
    let base = in_progress(req, &id, super::unix_now(), &[], store, 0);
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
    let pumped = pump(
        socket,
        &mut stream,
        deadline,
        state.server.request_timeout,
        waiting,
        |event| {
            if let GenEvent::Usage(t) = event {
                record.ended(t.prompt, t.completion);
            }
            renderer
                .events(event)
                .iter()
                .map(Value::to_string)
                .collect()
        },
    )
    .await?;
    if let Pumped::Failed(e) = pumped {
        e.log();
        record.failed(&e);
        for event in renderer.failure_events(&e.detail()) {
            send(socket, &event).await?;
        }
        return Ok(());
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
