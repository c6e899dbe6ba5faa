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
//! Records live in the [`Store`] for the configured time; the in-process [`hub::Hub`] carries
//! the live stream to joiners on the same replica. A joiner on another replica waits for the
//! record and replays it. Requests with `store: false` are deduplicated the same way; their
//! content is kept no longer than the record's time to live.

pub mod hub;
pub mod record;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use crate::error::ApiError;
use crate::observability::metrics;
use crate::store::{Begin, Store};
use crate::tenancy::limits::FailureMode;
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

fn conflict(code: &'static str, message: &str) -> Response {
    ApiError::Idempotency {
        code,
        message: message.to_string(),
    }
    .into_response()
}

/// What a listener reads, as a response (marked when it is not the original request's).
async fn respond(listener: hub::Listener, replay: bool) -> Response {
    match listener.into_response().await {
        Some((status, headers, body)) if replay => replayed(status, headers, body),
        Some((status, headers, body)) => {
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        None => ApiError::Internal {
            detail: "an idempotent request ended before its response".into(),
        }
        .into_response(),
    }
}

fn replayed(
    status: axum::http::StatusCode,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
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
        let key = match record::key(request.headers()) {
            None => return next.run(request).await,
            Some(Err(e)) => return e.into_response(),
            Some(Ok(key)) => key,
        };
        let (parts, body) = request.into_parts();
        let body = match axum::body::to_bytes(body, body_limit).await {
            Ok(bytes) => bytes,
            Err(_) => return ApiError::PayloadTooLarge { limit: body_limit }.into_response(),
        };
        let fingerprint = record::fingerprint(parts.method.as_str(), parts.uri.path(), &body);
        let work = move || next.run(Request::from_parts(parts, Body::from(body)));
        self.guard(tenant, &key, &fingerprint, deadline, work).await
    }

    /// Runs `work` for `tenant` under idempotency `key`, whose request has `fingerprint`: the
    /// first time it runs; a repeat replays, joins or conflicts. `deadline` bounds a wait for
    /// another replica. HTTP requests come through [`Idempotency::run`]; WebSocket turns call
    /// this with their message's key, and read the response as the HTTP request would.
    pub async fn guard<F, Fut>(
        self: &Arc<Self>,
        tenant: &str,
        key: &str,
        fingerprint: &str,
        deadline: Instant,
        work: F,
    ) -> Response
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Response>,
    {
        let scoped = format!(
            "tp:{{{tenant}}}:idem:{}",
            record::sha256_hex(key.as_bytes())
        );
        let owner = crate::ids::new_id("own-");
        loop {
            match self
                .store
                .begin(&scoped, fingerprint, &owner, self.settings.lease)
                .await
            {
                Ok(Begin::Started) => break,
                Ok(Begin::Done(bytes)) => {
                    metrics::idempotency("replayed");
                    return replay(&bytes);
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
                        metrics::idempotency("joined");
                        return respond(listener, true).await;
                    }
                    // Running elsewhere (another replica), or too large to join: wait for it.
                    if Instant::now() >= deadline {
                        return conflict(
                            "idempotency_request_in_progress",
                            "A request with this Idempotency-Key is still running. Retry after it finishes.",
                        );
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
        let hub = Hub::new(self.settings.max_record_bytes);
        self.hubs().insert(scoped.clone(), Arc::clone(&hub));
        let Some(listener) = hub.listen() else {
            return ApiError::Internal {
                detail: "a new idempotency hub refused its first listener".into(),
            }
            .into_response();
        };
        // Should this future be dropped while the work runs (the client went away before the
        // head), the hub and the record are let go, so joiners and retries do not wait on them.
        let mut pending = Pending {
            this: Arc::clone(self),
            scoped: scoped.clone(),
            owner: owner.clone(),
            hub: Some(Arc::clone(&hub)),
        };
        let response = work().await;
        pending.hub = None;
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let store = Arc::clone(&this.store);
            let (key, who, lease) = (scoped.clone(), owner.clone(), this.settings.lease);
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
            this.settle(&scoped, &owner, status, headers, ended).await;
            this.forget_hub(&scoped, &hub);
        });
        respond(listener, false).await
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
    ) {
        let result = match ended {
            Ended::Completed { failed, chunks }
                if !failed && !matches!(status.as_u16(), 408 | 409 | 429) =>
            {
                let record = Recorded {
                    status: status.as_u16(),
                    headers,
                    chunks,
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

/// An idempotent request whose work has not answered yet; see [`Idempotency::guard`].
struct Pending {
    this: Arc<Idempotency>,
    scoped: String,
    owner: String,
    /// Set while the work runs.
    hub: Option<Arc<Hub>>,
}

impl Drop for Pending {
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

/// A stored response, sent again.
fn replay(bytes: &[u8]) -> Response {
    let Ok(recorded) = serde_json::from_slice::<Recorded>(bytes) else {
        return ApiError::Internal {
            detail: "an idempotency record cannot be read".into(),
        }
        .into_response();
    };
    let Some(chunks) = recorded.chunks.clone() else {
        return conflict(
            "idempotency_response_unavailable",
            "The request with this Idempotency-Key finished, but its response was too large to keep for replay.",
        );
    };
    let (status, headers) = recorded.head();
    let body = Body::from_stream(futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(c))),
    ));
    replayed(status, headers, body)
}
