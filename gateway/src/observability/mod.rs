//! Observability: JSON or text logs, Prometheus metrics, and OpenTelemetry traces.

mod engine_metrics;
mod logging;
mod metric_handles;
pub mod metrics;
mod trace_batch;
pub mod traces;

pub use logging::{LogFormat, LoggingSettings, RawLogging, client_text, init_logging};

/// Applies the `[metrics]` labels and the `[logging]` policy (at startup and on every reload).
pub fn apply(metrics_settings: metrics::MetricsSettings, logging_settings: LoggingSettings) {
    metrics::set_tenant_label(metrics_settings.tenant_label);
    logging::apply(logging_settings);
}
