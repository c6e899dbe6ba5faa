//! Counters shared between a model's worker and the engine's `stats`.

use std::sync::atomic::AtomicU64;

/// Request outcomes and requests in flight.
#[derive(Debug, Default)]
pub struct Counters {
    /// Accepted and not yet ended.
    pub in_flight: AtomicU64,
    /// Ended with `TP_STATUS_OK`.
    pub completed: AtomicU64,
    /// Ended cancelled.
    pub cancelled: AtomicU64,
    /// Ended with an error.
    pub failed: AtomicU64,
    /// Tokens a grammar forced, appended without sampling (fast-forward).
    pub forced_tokens: AtomicU64,
}
