//! `Idempotency-Key`: POST retries that are safe.
//!
//! A key is scoped to the caller's tenant and stored with a fingerprint of the request. The
//! first request with a key runs; a repeat after it finished replays the stored response
//! (status, headers, body, and for a stream every event) with `idempotent-replayed: true`; a
//! repeat while it runs joins it and reads the same stream (or gets 409 when joining is off);
//! the same key with another request is 409 `idempotency_key_reused`. Replays and joins never
//! reach the engine, so tokens are charged once. A request that fails (5xx, 429, a stream that
//! ends in an error) or whose every listener left is forgotten, so its retry runs anew.
//!
//! The work runs in a task of its own, not in the first client's request: a first client that
//! goes away does not end it while a joiner still listens (it is billed once, by the one run).
//! Once no listener is left, before or after the response's head, the work is dropped, which
//! cancels the engine's part. A joiner that was let go with it (it joined just as the last
//! listener left) goes round again: by then the key is free, so it runs the request itself.
//! Joiners on other replicas cannot be seen from here: they wait for the record, and when the
//! work was dropped they find the key free and run it anew, never a 500.
//!
//! Records live in the [`Store`] for the configured time; the in-process [`hub::Hub`] carries
//! the live stream to joiners on the same replica. A joiner on another replica waits for the
//! record and replays it.
//!
//! A stream whose every listener left is not dropped at once: it goes on for the resume
//! window, so its client can reconnect with `Last-Event-ID` and read the events after that one
//! ([`resume`]), live on this replica or from the record once the stream has ended.
//!
//! Requests with `"store": false` are deduplicated the same way while they run (a joiner on
//! this replica reads the live stream, held in memory only), but their response is never
//! written to the store: the finished record keeps the request's fingerprint hash, the status
//! and the response headers, and a repeat gets 409 `idempotency_response_not_stored` rather
//! than a second run.

mod answers;
pub(crate) mod hub;
pub(crate) mod record;
pub(crate) mod resume;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::Instrument;

use crate::error::ApiError;
use crate::observability::metrics;
use crate::store::FailureMode;
use crate::store::{Begin, Store};
use answers::{conflict, replay, respond, resume_unknown, still_running};
use hub::{Ended, Hub};
use record::Recorded;

/// Idempotency settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencySettings {
    /// How long a finished record is kept.
    pub ttl: Duration,
    /// Whether a repeat of a running request joins it (else 409).
    pub join: bool,
    /// Largest response kept for replay.
    pub max_record_bytes: usize,
    /// How long a running record is held without renewal (a replica that died lets go).
    pub lease: Duration,
    /// How long a stream whose every client left goes on, for one to resume it (zero: it is
    /// dropped at once).
    pub resume_window: Duration,
}

/// The idempotency service.
#[derive(Debug)]
pub struct Idempotency {
    store: Arc<dyn Store>,
    settings: IdempotencySettings,
    mode: FailureMode,
    retry_after: Duration,
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
}

impl Idempotency {
    /// The service on `store`.
    pub fn new(
        store: Arc<dyn Store>,
        settings: IdempotencySettings,
        mode: FailureMode,
        retry_after: Duration,
    ) -> Self {
        Self {
            store,
            settings,
            mode,
            retry_after,
            hubs: Mutex::default(),
        }
    }

    fn hubs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.hubs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs a POST for `tenant` under its idempotency key, if it has one. `body_limit` bounds
    /// the body read to fingerprint it; `deadline` bounds a wait for another replica.
    pub async fn run(
        self: &Arc<Self>,
        tenant: &str,
        request: Request,
        next: Next,
        body_limit: usize,
        deadline: Instant,
    ) -> Response {
        let resume = match resume::last_event_id(request.headers()).transpose() {
            Ok(resume) => resume,
            Err(e) => return e.into_response(),
        };
        let key = match record::key(request.headers()) {
            None if resume.is_some() => {
                return ApiError::InvalidHeader {
                    header: "Last-Event-ID",
                    message: "Last-Event-ID resumes a stream sent with an Idempotency-Key: send the key of the stream with it.".into(),
                }
                .into_response();
            }
            None => return next.run(request).await,
            Some(Err(e)) => return e.into_response(),
            Some(Ok(key)) => key,
        };
        let (parts, body) = request.into_parts();
        let body = match crate::body::read(body, body_limit).await {
            Ok(bytes) => bytes,
            Err(e) => return e.into_response(),
        };
        let fingerprint = record::fingerprint(parts.method.as_str(), parts.uri.path(), &body);
        let work = move || next.run(Request::from_parts(parts, Body::from(body)));
        self.guard(tenant, &key, &fingerprint, deadline, resume, work)
            .await
    }

