//! Continuous-batching step planner.
//!
//! The [`Scheduler`] owns the [`BlockManager`], the token lists and the block tables of the
//! sequences; it knows nothing of models, sinks or sampling. The engine loop is: [`schedule`]
//! a step, apply the plan's `copies` (before any compute of the step), run the chunks, call
//! [`complete`], sample where a chunk has `sample`, [`append`] the tokens and [`remove`] the
//! finished sequences.
//!
//! # Policy of [`schedule`]
//!
//! 1. At most `max_batch_tokens` tokens are planned per step.
//! 2. **Decodes first.** Running sequences whose tokens all have KV but the last one get one
//!    token each, in preference order (higher priority, then lower tenant virtual time, then
//!    earlier arrival). A decode may need a new block (block boundary) or a copy-on-write of its
//!    shared last block. When no block can be had, the *victim* is preempted: the
//!    lowest-preference running sequence not yet planned in this step, which may be the sequence
//!    itself. Preemption releases all its blocks (its registered full blocks stay in the prefix
//!    cache until evicted), sets its computed count to 0 and puts it back in the waiting queue
//!    with its original arrival and all its tokens (prompt + generated); it is counted in
//!    [`SchedulerStats::preemptions`] and listed in [`StepPlan::preempted`]. It is later
//!    recomputed by a (chunked) prefill whose last chunk has `sample` set.
//! 3. **Chunked prefills in progress** (running, more than one token left) continue next, in
//!    preference order, with `min(remaining tokens, remaining budget)` tokens, shrunk to the
//!    blocks that can be had. If not even one token fits, a victim is preempted as for decodes
//!    (so running prefills that together overflow the cache cannot deadlock).
//! 4. **Admission** of waiting sequences follows, while budget remains and fewer than
//!    `max_running` sequences run, unless this step preempted something (memory is short then).
//!    A sequence is matched against the prefix cache over its tokens, below the block too (a
//!    partial last block matches a cached block that begins with those tokens); the matched
//!    blocks start its table and their tokens, all but the last token at most (its logits are
//!    needed), count as computed and are reported as `cached_tokens`. When the first token to
//!    compute falls in a matched block, that block is copied and the copy written. Its chunk is `min(remaining, budget)` tokens, shrunk to the
//!    blocks that can be had; if nothing fits, admission stops for this step (admission never
//!    preempts) and the block manager is left untouched.
//! 5. **Waiting order:** higher priority first; within a priority, weighted fair queuing between
//!    tenants: each active tenant has a virtual time growing by `tokens / weight` for every
//!    chunk planned for it (decodes included; the weight is the sequence's); the tenant with the
//!    lowest virtual time goes first (ties: earliest head arrival), then arrival order within the
//!    tenant. A tenant becoming active starts at `max(own vt, min vt of active tenants)`. Tenant
//!    state is dropped with the tenant's last sequence (see `fair.rs` for the bounded memory of
//!    idle tenants).
//! 6. **Background work** (priority at or below the engine API's `BACKGROUND_PRIORITY`: batch
//!    lines) yields whole steps: while any other sequence waits to be admitted or is still in
//!    its prompt, no background sequence is planned or admitted. A waiting foreground sequence
//!    that finds `max_running` reached, or no blocks, preempts the least preferred background
//!    sequence instead of waiting (it is recomputed later, as any preempted sequence is).
//! 7. Forked children run at once when their parent runs and may exceed `max_running`.
//! 8. **Drafts** ([`set_draft`]): a decode carries its sequence's drafted tokens after its
//!    last token, as far as the budget (one token kept for every decode still to plan) and
//!    the blocks that can be had allow; drafts never preempt. The drafts' positions are
//!    computed but not counted: [`complete`] counts the real token, and [`accept_drafts`]
//!    the drafts the engine kept once it has appended them. A rejected draft's cache
//!    positions are written again by the tokens that follow; no block holding one is
//!    registered in the prefix cache, since only computed tokens fill blocks.
//!
//! A sequence that can no longer fit in the whole cache (prompt + generated tokens) stalls: the
//! caller must bound generation so that `tokens + 1` fits in `num_blocks * block_size`.
//!
//! [`schedule`]: Scheduler::schedule
//! [`complete`]: Scheduler::complete
//! [`append`]: Scheduler::append
//! [`remove`]: Scheduler::remove
//! [`set_draft`]: Scheduler::set_draft
//! [`accept_drafts`]: Scheduler::accept_drafts

