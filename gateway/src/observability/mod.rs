//! Observability: JSON or text logs, and Prometheus metrics. Traces join here.

mod engine_metrics;
mod logging;
pub mod metrics;

pub use logging::{LogFormat, init_logging};
