//! Paged KV-cache bookkeeping: which block ids are in use, shared, cached or free.
//!
//! The tensors live elsewhere; this module hands out block ids, counts references (blocks shared
//! by forked sequences), keeps the prefix cache and decides which cached block to evict.
//!
//! * A block is **used** while its reference count is above zero, **cached** when its count is
//!   zero but it holds a registered full block of some prefix (it can still be matched), and
//!   **free** (plain) otherwise. `used + cached + free == total` at all times.
//! * Full blocks are identified by a chain hash ([`chain_hash`]) over the hash of the previous
//!   block of the sequence and the block's own tokens, so one block content after two different
//!   prefixes gives two different entries.
//! * The prefix cache never trusts a hash alone: each entry stores its tokens and its parent's
//!   entry, and a match compares both. An entry lives while some block carries it, and an entry
//!   is dropped together with its descendants, so a parent link always names the very entry it was
//!   made with. A 64-bit collision can cost a cache hit but never yields KV of another prefix.
//! * Cached blocks are evicted least recently released first (a `BTreeMap` keyed by release tick,
//!   `O(log n)` per operation). Plain free blocks are always used before a cached one is evicted.

mod blocks;
pub mod events;
mod prefix;
#[cfg(test)]
mod tests;

use std::fmt;

pub use blocks::BlockManager;

/// Index of one KV-cache block.
pub type BlockId = u32;

/// Result of [`BlockManager::match_prefix`]: the cached blocks that start a sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Matched blocks, in sequence order; each one was retained for the caller.
    pub blocks: Vec<BlockId>,
    /// Chain hash of each matched full block (the last one is the parent of the next block).
    pub hashes: Vec<u64>,
    /// Tokens the matched blocks hold for the caller: whole blocks, plus the start of a block
    /// matched below the block ([`BlockManager::match_reusable`]).
    pub tokens: usize,
}

/// Read-only preview of a prefix match ([`BlockManager::peek_prefix`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixPeek {
    /// Number of blocks [`BlockManager::match_prefix`] would match now.
    pub blocks: usize,
    /// How many of those are cached with reference count 0: retaining them lowers
    /// [`BlockManager::available`] by this much.
    pub idle: usize,
    /// Tokens those blocks would hold for the caller (see [`PrefixMatch::tokens`]).
    pub tokens: usize,
}

/// A copy-on-write order: copy the KV contents of `src` into `dst`, then use `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The shared block to copy from.
    pub src: BlockId,
    /// The freshly allocated, exclusively owned block to copy into.
    pub dst: BlockId,
}

/// No block could be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks;

impl fmt::Display for OutOfBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no free KV-cache block")
    }
}

impl std::error::Error for OutOfBlocks {}

/// Counters of a [`BlockManager`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Number of blocks.
    pub total: usize,
    /// Blocks with a reference count above zero.
    pub used: usize,
    /// Blocks with reference count zero that hold a cached prefix block (evictable).
    pub cached: usize,
    /// Plain free blocks.
    pub free: usize,
    /// Tokens looked up in the prefix cache (full blocks only).
    pub prefix_queried_tokens: u64,
    /// Tokens found in the prefix cache.
    pub prefix_hit_tokens: u64,
    /// Cached blocks dropped from the prefix cache to be reused.
    pub evictions: u64,
}

impl KvStats {
    /// Share of the queried tokens that were found in the prefix cache (0 when nothing was
    /// queried).
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prefix_queried_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_queried_tokens as f64
        }
    }
}

/// SplitMix64 finalizer: a fixed bijective 64-bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic chain hash of one block: mixes the parent block's hash (`None` for the first
/// block of a sequence) and the block's token ids. Same inputs give the same value in every
/// process (no random seed).
pub fn chain_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = match parent {
        None => 0x243F_6A88_85A3_08D3,
        Some(p) => mix(p ^ 0x1319_8A2E_0370_7344),
    };
    for &t in tokens {
        h = mix(h.wrapping_add(0x9E37_79B9_7F4A_7C15) ^ u64::from(t));
    }
    mix(h ^ tokens.len() as u64)
}

/// Next key to probe when `key` is taken by another prefix (a hash collision).
fn rehash(key: u64) -> u64 {
    mix(key ^ 0xA076_1D64_78BD_642F)
}
