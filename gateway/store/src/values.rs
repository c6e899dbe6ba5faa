//! The stored values of the in-memory store (responses kept for `previous_response_id` and
//! retrieval): bounded by count and by the memory an entry takes ([`footprint`]), the oldest
//! evicted first, expired ones as the queue reaches them.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::memory::MemoryLimits;

/// What the map's bucket, the queue's slot, the strings' headers and the allocator's rounding
/// take per entry beyond the bytes of the key and value (an estimate from their sizes).
const ENTRY_OVERHEAD: usize = 160;

/// The memory an entry of key `key` holding `held` more bytes takes.
pub(crate) fn footprint(key: &str, held: usize) -> usize {
    2 * key.len() + held + ENTRY_OVERHEAD
}

/// Stored values (responses), bounded like the idempotency records.
#[derive(Debug, Default)]
pub(crate) struct Values {
    pub(crate) entries: HashMap<String, (Vec<u8>, Instant)>,
    /// Keys in insertion order, for eviction (may hold keys already removed or replaced).
    pub(crate) order: VecDeque<String>,
    pub(crate) bytes: usize,
}

impl Values {
    pub(crate) fn remove(&mut self, key: &str) -> bool {
        match self.entries.remove(key) {
            Some((value, _)) => {
                self.bytes -= footprint(key, value.len());
                true
            }
            None => false,
        }
    }

    /// Evicts the oldest values while they have expired, then the oldest, until one more of
    /// `adding` bytes fits. Each put looks at as many entries as it evicts (values share one
    /// lifetime, so the oldest expire first).
    pub(crate) fn make_room(&mut self, limits: MemoryLimits, adding: usize, now: Instant) {
        while let Some(key) = self.order.front() {
            match self.entries.get(key) {
                Some((_, until)) if *until > now => break,
                _ => {
                    if let Some(key) = self.order.pop_front() {
                        self.remove(&key);
                    }
                }
            }
        }
        while self.entries.len() >= limits.max_records || self.bytes + adding > limits.max_bytes {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            self.remove(&key);
        }
        // Drop order entries whose keys are gone, so the queue stays bounded too.
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order.retain(|k| entries.contains_key(k));
        }
    }
}
