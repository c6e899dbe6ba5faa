//! Per-sequence state kept by the scheduler.

use crate::kv::BlockId;

/// One sequence: its tokens, how many have KV, and its block table.
#[derive(Debug, Clone)]
pub(super) struct Sequence {
    /// Prompt followed by the appended (generated) tokens.
    pub(super) tokens: Vec<u32>,
    /// Length of the prompt: tokens from here on were generated.
    pub(super) prompt: usize,
    /// Leading tokens whose KV is computed.
    pub(super) computed: usize,
    /// Guesses of the tokens after the last one, checked in its decoding step
    /// ([`crate::speculative`]); never part of `tokens` until accepted.
    pub(super) draft: Vec<u32>,
    /// Blocks holding positions `[i * block_size, (i + 1) * block_size)`.
    pub(super) table: Vec<BlockId>,
    /// Chain hash of each registered full block, in order (`hashes.len() <= table.len()`).
    pub(super) hashes: Vec<u64>,
    pub(super) priority: i32,
    pub(super) tenant: String,
    /// Fair-share weight (at least 1).
    pub(super) weight: u32,
    /// Arrival order; kept across preemptions.
    pub(super) arrival: u64,
}

impl Sequence {
    /// All tokens but the last have KV: the next step computes one token.
    pub(super) fn is_decode(&self) -> bool {
        self.computed + 1 == self.tokens.len()
    }

    /// More than one token is left to compute (a prefill, possibly chunked or a recompute).
    pub(super) fn is_prefill(&self) -> bool {
        self.computed + 1 < self.tokens.len()
    }

    /// Tokens the next chunk may compute: up to the prompt's end while the prompt is not
    /// computed, so generated tokens (a resumption's output, or what a preempted sequence
    /// recomputes) are always computed in chunks of their own, as decoding computed them.
    pub(super) fn chunk_left(&self) -> usize {
        let end = if self.computed < self.prompt {
            self.prompt
        } else {
            self.tokens.len()
        };
        end.saturating_sub(self.computed)
    }
}
