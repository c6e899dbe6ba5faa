//! [`BlockManager`]: reference counts, free list, LRU of cached blocks and the prefix cache.

use std::collections::BTreeMap;

use super::prefix::{PrefixIndex, Tag};
use super::{BlockCopy, BlockId, KvStats, OutOfBlocks, PrefixMatch, PrefixPeek};

/// Per-block state.
#[derive(Debug, Clone, Default)]
struct Meta {
    refs: u32,
    /// The prefix entry this block carries (as holder or as an in-use duplicate).
    tag: Option<Tag>,
    /// Release tick while the block sits in the LRU of cached blocks.
    tick: Option<u64>,
}

/// Allocator of KV-cache block ids with reference counting and a prefix cache (see the
/// [module docs](super)). Block ids out of range are ignored by every method.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: u32,
    meta: Vec<Meta>,
    /// Plain free blocks, used as a stack (initially ordered so that block 0 goes first).
    free: Vec<BlockId>,
    /// Cached blocks with reference count 0, oldest release first.
    lru: BTreeMap<u64, BlockId>,
    next_tick: u64,
    index: PrefixIndex,
    queried_tokens: u64,
    hit_tokens: u64,
    evictions: u64,
}

impl BlockManager {
    /// `num_blocks` blocks of `block_size` token positions each, all free. A block size of 0 is
    /// treated as 1.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        Self::with_index(num_blocks, block_size, PrefixIndex::default())
    }

    /// A manager whose prefix cache keys entries with `hash` (tests force collisions with it).
    #[cfg(test)]
    pub(super) fn with_hash(num_blocks: u32, block_size: u32, hash: super::prefix::HashFn) -> Self {
        Self::with_index(num_blocks, block_size, PrefixIndex::with_hash(hash))
    }

    fn with_index(num_blocks: u32, block_size: u32, index: PrefixIndex) -> Self {
        Self {
            block_size: block_size.max(1),
            meta: vec![Meta::default(); num_blocks as usize],
            free: (0..num_blocks).rev().collect(),
            lru: BTreeMap::new(),
            next_tick: 0,
            index,
            queried_tokens: 0,
            hit_tokens: 0,
            evictions: 0,
        }
    }

    /// Token positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size as usize
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks that [`allocate`](Self::allocate) can hand out now: never-used/freed plain blocks
    /// plus cached blocks with reference count 0.
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Hands out a block with reference count 1. Takes a plain free block first; otherwise
    /// evicts the least recently released cached block (dropping it, and any cached entries that
    /// extend its prefix, from the prefix cache; each dropped block counts as an eviction).
    /// `None` when nothing is available.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if let Some(b) = self.free.pop() {
            if let Some(m) = self.meta.get_mut(b as usize) {
                m.refs = 1;
            }
            return Some(b);
        }
        let (_, b) = self.lru.pop_first()?;
        self.evictions += 1;
        let tag = self.meta.get_mut(b as usize).and_then(|m| {
            m.tick = None;
            m.refs = 1;
            m.tag.take()
        });
        if let Some(tag) = tag {
            let mut dropped = Vec::new();
            self.index.evict_holder(tag, b, &mut dropped);
            self.unregister(&dropped);
        }
        Some(b)
    }

    /// Adds a reference to `b` (a sequence shares the block, e.g. forked `n > 1` choices). A
    /// cached block leaves the LRU.
    pub fn retain(&mut self, b: BlockId) {
        let Some(m) = self.meta.get_mut(b as usize) else {
            return;
        };
        if m.refs == 0 {
            if let Some(tick) = m.tick.take() {
                self.lru.remove(&tick);
            } else if let Some(pos) = self.free.iter().position(|&f| f == b) {
                self.free.swap_remove(pos);
            }
        }
        m.refs = m.refs.saturating_add(1);
    }

    /// Drops one reference to `b`. At zero, a block that holds a prefix-cache entry joins the LRU
    /// of cached blocks (most recently released last); any other block goes back to the plain
    /// free list. Releasing a free block does nothing.
    pub fn release(&mut self, b: BlockId) {
        let Some(m) = self.meta.get_mut(b as usize) else {
            return;
        };
        if m.refs == 0 {
            return;
        }
        m.refs -= 1;
        if m.refs > 0 {
            return;
        }
        match m.tag {
            Some(tag) if self.index.is_holder(tag, b) => {
                let tick = self.next_tick;
                self.next_tick += 1;
                m.tick = Some(tick);
                self.lru.insert(tick, b);
            }
            tag => {
                m.tag = None;
                self.free.push(b);
                if let Some(tag) = tag {
                    let mut dropped = Vec::new();
                    self.index.drop_carrier(tag, &mut dropped);
                    self.unregister(&dropped);
                }
            }
        }
    }

    /// Current reference count of `b` (0 for a free, cached or unknown block).
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.meta.get(b as usize).map_or(0, |m| m.refs)
    }

    /// Walks the chain over the full blocks of `tokens` (`tokens.len() / block_size` blocks) and
    /// returns the longest run of cached blocks from the start. Each matched block is retained
    /// (reference count + 1, out of the LRU). Each block's stored tokens and parent entry are
    /// compared, never only its hash. Counts `full blocks * block_size` queried tokens and
    /// `matched * block_size` hit tokens.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let bs = self.block_size();
        self.queried_tokens += ((tokens.len() / bs) * bs) as u64;
        let mut found = PrefixMatch::default();
        let mut parent = None;
        for chunk in tokens.chunks_exact(bs) {
            let Some((key, b)) = self.index.lookup(parent, chunk) else {
                break;
            };
            self.retain(b);
            found.blocks.push(b);
            found.hashes.push(key);
            parent = Some(key);
        }
        found.tokens = found.blocks.len() * bs;
        self.hit_tokens += found.tokens as u64;
        found
    }

    /// [`match_prefix`](Self::match_prefix), and below the block: after the matched full
    /// blocks, the cached block (full, or the partial last block of a finished sequence) after
    /// the same prefix that shares the longest start with the rest of `tokens` is retained and
    /// appended too; the tokens they share count in `tokens`, not in `hashes`. Reuse is thus
    /// token-granular. The caller must copy the last block before writing into it
    /// ([`copy_for_write`](Self::copy_for_write)).
    pub fn match_reusable(&mut self, tokens: &[u32]) -> PrefixMatch {
        let mut found = self.match_prefix(tokens);
        let rest = &tokens[found.tokens.min(tokens.len())..];
        if let Some((b, common)) = self.partial_block(found.hashes.last().copied(), rest) {
            self.retain(b);
            found.blocks.push(b);
            found.tokens += common;
            self.hit_tokens += common as u64;
        }
        found
    }

    /// What [`match_reusable`](Self::match_reusable) would match now, changing nothing.
    pub fn peek_reusable(&self, tokens: &[u32]) -> PrefixPeek {
        let (mut peek, parent) = self.peek_chain(tokens);
        let rest = &tokens[peek.tokens.min(tokens.len())..];
        if let Some((b, common)) = self.partial_block(parent, rest) {
            peek.blocks += 1;
            peek.tokens += common;
            if self.ref_count(b) == 0 {
                peek.idle += 1;
            }
        }
        peek
    }

    /// The cached block after the prefix whose last block hash is `parent` that shares the
    /// longest start (shorter than a block) with `rest`, and how many tokens it shares.
    fn partial_block(&self, parent: Option<u64>, rest: &[u32]) -> Option<(BlockId, usize)> {
        let rest = &rest[..rest.len().min(self.block_size() - 1)];
        if rest.is_empty() {
            return None;
        }
        self.index.lookup_longest(parent, rest)
    }

    /// Records that `b`, the last block of a sequence that is ending, holds the KV of `tokens`
    /// (fewer than a block) after the prefix whose last block hash is `parent`, so a later
    /// prompt that starts the same way reuses them ([`match_reusable`](Self::match_reusable)).
    /// Only a block the sequence owns alone is registered, and only under a live parent.
    pub fn register_partial(&mut self, b: BlockId, parent: Option<u64>, tokens: &[u32]) {
        let Some(m) = self.meta.get(b as usize) else {
            return;
        };
        if m.refs != 1 || m.tag.is_some() || tokens.is_empty() || tokens.len() >= self.block_size()
        {
            return;
        }
        let registered = self.index.register(parent, tokens, b);
        if let Some(m) = self.meta.get_mut(b as usize) {
            m.tag = registered.tag;
        }
    }

    /// Replaces the caller's reference to `b` with a fresh block holding a copy of its KV (the
    /// copy to perform is returned): for writing into a block matched from the prefix cache.
    pub fn copy_for_write(&mut self, b: BlockId) -> Result<BlockCopy, OutOfBlocks> {
        let dst = self.allocate().ok_or(OutOfBlocks)?;
        self.release(b);
        Ok(BlockCopy { src: b, dst })
    }

    /// What [`match_prefix`](Self::match_prefix) would match now, without retaining anything
    /// or counting statistics.
    pub fn peek_prefix(&self, tokens: &[u32]) -> PrefixPeek {
        self.peek_chain(tokens).0
    }

    /// [`peek_prefix`](Self::peek_prefix) and the hash of the last block it matched.
    fn peek_chain(&self, tokens: &[u32]) -> (PrefixPeek, Option<u64>) {
        let mut peek = PrefixPeek::default();
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size()) {
            let Some((key, b)) = self.index.lookup(parent, chunk) else {
                break;
            };
            peek.blocks += 1;
            peek.tokens += chunk.len();
            if self.ref_count(b) == 0 {
                peek.idle += 1;
            }
            parent = Some(key);
        }
        (peek, parent)
    }

    /// Records that the full block `b` (in use) now holds the KV of `tokens` after the prefix
    /// whose last block hash is `parent` (`None` for a sequence's first block), so later
    /// sequences can match it. If another block already holds this prefix, `b` stays
    /// unregistered (it is freed plainly). Returns the chain hash, which the sequence keeps as
    /// the parent of its next block (on a 64-bit collision with a different prefix this is a
    /// re-probed key, not [`chain_hash`](super::chain_hash)). Nothing is registered when `b` is not in use,
    /// `tokens` is not one full block, or `parent` is not a live entry (the chain cannot be
    /// verified); calling it again for an already registered block returns its hash.
    pub fn register_full(&mut self, b: BlockId, parent: Option<u64>, tokens: &[u32]) -> u64 {
        let Some(m) = self.meta.get(b as usize) else {
            return self.index.hash(parent, tokens);
        };
        if let Some(tag) = m.tag
            && self.index.is_live(tag)
        {
            return tag.key;
        }
        if m.refs == 0 || tokens.len() != self.block_size() {
            return self.index.hash(parent, tokens);
        }
        let registered = self.index.register(parent, tokens, b);
        if let Some(m) = self.meta.get_mut(b as usize) {
            m.tag = registered.tag;
        }
        registered.key
    }

    /// Copy-on-write: when `b` is shared (reference count above 1), allocates a new block,
    /// releases one reference to `b` and returns the copy to perform (the caller copies the KV
    /// and uses `dst` from then on). `Ok(None)` when `b` is exclusively owned; `Err` when a copy
    /// is needed but nothing can be allocated (then nothing changed).
    pub fn make_writable(&mut self, b: BlockId) -> Result<Option<BlockCopy>, OutOfBlocks> {
        if self.ref_count(b) <= 1 {
            return Ok(None);
        }
        let dst = self.allocate().ok_or(OutOfBlocks)?;
        self.release(b);
        Ok(Some(BlockCopy { src: b, dst }))
    }

    /// Reports the prefix cache's stored and removed full blocks into `log` from now on.
    pub fn enable_events(&mut self, log: super::events::EventLog) {
        self.index.enable_events(log);
    }

    /// The KV events since the last call (none when they are off).
    pub fn take_events(&mut self) -> Vec<turnpike_kv_events::Event> {
        self.index.take_events()
    }

    /// Block counts and prefix-cache counters.
    pub fn stats(&self) -> KvStats {
        let total = self.meta.len();
        KvStats {
            total,
            used: total - self.free.len() - self.lru.len(),
            cached: self.lru.len(),
            free: self.free.len(),
            prefix_queried_tokens: self.queried_tokens,
            prefix_hit_tokens: self.hit_tokens,
            evictions: self.evictions,
        }
    }

    /// Blocks whose prefix entry was removed: they no longer carry it, and cached ones become
    /// plain free blocks (each counted as an eviction).
    fn unregister(&mut self, dropped: &[BlockId]) {
        for &b in dropped {
            let Some(m) = self.meta.get_mut(b as usize) else {
                continue;
            };
            m.tag = None;
            if let Some(tick) = m.tick.take() {
                self.lru.remove(&tick);
                self.free.push(b);
                self.evictions += 1;
            }
        }
    }

    /// Number of live prefix-cache entries.
    #[cfg(test)]
    pub(super) fn entries(&self) -> usize {
        self.index.len()
    }
}
