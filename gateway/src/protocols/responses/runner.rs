//! Background responses (`background: true`): the request answers at once, with the response
//! `queued` (waiting for its place in the model's queue) or `in_progress`, and the generation
//! runs on a task that stores each status and the result (completed, incomplete or failed).
//! `POST /v1/responses/{id}/cancel` stops it, on any replica.
//!
//! With `stream: true` the task also writes every event to an [`EventLog`]: the creating
//! request reads it as its stream, and `GET /v1/responses/{id}?stream=true` (from the start, or
//! after `starting_after`) reads it too, so a client that lost its connection picks the stream
//! up again while the generation goes on. On another replica, or after the end, the stream is
//! read from the state store, where the running replica writes it every half second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures_util::StreamExt;

use super::api::Turn;
use super::background::Running;
use super::events::{self, EventLog, Forgotten, StoredEvents};
use super::render::EventRenderer;
use super::stored::StoredResponse;
use super::{ResponseStore, Responses};
use crate::error::ApiError;
use crate::generation::GenEvent;
use crate::generation::record::RequestRecord;
use crate::generation::{Generation, Prepared};
use crate::openai::responses::{ResponseObject, ResponseUsage};
use crate::protocols::render::Chunk;
use crate::protocols::{Call, Reply, StreamSettings};

/// How often a background response checks whether it was cancelled elsewhere, and a reader on
/// another replica whether the response ended.
const POLL: Duration = Duration::from_millis(250);

/// The generation, started or still waiting for its place (one per background response, moved
/// once: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Work {
    Started(Generation),
    Queued(Prepared),
}

/// Stores `turn`'s response `base` (`queued` or `in_progress`), answers with it (or, when `streamed`,
/// with its event stream), and runs the generation on a task.
pub(super) async fn start(
    call: Call<'_>,
    responses: &Responses,
    turn: Turn,
    base: ResponseObject,
    prepared: Prepared,
    record: RequestRecord,
    streamed: bool,
) -> Result<Reply, ApiError> {
    let queued = prepared.is_waiting();
    let prompt_tokens = prepared.prompt_tokens();
    let base = ResponseObject {
        status: if queued { "queued" } else { "in_progress" }.into(),
        // Usage so far: the prompt is known, nothing is generated yet.
        usage: Some(ResponseUsage::new(prompt_tokens, 0, 0, 0)),
        ..base
    };
    let work = if queued {
        Work::Queued(prepared)
    } else {
        // Started now, so an engine that refuses it answers this request.
        Work::Started(prepared.start().inspect_err(|e| record.failed(e))?)
    };
    let (tenant, id) = (turn.tenant, base.id.clone());
    let stored = StoredResponse {
        response: base.clone(),
        input_items: turn.items,
    };
    // The events first: a response stored without its events would say it runs, with nothing
    // behind it, should the second write fail.
    let log = streamed.then(|| Arc::new(EventLog::default()));
    if log.is_some() {
        let started = StoredEvents::default();
        responses.store.save_events(&tenant, &id, &started).await?;
    }
    responses.store.save(&tenant, &stored).await?;
    let task = Task {
        responses: responses.store.clone(),
        running: Arc::clone(&responses.running),
        tenant: tenant.clone(),
        stored,
        renderer: EventRenderer::new(base.clone(), None),
        log: log.clone(),
        record,
        limit: call.streams.request_timeout,
    };
    // The task waits until it is registered, so its end always finds itself to remove.
    let (registered, gate) = tokio::sync::oneshot::channel::<()>();
    let ending = Ending(log.clone());
    let handle = tokio::spawn(async move {
        // Ends the log however the task ends, even aborted before it first ran.
        let _ending = ending;
        let _ = gate.await;
        task.run(work).await;
    });
    responses
        .running
        .insert(&tenant, &id, handle.abort_handle(), log.clone());
    let _ = registered.send(());
    let Some(log) = log else {
        return Ok(Reply::json(Some(id), &base));
    };
    // The response goes on without its reader: a retry with the same idempotency key replays
    // this stream rather than starting a second response.
    let frames = Box::pin(log.follow(0, call.streams.heartbeat));
    Ok(Reply::Log {
        id,
        first: 0,
        frames,
    })
}

/// What a background task owns.
struct Task {
    responses: ResponseStore,
    running: Arc<Running>,
    tenant: String,
    stored: StoredResponse,
    renderer: EventRenderer,
    log: Option<Arc<EventLog>>,
    record: RequestRecord,
    limit: Duration,
}

/// Ends a log when dropped: when its task ends, or is aborted by a cancel.
struct Ending(Option<Arc<EventLog>>);

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(log) = &self.0 {
            log.end();
        }
    }
}

impl Task {
    fn emit(&self, chunks: Vec<Chunk>) {
        if let Some(log) = &self.log {
            for chunk in chunks {
                log.push(chunk.sse());
            }
        }
    }