mod fair;
mod plan;
mod sequence;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_drafts;
#[cfg(test)]
mod tests_policy;

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use crate::kv::{BlockCopy, BlockId, BlockManager, KvStats};
use fair::Fair;
use sequence::Sequence;

/// Caller-chosen sequence id.
pub type SeqId = u64;

/// Limits of a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens computed per step at most.
    pub max_batch_tokens: usize,
    /// Running sequences at most (forked children may exceed it).
    pub max_running: usize,
    /// Waiting sequences at most; [`Scheduler::add`] refuses beyond.
    pub max_waiting: usize,
    /// Token positions per KV block.
    pub block_size: u32,
    /// KV blocks in the cache.
    pub num_blocks: u32,
}

impl SchedulerConfig {
    /// Checks `max_batch_tokens >= max_running >= 1`, `max_waiting >= 1`, `block_size >= 1` and
    /// `num_blocks >= 1`.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_running == 0 {
            return Err("max_running must be at least 1".into());
        }
        if self.max_batch_tokens < self.max_running {
            return Err(format!(
                "max_batch_tokens ({}) must be at least max_running ({})",
                self.max_batch_tokens, self.max_running
            ));
        }
        if self.max_waiting == 0 {
            return Err("max_waiting must be at least 1".into());
        }
        if self.block_size == 0 {
            return Err("block_size must be at least 1".into());
        }
        if self.num_blocks == 0 {
            return Err("num_blocks must be at least 1".into());
        }
        Ok(())
    }
}

/// A sequence to queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSequence {
    /// Id, unique among the scheduler's live sequences.
    pub id: SeqId,
    /// Prompt tokens (at least one).
    pub tokens: Vec<u32>,
    /// Higher runs first.
    pub priority: i32,
    /// Fair-share group.
    pub tenant: String,
    /// Fair-share weight of this sequence's tokens (0 is treated as 1).
    pub weight: u32,
}

/// Why [`Scheduler::add`] refused a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `max_waiting` sequences already wait.
    QueueFull,
    /// `tokens.len() + 1` positions need more blocks than the whole cache has.
    TooLong {
        /// Blocks the sequence needs.
        needed_blocks: usize,
        /// Blocks in the cache.
        total_blocks: usize,
    },
    /// The prompt has no token.
    Empty,
    /// A live sequence already has this id.
    DuplicateId,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::QueueFull => f.write_str("the waiting queue is full"),
            Self::TooLong {
                needed_blocks,
                total_blocks,
            } => write!(
                f,
                "the sequence needs {needed_blocks} KV blocks but the cache has {total_blocks}"
            ),
            Self::Empty => f.write_str("the prompt is empty"),
            Self::DuplicateId => f.write_str("a sequence with this id already exists"),
        }
    }
}

impl std::error::Error for Refused {}

/// What the device computes in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Copy-on-write block copies to apply before computing the chunks.
    pub copies: Vec<BlockCopy>,
    /// Token chunks to compute, the generated ones first (decodes, then a resumption's or a
    /// recompute's output), then the prompts'.
    pub chunks: Vec<PlannedChunk>,
    /// Sequences preempted in this step (their KV is dropped; they wait for a recompute).
    pub preempted: Vec<SeqId>,
}

impl StepPlan {
    /// Tokens planned in this step (sum of the chunk lengths).
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }

    /// Nothing to copy or compute.
    pub fn is_empty(&self) -> bool {
        self.copies.is_empty() && self.chunks.is_empty()
    }
}

/// Tokens of one sequence to compute in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedChunk {
    /// The sequence.
    pub seq: SeqId,
    /// Position of `tokens[0]` in the sequence (= tokens whose KV is already computed).
    pub start: usize,
    /// The tokens to compute (1 for a decode).
    pub tokens: Vec<u32>,
    /// The sequence's block table, covering at least `start + tokens.len()` positions.
    pub block_table: Vec<BlockId>,
    /// The chunk reaches the sequence's last token: sample the next token from its logits.
    pub sample: bool,
    /// Prompt tokens found in the prefix cache when the sequence was (re)admitted in this step,
    /// else 0.
    pub cached_tokens: usize,
    /// Every token of the chunk was generated (a decoding step), none is the prompt's: a
    /// device may compute such chunks in lower precision and still give a prompt the same
    /// logits whether a prefix-cache hit recomputes only its end or not.
    pub generated: bool,
    /// The chunk's last `drafts` tokens are drafts, after the sequence's last token; their
    /// logits are wanted too (`sample` is then set).
    pub drafts: usize,
}

