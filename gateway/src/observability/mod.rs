//! Observability: JSON or text logs, Prometheus metrics, and OpenTelemetry traces.

mod engine_metrics;
mod logging;
pub mod metrics;
mod trace_batch;
pub mod traces;

pub use logging::{LogFormat, LoggingSettings, RawLogging, client_text, init_logging};

/// Applies the `[logging]` policy.
pub fn apply_logging(settings: LoggingSettings) {
    logging::apply(settings);
}