    /// Runs the generation to its end, or until it is cancelled on another replica; stores the
    /// result unless it was cancelled.
    async fn run(mut self, work: Work) {
        let (responses, tenant) = (self.responses.clone(), self.tenant.clone());
        let id = self.stored.response.id.clone();
        let deadline = Instant::now() + self.limit;
        let flushing = flush_while_running(self.log.clone(), responses.clone(), &tenant, &id);
        let finished = tokio::select! {
            response = self.generate(work, deadline) => Some(response),
            () = watch_for_cancel(&responses, &tenant, &id) => None,
            // Never ends: it stops with the generation.
            () = flushing => None,
        };
        match finished {
            // Dropping the record unsettled logs it as abandoned by the client.
            None => drop(self.record),
            Some(response) => {
                let done = StoredResponse {
                    response,
                    input_items: std::mem::take(&mut self.stored.input_items),
                };
                // A cancel that landed while the result was being made wins.
                if !is_cancelled(&responses, &tenant, &id).await
                    && let Err(e) = responses.save(&tenant, &done).await
                {
                    e.log();
                }
            }
        }
        // The events are marked done after the response is stored, so a reader on another
        // replica that sees them done finds the response as it ended.
        if let Some(log) = &self.log {
            log.end();
            if let Err(e) = responses.save_events(&tenant, &id, &log.stored()).await {
                e.log();
            }
        }
        self.running.remove(&tenant, &id);
    }

    /// The generation, rendered (into the log when streamed): the final response.
    async fn generate(&mut self, work: Work, deadline: Instant) -> ResponseObject {
        let mut stream = match work {
            Work::Started(stream) => {
                let opening = self.renderer.opening_events();
                self.emit(opening);
                stream
            }
            Work::Queued(mut prepared) => {
                let queued = self.renderer.queued_events();
                self.emit(queued);
                let seated = prepared.seated(deadline).await;
                match seated.and_then(|()| prepared.start()) {
                    Ok(stream) => {
                        self.mark_in_progress().await;
                        let started = self.renderer.started_events();
                        self.emit(started);
                        stream
                    }
                    Err(e) => return self.fail(&e),
                }
            }
        };
        loop {
            match tokio::time::timeout_at(deadline.into(), stream.next()).await {
                Err(_) => return self.fail(&ApiError::Timeout(self.limit)),
                Ok(None) => break,
                Ok(Some(GenEvent::Error(e))) => return self.fail(&e),
                Ok(Some(event)) => {
                    if let GenEvent::Usage(t) = &event {
                        self.record.ended(t.prompt, t.completion);
                    }
                    let rendered = self.renderer.events(&event);
                    self.emit(rendered);
                    if matches!(event, GenEvent::Usage(_)) {
                        break;
                    }
                }
            }
        }
        self.renderer.response().clone()
    }

    /// Stores the response `in_progress` once it got its place (unless it was cancelled).
    async fn mark_in_progress(&mut self) {
        let now = StoredResponse {
            response: ResponseObject {
                status: "in_progress".into(),
                ..self.stored.response.clone()
            },
            input_items: self.stored.input_items.clone(),
        };
        let (responses, tenant) = (self.responses.clone(), self.tenant.clone());
        if is_cancelled(&responses, &tenant, &now.response.id).await {
            return;
        }
        if let Err(e) = responses.save(&tenant, &now).await {
            e.log();
        }
    }

    fn fail(&mut self, e: &ApiError) -> ResponseObject {
        e.log();
        self.record.failed(e);
        let failure = self.renderer.failure_events(&e.detail());
        self.emit(failure);
        self.renderer.response().clone()
    }
}

/// How often a running log is written to the state store for readers on other replicas.
const FLUSH: Duration = Duration::from_millis(500);

/// Writes `log` (if the response is streamed) to the state store every [`FLUSH`] while it grows.
async fn flush_while_running(
    log: Option<Arc<EventLog>>,
    responses: ResponseStore,
    tenant: &str,
    id: &str,
) {
    let Some(log) = log else {
        return std::future::pending().await;
    };
    let mut flushed = 0;
    loop {
        tokio::time::sleep(FLUSH).await;
        let written = log.written();
        if written != flushed {
            flushed = written;
            if let Err(e) = responses.save_events(tenant, id, &log.stored()).await {
                e.log();
            }
        }
    }
}

/// Whether `tenant`'s stored response `id` is marked cancelled.
async fn is_cancelled(responses: &ResponseStore, tenant: &str, id: &str) -> bool {
    matches!(
        responses.load(tenant, id).await,
        Ok(Some(now)) if now.response.status == "cancelled"
    )
}

/// Resolves once `tenant`'s stored response `id` is marked cancelled (by any replica).
async fn watch_for_cancel(responses: &ResponseStore, tenant: &str, id: &str) {
    loop {
        tokio::time::sleep(POLL).await;
        if is_cancelled(responses, tenant, id).await {
            return;
        }
    }
}

