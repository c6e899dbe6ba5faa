//! Chat completions over WebSocket (`GET /v1/chat/completions` with an upgrade): each text
//! message is a chat completion request (the POST body), answered with the same
//! `chat.completion.chunk` objects the SSE stream carries, one per frame, then a `[DONE]` frame.
//! Requests run one after another on a connection; errors are error events
//! (`{"type": "error", "status", "error"}`) and never close the socket. A socket that goes away
//! cancels the running request. A message may carry an `idempotency_key`, which works as the
//! `Idempotency-Key` header does on HTTP (its request then outlives the socket for the resume
//! window, and `resume_after` picks it up on a new one).

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::Response;
use serde_json::Value;

use super::AppState;
use super::turn::{Turn, forward, guarded};
use super::websocket::{Closed, Turns, Waiting, accept, error_event, send, take_key, take_resume};
use crate::error::ApiError;
use crate::openai::chat::ChatCompletionRequest;
use crate::protocols::chat;
use crate::tenancy::Caller;

/// Handles the upgrade.
pub(super) async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let turns = ChatTurns {
        state: state.clone(),
        caller,
    };
    accept(state, &uri, &headers, upgrade, &[], turns)
}

struct ChatTurns {
    state: AppState,
    caller: Caller,
}

impl Turns for ChatTurns {
    fn caller(&self) -> &Caller {
        &self.caller
    }

    async fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut Waiting,
    ) -> Result<(), Closed> {
        let started = Instant::now();
        let (state, caller) = (&self.state, &self.caller);
        let (req, body, key, resume_after) = match request_of(&text) {
            Ok(parsed) => parsed,
            Err(e) => return send(socket, &error_event(&e)).await,
        };
        // The turn's work may outlive this socket (a joiner with the same key still listens).
        let (owned_state, owned_caller) = (state.clone(), caller.clone());
        let work = move || async move {
            chat::complete(owned_state.call(&owned_caller, started), &req).await
        };
        let deadline = started + state.server.request_timeout;
        let turn = Turn {
            path: "/v1/chat/completions",
            body: &body,
            deadline,
            done_frame: true,
            resume_after,
        };
        let answer = guarded(state, caller, turn, key, work).await;
        forward(socket, answer, waiting).await.map(|_| ())
    }
}

/// The request a message carries (always streamed), the body its idempotency key is bound
/// to, its `idempotency_key` and its `resume_after`.
type Parsed = (ChatCompletionRequest, Value, Option<String>, Option<u64>);

fn request_of(text: &str) -> Result<Parsed, ApiError> {
    let mut body: Value =
        serde_json::from_str(text).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let (key, resume_after) = match body.as_object_mut() {
        Some(fields) => (take_key(fields)?, take_resume(fields)?),
        None => (None, None),
    };
    let mut req: ChatCompletionRequest =
        serde_json::from_value(body.clone()).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    req.stream = Some(true);
    Ok((req, body, key, resume_after))
}
