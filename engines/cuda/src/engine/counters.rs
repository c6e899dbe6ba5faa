//! Counters shared between a model's worker and the engine's `stats`.

use std::sync::atomic::AtomicU64;

/// Request outcomes and requests in flight.
#[derive(Debug, Default)]
pub(super) struct Counters {
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
    /// Drafted tokens checked, and those kept (speculative decoding).
    pub drafted_tokens: AtomicU64,
    /// See `drafted_tokens`.
    pub accepted_tokens: AtomicU64,
    /// Device steps run.
    pub steps: AtomicU64,
    /// Prefill chunks (one per sequence and step) and decode rows computed, summed over steps:
    /// divided by `steps`, the mean batch of each phase.
    pub prefill_sequences: AtomicU64,
    /// See `prefill_sequences`.
    pub decode_sequences: AtomicU64,
    /// Prompt tokens computed (prefill chunks) and generated tokens computed (decode rows).
    pub prefill_tokens: AtomicU64,
    /// See `prefill_tokens`.
    pub decode_tokens: AtomicU64,
    /// The last step's prefill chunks and decode rows.
    pub last_prefill_batch: AtomicU64,
    /// See `last_prefill_batch`.
    pub last_decode_batch: AtomicU64,
    /// Time spent running steps (forward and sampling), in microseconds: its rate is how busy
    /// the device is.
    pub busy_micros: AtomicU64,
}