/// Stops `tenant`'s background response `stored` if it still runs, and stores it `cancelled`
/// (unless it ended meanwhile: then it stays as it ended).
pub(super) async fn cancel(
    responses: &Responses,
    tenant: &str,
    stored: StoredResponse,
) -> Result<StoredResponse, ApiError> {
    let id = stored.response.id.clone();
    if !is_running(&stored.response.status) {
        return Ok(stored);
    }
    // The events are settled before the status, so the replica running the response, which
    // reacts to the status, writes its full log after this.
    match responses.running.remove(tenant, &id) {
        Some((task, log)) => {
            // Dropping the task's stream cancels the engine's work.
            task.abort();
            if let Some(log) = log {
                log.end();
                responses
                    .store
                    .save_events(tenant, &id, &log.stored())
                    .await?;
            }
        }
        None => {
            if let Some(mut events) = responses.store.load_events(tenant, &id).await?
                && !events.done
            {
                events.done = true;
                responses.store.save_events(tenant, &id, &events).await?;
            }
        }
    }
    let mut now = responses.store.load(tenant, &id).await?.unwrap_or(stored);
    if is_running(&now.response.status) {
        now.response.status = "cancelled".into();
        responses.store.save(tenant, &now).await?;
    }
    Ok(now)
}

/// Stops `tenant`'s background response `id` if it runs here (it is being deleted).
pub(super) fn stop(responses: &Responses, tenant: &str, id: &str) {
    if let Some((task, log)) = responses.running.remove(tenant, id) {
        task.abort();
        if let Some(log) = log {
            log.end();
        }
    }
}

fn is_running(status: &str) -> bool {
    matches!(status, "queued" | "in_progress")
}

fn expired(forgotten: Forgotten) -> ApiError {
    ApiError::invalid(
        "starting_after",
        format!(
            "the stream keeps its events from sequence number {} on; ask for those, or retrieve the response",
            forgotten.first
        ),
    )
}

/// The stream of `tenant`'s streamed background response `stored`, from the event after
/// `starting_after` (from the start without it): followed live where it runs on this replica,
/// else followed in the state store, where the running replica writes it every half second.
pub(super) async fn resume(
    responses: &Responses,
    streams: StreamSettings,
    tenant: &str,
    stored: &StoredResponse,
    starting_after: Option<u64>,
) -> Result<Reply, ApiError> {
    let id = &stored.response.id;
    let from = starting_after.map_or(0, |n| n.saturating_add(1));
    if let Some(log) = responses.running.log(tenant, id) {
        log.check(from).map_err(expired)?;
        let frames = Box::pin(log.follow(from, streams.heartbeat));
        return Ok(Reply::Log {
            id: id.clone(),
            first: from,
            frames,
        });
    }
    let Some(events) = responses.store.load_events(tenant, id).await? else {
        return Err(ApiError::invalid(
            "stream",
            format!(
                "response '{id}' was not created with background and stream set, so it has no stream to read"
            ),
        ));
    };
    events::after(&events, from).map_err(expired)?;
    let tail = Tail {
        responses: responses.store.clone(),
        tenant: tenant.to_string(),
        id: id.clone(),
        next: from,
        deadline: Instant::now() + streams.request_timeout,
        heartbeat: streams.heartbeat,
        quiet_since: Instant::now(),
        over: false,
    };
    let frames = Box::pin(futures_util::stream::unfold(tail, Tail::next));
    Ok(Reply::Log {
        id: id.clone(),
        first: from,
        frames,
    })
}

/// A reader of a response that runs on another replica: it follows the events that replica
/// writes to the state store.
struct Tail {
    responses: ResponseStore,
    tenant: String,
    id: String,
    /// The sequence number of the next event to send.
    next: u64,
    deadline: Instant,
    heartbeat: Duration,
    /// When something was last sent.
    quiet_since: Instant,
    over: bool,
}

impl Tail {
    /// The next frames: new events, `data: [DONE]` at the end, or a heartbeat.
    async fn next(mut self) -> Option<(Bytes, Self)> {
        if self.over {
            return None;
        }
        loop {
            let events = match self.responses.load_events(&self.tenant, &self.id).await {
                Ok(Some(events)) => events,
                Ok(None) => return None,
                Err(e) => {
                    e.log();
                    return None;
                }
            };
            match events::after(&events, self.next) {
                Err(forgotten) => {
                    self.over = true;
                    return Some((events::behind(forgotten, self.next), self));
                }
                Ok(frames) if !frames.is_empty() => {
                    self.next += frames.len() as u64;
                    self.quiet_since = Instant::now();
                    return Some((frames.concat().into(), self));
                }
                Ok(_) if events.done => {
                    self.over = true;
                    return Some((Bytes::from_static(b"data: [DONE]\n\n"), self));
                }
                Ok(_) => {}
            }
            if Instant::now() >= self.deadline {
                return None;
            }
            if self.quiet_since.elapsed() >= self.heartbeat {
                self.quiet_since = Instant::now();
                return Some((Bytes::from_static(b": keep-alive\n\n"), self));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
