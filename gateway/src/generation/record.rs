//! Accounting of one generation request, once, when it ends: token counters and one structured
//! log line (id, endpoint, model, the client's `user`, streamed or not, tokens, duration). A
//! request whose client went away before it ended is logged as abandoned when its record drops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::ApiError;
use crate::observability::metrics;

/// A request being served.
#[derive(Debug)]
pub(crate) struct RequestRecord {
    /// The response id (`chatcmpl-...`), also sent as `x-request-id`.
    pub id: String,
    /// `chat`, `completions` or `embeddings`.
    pub endpoint: &'static str,
    /// The model id.
    pub model: String,
    /// The client's `user` field (opaque).
    pub user: Option<String>,
    /// Whether the response is streamed.
    pub stream: bool,
    /// When it arrived.
    pub started: Instant,
    /// Accounted already.
    settled: AtomicBool,
}

impl RequestRecord {
    /// A record of a request that arrived at `started`.
    pub(crate) fn new(
        id: String,
        endpoint: &'static str,
        model: String,
        user: Option<String>,
        stream: bool,
        started: Instant,
    ) -> Self {
        Self {
            id,
            endpoint,
            model,
            user,
            stream,
            started,
            settled: AtomicBool::new(false),
        }
    }

    /// The request ended with these token counts.
    pub(crate) fn ended(&self, prompt_tokens: u64, completion_tokens: u64) {
        self.settled.store(true, Ordering::Relaxed);
        metrics::tokens(&self.model, prompt_tokens, completion_tokens);
        tracing::info!(
            target: "turnpike::request",
            id = %self.id,
            endpoint = self.endpoint,
            model = %self.model,
            user = self.user.as_deref().unwrap_or(""),
            stream = self.stream,
            prompt_tokens,
            completion_tokens,
            ms = self.started.elapsed().as_secs_f64() * 1e3,
            "request finished"
        );
    }

    /// The request failed after it was accepted.
    pub(crate) fn failed(&self, error: &ApiError) {
        self.settled.store(true, Ordering::Relaxed);
        tracing::info!(
            target: "turnpike::request",
            id = %self.id,
            endpoint = self.endpoint,
            model = %self.model,
            user = self.user.as_deref().unwrap_or(""),
            stream = self.stream,
            status = error.status().as_u16(),
            code = error.detail().code.unwrap_or(""),
            ms = self.started.elapsed().as_secs_f64() * 1e3,
            "request failed"
        );
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if self.settled.load(Ordering::Relaxed) {
            return;
        }
        // The client went away first; the engine work was cancelled with the response.
        tracing::info!(
            target: "turnpike::request",
            id = %self.id,
            endpoint = self.endpoint,
            model = %self.model,
            user = self.user.as_deref().unwrap_or(""),
            stream = self.stream,
            ms = self.started.elapsed().as_secs_f64() * 1e3,
            "request abandoned by the client"
        );
    }
}
