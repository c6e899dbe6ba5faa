//! Accounting of one generation request, once, when it ends: token counters and one structured
//! log line (id, endpoint, model, the client's `user`, streamed or not, tokens, duration). A
//! request whose client went away before it ended is logged as abandoned when its record drops.

use std::sync::OnceLock;
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
    /// The model's request metrics, found once for the request.
    model_metrics: std::sync::Arc<metrics::ModelMetrics>,
    /// The client's `user` field (opaque).
    pub user: Option<String>,
    /// Whether the response is streamed.
    pub stream: bool,
    /// When it arrived.
    pub started: Instant,
    /// The caller's correlation id (`X-Request-Trace`).
    correlation: Option<std::sync::Arc<str>>,
    /// The trace the request belongs to, when traces are exported.
    trace_id: Option<String>,
    /// When the first text or tool call was ready.
    first_output: OnceLock<Instant>,
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
            model_metrics: metrics::model_metrics(&model),
            model,
            user,
            stream,
            started,
            correlation: None,
            trace_id: crate::observability::traces::trace_id(&tracing::Span::current()),
            first_output: OnceLock::new(),
            settled: AtomicBool::new(false),
        }
    }

    /// The same record, with the caller's correlation id.
    pub(crate) fn correlated(mut self, id: Option<std::sync::Arc<str>>) -> Self {
        self.correlation = id;
        self
    }

    /// The first text or tool call was ready at `at` (the first call counts): the time to first
    /// token.
    pub(crate) fn first_output(&self, at: Instant) {
        if self.first_output.set(at).is_ok() {
            self.model_metrics
                .first_token(at.saturating_duration_since(self.started));
        }
    }

    /// The request ended with these token counts: the tokens, and the time per output token
    /// after the first.
    pub(crate) fn ended(&self, prompt_tokens: u64, completion_tokens: u64) {
        self.settled.store(true, Ordering::Relaxed);
        self.model_metrics.tokens(prompt_tokens, completion_tokens);
        if let Some(first) = self.first_output.get()
            && completion_tokens > 1
        {
            let decoding = first.elapsed().as_secs_f64();
            self.model_metrics
                .per_output_token(decoding / (completion_tokens - 1) as f64);
        }
        tracing::info!(
            target: "turnpike::request",
            id = %self.id,
            endpoint = self.endpoint,
            model = %self.model,
            user = %crate::observability::client_text(self.user.as_deref().unwrap_or("")),
            stream = self.stream,
            correlation_id = self.correlation.as_deref().unwrap_or(""),
            trace_id = self.trace_id.as_deref().unwrap_or(""),
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
            user = %crate::observability::client_text(self.user.as_deref().unwrap_or("")),
            stream = self.stream,
            correlation_id = self.correlation.as_deref().unwrap_or(""),
            trace_id = self.trace_id.as_deref().unwrap_or(""),
            status = error.status().as_u16(),
            code = error.metric_code(),
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
            user = %crate::observability::client_text(self.user.as_deref().unwrap_or("")),
            stream = self.stream,
            correlation_id = self.correlation.as_deref().unwrap_or(""),
            trace_id = self.trace_id.as_deref().unwrap_or(""),
            ms = self.started.elapsed().as_secs_f64() * 1e3,
            "request abandoned by the client"
        );
    }
}
