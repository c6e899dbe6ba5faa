//! Observability: logs now; metrics and traces join here.

mod logging;

pub use logging::{LogFormat, init_logging};
