//! Observability: JSON or text logs, and Prometheus metrics. Traces join here.

mod engine_metrics;
mod logging;
pub mod metrics;

pub use logging::{LogFormat, LoggingSettings, RawLogging, client_text, init_logging};

/// Applies the `[logging]` policy.
pub fn apply_logging(settings: LoggingSettings) {
    logging::apply(settings);
}