/// Counters of a [`Scheduler`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Waiting sequences.
    pub waiting: usize,
    /// Running sequences.
    pub running: usize,
    /// Running sequences with more than one token left to compute (prefill, or a recompute
    /// after preemption); the rest of `running` decode.
    pub prefilling: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// KV-cache counters.
    pub kv: KvStats,
}

/// The continuous-batching step planner (see the [module docs](self) for the policy).
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    running: BTreeSet<SeqId>,
    fair: Fair,
    next_arrival: u64,
    preemptions: u64,
}

impl Scheduler {
    /// An idle scheduler with an empty cache of `num_blocks` blocks. The config should have
    /// passed [`SchedulerConfig::validate`] (a block size of 0 is treated as 1).
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            blocks: BlockManager::new(config.num_blocks, config.block_size),
            seqs: HashMap::new(),
            running: BTreeSet::new(),
            fair: Fair::default(),
            next_arrival: 0,
            preemptions: 0,
        }
    }

    /// Reports the prefix cache's blocks into `log` from now on (KV events).
    pub fn enable_kv_events(&mut self, log: crate::kv::events::EventLog) {
        self.blocks.enable_events(log);
    }

    /// The KV events since the last call.
    pub fn take_kv_events(&mut self) -> Vec<turnpike_kv_events::Event> {
        self.blocks.take_events()
    }

    /// The KV block manager (read-only).
    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// Queues a sequence (waiting). Refuses an empty prompt, an id in use, a sequence whose
    /// `tokens.len() + 1` positions need more blocks than the whole cache has, and any sequence
    /// once `max_waiting` sequences wait.
    pub fn add(&mut self, seq: NewSequence) -> Result<(), Refused> {
        self.add_resumed(seq, 0)
    }

    /// [`Scheduler::add`] for a sequence whose last `output` tokens were generated already (a
    /// request resumed after another engine failed): they are computed after the prompt, in
    /// chunks of their own, as a decoding step computes its tokens.
    pub fn add_resumed(&mut self, seq: NewSequence, output: usize) -> Result<(), Refused> {
        if seq.tokens.is_empty() {
            return Err(Refused::Empty);
        }
        if self.seqs.contains_key(&seq.id) {
            return Err(Refused::DuplicateId);
        }
        let needed_blocks = (seq.tokens.len() + 1).div_ceil(self.blocks.block_size());
        let total_blocks = self.blocks.num_blocks();
        if needed_blocks > total_blocks {
            return Err(Refused::TooLong {
                needed_blocks,
                total_blocks,
            });
        }
        if self.fair.waiting_len() >= self.config.max_waiting {
            return Err(Refused::QueueFull);
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.fair.activate(&seq.tenant);
        self.fair
            .push_waiting(seq.priority, &seq.tenant, arrival, seq.id);
        self.seqs.insert(
            seq.id,
            Sequence {
                prompt: seq.tokens.len().saturating_sub(output).max(1),
                tokens: seq.tokens,
                computed: 0,
                draft: Vec::new(),
                table: Vec::new(),
                hashes: Vec::new(),
                priority: seq.priority,
                tenant: seq.tenant,
                weight: seq.weight.max(1),
                arrival,
            },
        );
        Ok(())
    }

    /// After the device ran `plan`: each chunk's tokens now have KV (computed += len, drafts
    /// not counted), and the blocks that became full are registered in the prefix cache.
    /// Chunks of sequences removed or preempted since the plan are skipped.
    pub fn complete(&mut self, plan: &StepPlan) {
        for chunk in &plan.chunks {
            if !self.running.contains(&chunk.seq) {
                continue;
            }
            let Some(seq) = self.seqs.get_mut(&chunk.seq) else {
                continue;
            };
            if seq.computed != chunk.start {
                continue;
            }
            let real = chunk.tokens.len() - chunk.drafts.min(chunk.tokens.len());
            seq.computed = (chunk.start + real).min(seq.tokens.len());
            seq.draft.clear();
            self.register_full(chunk.seq);
        }
    }

    /// Registers in the prefix cache the blocks of `id` that its computed tokens fill.
    fn register_full(&mut self, id: SeqId) {
        let bs = self.blocks.block_size();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let full = (seq.computed / bs).min(seq.table.len());
        while seq.hashes.len() < full {
            let i = seq.hashes.len();
            let Some(tokens) = seq.tokens.get(i * bs..(i + 1) * bs) else {
                break;
            };
            let hash = self
                .blocks
                .register_full(seq.table[i], seq.hashes.last().copied(), tokens);
            seq.hashes.push(hash);
        }
    }

    /// Sets the drafts a running decode of `id` carries in its next step (replacing any), at
    /// most [`crate::speculative::MAX_DRAFT`]. Unknown ids are ignored.
    pub fn set_draft(&mut self, id: SeqId, mut draft: Vec<u32>) {
        draft.truncate(crate::speculative::MAX_DRAFT);
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.draft = draft;
        }
    }

    /// After the engine kept the first `accepted` drafts of `id`'s last step and appended them
    /// (and the token after them): their KV, computed in that step, now counts, all but the
    /// last token's at most.
    pub fn accept_drafts(&mut self, id: SeqId, accepted: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.computed = (seq.computed + accepted).min(seq.tokens.len().saturating_sub(1));
        }
        self.register_full(id);
    }

    /// Appends a sampled token to a sequence (its KV is computed in a later step). Unknown ids
    /// are ignored.
    pub fn append(&mut self, id: SeqId, token: u32) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.tokens.push(token);
        }
    }

    /// Creates `child` with the tokens, computed count and block table of `parent` (blocks
    /// shared; a later write to a shared partial block is copy-on-write), the same priority,
    /// tenant and weight, and a new arrival. It runs if the parent runs, else it waits. Returns
    /// false (and does nothing) if `parent` is unknown or `child` is in use.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> bool {
        if self.seqs.contains_key(&child) {
            return false;
        }
        let Some(p) = self.seqs.get(&parent) else {
            return false;
        };
        let mut seq = p.clone();
        seq.draft.clear();
        seq.arrival = self.next_arrival;
        self.next_arrival += 1;
        for &b in &seq.table {
            self.blocks.retain(b);
        }
        self.fair.activate(&seq.tenant);
        if self.running.contains(&parent) {
            self.running.insert(child);
        } else {
            self.fair
                .push_waiting(seq.priority, &seq.tenant, seq.arrival, child);
        }
        self.seqs.insert(child, seq);
        true
    }

    /// Finished or cancelled: removes the sequence wherever it is and releases its blocks at
    /// once (last block first, so a prefix's tail is evicted before its head). Unknown ids are
    /// ignored.
    pub fn remove(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        if !self.running.remove(&id) {
            self.fair
                .remove_waiting(seq.priority, &seq.tenant, seq.arrival, id);
        }
        // The computed tokens of a partial last block stay matchable, so a prompt that repeats
        // this one recomputes at most its last token.
        let bs = self.blocks.block_size();
        let full = seq.hashes.len();
        if let (Some(&last), Some(tokens)) = (
            seq.table.get(full),
            seq.tokens.get(full * bs..seq.computed.min((full + 1) * bs)),
        ) {
            self.blocks
                .register_partial(last, seq.hashes.last().copied(), tokens);
        }
        for &b in seq.table.iter().rev() {
            self.blocks.release(b);
        }
        self.fair.deactivate(&seq.tenant);
    }

    /// Tokens (prompt + appended) of a live sequence.
    pub fn tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    /// Sequences running.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Nothing waits or runs.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Queue lengths, preemptions and KV counters.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.fair.waiting_len(),
            running: self.running.len(),
            prefilling: self
                .running
                .iter()
                .filter(|id| self.seqs.get(id).is_some_and(|s| !s.is_decode()))
                .count(),
            preemptions: self.preemptions,
            kv: self.blocks.stats(),
        }
    }
}