    /// Runs `work` for `tenant` under idempotency `key`, whose request has `fingerprint`: the
    /// first time it runs; a repeat replays, joins or conflicts. `deadline` bounds a wait for
    /// another replica; `resume` (a `Last-Event-ID`) asks for the events of the key's stream
    /// after that one, and never starts the work. HTTP requests come through
    /// [`Idempotency::run`]; WebSocket turns call this with their message's key, and read the
    /// response as the HTTP request would.
    pub(crate) async fn guard<F, Fut>(
        self: &Arc<Self>,
        tenant: &str,
        key: &str,
        fingerprint: &record::Fingerprint,
        deadline: Instant,
        resume: Option<u64>,
        work: F,
    ) -> Response
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Response> + Send + 'static,
    {
        let scoped = format!(
            "tp:{{{tenant}}}:idem:{}",
            record::sha256_hex(key.as_bytes())
        );
        let owner = crate::ids::new_id("own-");
        loop {
            let begin_span =
                tracing::info_span!(target: crate::observability::traces::TARGET, "idempotency");
            match self
                .store
                .begin(&scoped, &fingerprint.hash, &owner, self.settings.lease)
                .instrument(begin_span)
                .await
            {
                Ok(Begin::Started) if resume.is_some() => {
                    // Nothing to resume: let the key go again, untouched.
                    if let Err(e) = self.store.abandon(&scoped, &owner).await {
                        tracing::warn!(error = %e, "cannot let go of an idempotency record");
                    }
                    metrics::idempotency("resume_unknown");
                    return resume_unknown(self.settings.ttl);
                }
                Ok(Begin::Started) => break,
                Ok(Begin::Done(bytes)) => {
                    metrics::idempotency(if resume.is_some() {
                        "resumed"
                    } else {
                        "replayed"
                    });
                    return replay(&bytes, resume);
                }
                Ok(Begin::Conflict) => {
                    metrics::idempotency("conflict");
                    return conflict(
                        "idempotency_key_reused",
                        "This Idempotency-Key was already used with a different request. Use a new key for a new request.",
                    );
                }
                Ok(Begin::Running) => {
                    if !self.settings.join {
                        metrics::idempotency("in_progress");
                        return conflict(
                            "idempotency_request_in_progress",
                            "A request with this Idempotency-Key is still running. Retry after it finishes.",
                        );
                    }
                    let hub = self.hubs().get(&scoped).cloned();
                    if let Some(listener) = hub.and_then(|h| h.listen()) {
                        metrics::idempotency(if resume.is_some() {
                            "resumed"
                        } else {
                            "joined"
                        });
                        if let Some(response) = respond(listener, true, resume).await {
                            return response;
                        }
                        // The work was dropped as this joiner came: the key is being let go.
                        continue;
                    }
                    // Running elsewhere (another replica), or too large to join: wait for it.
                    if Instant::now() >= deadline {
                        return still_running();
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    metrics::state_error("idempotency");
                    tracing::warn!(error = %e, "idempotency store failed");
                    return match self.mode {
                        FailureMode::Open => work().await,
                        FailureMode::Closed => ApiError::StateUnavailable {
                            detail: e.to_string(),
                            retry_after: self.retry_after,
                        }
                        .into_response(),
                    };
                }
            }
        }
        metrics::idempotency("started");
        let hub = Hub::new(self.settings.max_record_bytes, self.settings.resume_window);
        self.hubs().insert(scoped.clone(), Arc::clone(&hub));
        let Some(listener) = hub.listen() else {
            return ApiError::Internal {
                detail: "a new idempotency hub refused its first listener".into(),
            }
            .into_response();
        };
        // The work runs on its own, for as long as anyone listens; this request is one listener.
        let this = Arc::clone(self);
        let keep_content = fingerprint.keep_content;
        // The work stays in the request's trace.
        tokio::spawn(
            this.drive(scoped, owner, hub, keep_content, work())
                .in_current_span(),
        );
        respond(listener, false, None)
            .await
            .unwrap_or_else(still_running)
    }

    /// Runs one key's `work` and pumps its response to the hub's listeners, then stores or
    /// forgets it. Should every listener leave before the response's head, the work is
    /// dropped (cancelling the engine's part) and the key let go.
    async fn drive(
        self: Arc<Self>,
        scoped: String,
        owner: String,
        hub: Arc<Hub>,
        keep_content: bool,
        work: impl std::future::Future<Output = Response> + Send + 'static,
    ) {
        // Should the work panic, the guard lets the hub and the record go, so the listeners
        // end (and retry) instead of waiting for a head that never comes.
        let mut guard = LetGo {
            this: Arc::clone(&self),
            scoped: scoped.clone(),
            owner: owner.clone(),
            hub: Some(Arc::clone(&hub)),
        };
        let response = tokio::select! {
            response = work => response,
            () = hub.deserted() => return,
        };
        guard.hub = None;
        let store = Arc::clone(&self.store);
        let (key, who, lease) = (scoped.clone(), owner.clone(), self.settings.lease);
        let keep = move || {
            let (store, key, who) = (Arc::clone(&store), key.clone(), who.clone());
            async move {
                if let Err(e) = store.keep(&key, &who, lease).await {
                    tracing::warn!(error = %e, "cannot extend an idempotency record");
                }
            }
            .boxed()
        };
        let status = response.status();
        let headers = Recorded::keep_headers(response.headers());
        let ended = hub.pump(response, lease / 3, keep).await;
        self.settle(&scoped, &owner, status, headers, ended, keep_content)
            .await;
        self.forget_hub(&scoped, &hub);
    }

    /// Drops `scoped`'s live hub if it is still `hub` (a newer run of the key keeps its own).
    fn forget_hub(&self, scoped: &str, hub: &Arc<Hub>) {
        let mut hubs = self.hubs();
        if hubs.get(scoped).is_some_and(|h| Arc::ptr_eq(h, hub)) {
            hubs.remove(scoped);
        }
    }

    /// Stores or forgets a finished request.
    async fn settle(
        &self,
        scoped: &str,
        owner: &str,
        status: axum::http::StatusCode,
        headers: Vec<(String, String)>,
        ended: Ended,
        keep_content: bool,
    ) {
        let result = match ended {
            Ended::Completed { failed, chunks }
                if !failed && !matches!(status.as_u16(), 408 | 409 | 429) =>
            {
                let record = Recorded {
                    status: status.as_u16(),
                    headers,
                    chunks: chunks.filter(|_| keep_content),
                    unstored: !keep_content,
                };
                match serde_json::to_vec(&record) {
                    Ok(bytes) => {
                        self.store
                            .finish(scoped, owner, bytes, self.settings.ttl)
                            .await
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot encode an idempotency record");
                        self.store.abandon(scoped, owner).await
                    }
                }
            }
            _ => self.store.abandon(scoped, owner).await,
        };
        if let Err(e) = result {
            // The record lapses with its lease.
            metrics::state_error("idempotency");
            tracing::warn!(error = %e, "cannot settle an idempotency record");
        }
    }
}

/// Lets a key's hub and record go when its driver ends without settling (the work was
/// dropped because every listener left, or it panicked).
struct LetGo {
    this: Arc<Idempotency>,
    scoped: String,
    owner: String,
    /// Set until the work answered.
    hub: Option<Arc<Hub>>,
}

impl Drop for LetGo {
    fn drop(&mut self) {
        let Some(hub) = self.hub.take() else { return };
        self.this.forget_hub(&self.scoped, &hub);
        drop(hub);
        let (this, scoped, owner) = (
            Arc::clone(&self.this),
            std::mem::take(&mut self.scoped),
            std::mem::take(&mut self.owner),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = this.store.abandon(&scoped, &owner).await {
                    tracing::warn!(error = %e, "cannot let go of an idempotency record");
                }
            });
        }
    }
}
