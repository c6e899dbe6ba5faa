//! Observability: JSON or text logs, and Prometheus metrics. Traces join here.

mod logging;
pub mod metrics;
pub mod requests;

pub use logging::{LogFormat, init_logging};
