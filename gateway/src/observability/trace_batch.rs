//! The span queue between the request path and the OTLP exporter. A finished span is pushed
//! under a mutex (no wake-up, no system call); a task on the server's runtime drains the queue
//! every schedule delay, or as soon as a whole batch is waiting, and exports it in batches. The
//! SDK's own batch processor wakes its export thread for every span, which on a busy gateway
//! cost more than the spans themselves.
//!
//! The queue is bounded: a span that finds it full is dropped and counted
//! (`turnpike_trace_spans_dropped_total`), never waited for. Sizes follow the OpenTelemetry
//! variables `OTEL_BSP_SCHEDULE_DELAY` (ms, default 5000), `OTEL_BSP_MAX_QUEUE_SIZE` (default
//! 8192) and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (default 512).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Queue sizes and the export period.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    delay: Duration,
    max_queue: usize,
    max_batch: usize,
}

impl Sizes {
    /// From the OpenTelemetry variables, else the defaults.
    pub(super) fn from_env() -> Self {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        let max_queue = var("OTEL_BSP_MAX_QUEUE_SIZE", 8192) as usize;
        Self {
            delay: Duration::from_millis(var("OTEL_BSP_SCHEDULE_DELAY", 5000)),
            max_queue,
            max_batch: (var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) as usize).min(max_queue),
        }
    }
}

/// Finished spans waiting for export.
#[derive(Debug)]
pub(super) struct Queue {
    spans: Mutex<Vec<SpanData>>,
    full_batch: tokio::sync::Notify,
    sizes: Sizes,
}

impl Queue {
    pub(super) fn new(sizes: Sizes) -> Arc<Self> {
        Arc::new(Self {
            spans: Mutex::new(Vec::new()),
            full_batch: tokio::sync::Notify::new(),
            sizes,
        })
    }

    /// Queues a finished span, or drops it when the queue is full.
    pub(super) fn push(&self, span: SpanData) {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() >= self.sizes.max_queue {
            drop(spans);
            metrics::counter!("turnpike_trace_spans_dropped_total").increment(1);
            return;
        }
        spans.push(span);
        if spans.len() == self.sizes.max_batch {
            self.full_batch.notify_one();
        }
    }

    fn take(&self) -> Vec<SpanData> {
        let spans = std::mem::take(&mut *self.spans.lock().unwrap_or_else(PoisonError::into_inner));
        metrics::counter!("turnpike_trace_spans_exported_total").increment(spans.len() as u64);
        spans
    }

    /// Exports what is queued now, in batches.
    pub(super) async fn export_all<E: SpanExporter>(&self, exporter: &E) {
        let mut spans = self.take();
        while !spans.is_empty() {
            let rest = spans.split_off(spans.len().min(self.sizes.max_batch));
            if let Err(e) = exporter.export(spans).await {
                metrics::counter!("turnpike_trace_export_errors_total").increment(1);
                tracing::debug!(error = %e, "a trace export failed");
            }
            spans = rest;
        }
    }

    /// Drains the queue into `exporter` until the task is aborted.
    pub(super) async fn run<E: SpanExporter>(self: Arc<Self>, exporter: Arc<E>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.sizes.delay) => {}
                () = self.full_batch.notified() => {}
            }
            self.export_all(exporter.as_ref()).await;
        }
    }
}
