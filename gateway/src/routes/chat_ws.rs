//! Chat completions over WebSocket (`GET /v1/chat/completions` with an upgrade): each text
//! message is a chat completion request (the POST body), answered with the same
//! `chat.completion.chunk` objects the SSE stream carries, one per frame, then a `[DONE]` frame.
//! Requests run one after another on a connection; errors are error events
//! (`{"type": "error", "status", "error"}`) and never close the socket. A socket that goes away
//! cancels the running request.

use std::collections::VecDeque;
use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::Response;

use super::chat::{ChunkRenderer, Prepared, prepare};
use super::sse::{Render, payload};
use super::websocket::{Closed, Pumped, Turns, accept, error_event, pump, send, send_text};
use super::{AppState, new_id};
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::chat::ChatCompletionRequest;
use crate::openai::error::ErrorBody;
use crate::pipeline::run::{self, GenEvent};
use crate::tenancy::Caller;

/// Handles the upgrade.
pub async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let turns = ChatTurns {
        state: state.clone(),
        caller,
    };
    accept(state, &uri, upgrade, &[], turns)
}

struct ChatTurns {
    state: AppState,
    caller: Caller,
}

impl Turns for ChatTurns {
    async fn handle(
        &mut self,
        socket: &mut WebSocket,
        text: String,
        waiting: &mut VecDeque<String>,
    ) -> Result<(), Closed> {
        let started = Instant::now();
        let mut req: ChatCompletionRequest = match serde_json::from_str(&text) {
            Ok(req) => req,
            Err(e) => {
                return send(socket, &error_event(&ApiError::InvalidJson(e.to_string()))).await;
            }
        };
        req.stream = Some(true);
        let id = new_id("chatcmpl-");
        let Prepared {
            job,
            n,
            logprobs,
            model,
        } = match prepare(&self.state, &self.caller, &req, &id, started).await {
            Ok(prepared) => prepared,
            Err(e) => return send(socket, &error_event(&e)).await,
        };
        let record = RequestRecord::new(
            id.clone(),
            "chat",
            model.id.clone(),
            req.user.clone(),
            true,
            started,
        );
        let mut stream = match run::start(job) {
            Ok(stream) => stream,
            Err(e) => {
                record.failed(&e);
                return send(socket, &error_event(&e)).await;
            }
        };
        let mut renderer = ChunkRenderer::new(id, &req, &model, n, logprobs.is_some());
        for chunk in renderer.opening() {
            if let Some(json) = payload(&chunk) {
                send_text(socket, json).await?;
            }
        }
        let server = &self.state.server;
        let deadline = started + server.request_timeout;
        let pumped = pump(
            socket,
            &mut stream,
            deadline,
            server.request_timeout,
            waiting,
            |event| {
                if let GenEvent::Usage(t) = event {
                    record.ended(t.prompt, t.completion);
                }
                renderer.event(event).iter().filter_map(payload).collect()
            },
        )
        .await?;
        if let Pumped::Failed(e) = pumped {
            e.log();
            record.failed(&e);
            let body = serde_json::to_value(ErrorBody { error: e.detail() }).unwrap_or_default();
            let mut event = error_event(&e);
            event["error"] = body["error"].clone();
            return send(socket, &event).await;
        }
        send_text(socket, "[DONE]".into()).await
    }
}
