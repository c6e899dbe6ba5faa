//! [`Scheduler::schedule`] and its helpers (the policy is described in the module docs).

use std::cmp::Reverse;
use std::collections::HashSet;

use super::{PlannedChunk, Scheduler, SeqId, StepPlan};
use turnpike_engine_api::json::BACKGROUND_PRIORITY;

use crate::kv::BlockCopy;

/// Sort key of a running sequence: smaller is preferred (higher priority, lower tenant virtual
/// time, earlier arrival; the id makes it total).
type Preference = (Reverse<i32>, u128, u64, SeqId);

impl Scheduler {
    /// Plans one step: decodes first, then chunked prefills in progress, then admissions, within
    /// the token budget, preempting when blocks run out (see the module docs).
    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_batch_tokens;
        let mut planned: HashSet<SeqId> = HashSet::new();
        let mut order: Vec<(Preference, SeqId)> = self
            .running
            .iter()
            .filter_map(|&id| self.preference(id).map(|p| (p, id)))
            .collect();
        order.sort_unstable();

        // Background work yields whole steps while other work waits or is in its prompt.
        let yielding = self.foreground_waits();
        if yielding {
            order.retain(|(_, id)| !self.is_background(*id));
        }
        let mut decodes = order
            .iter()
            .filter(|(_, id)| self.seqs.get(id).is_some_and(|s| s.is_decode()))
            .count();
        for &(_, id) in &order {
            if budget == 0 {
                break;
            }
            let Some(draft) = self
                .seqs
                .get(&id)
                .filter(|s| s.is_decode())
                .map(|s| s.draft.len())
            else {
                continue;
            };
            // Drafts take what the decodes still to plan leave of the budget.
            let want = 1 + draft.min(budget.saturating_sub(decodes));
            decodes = decodes.saturating_sub(1);
            if self.running.contains(&id) {
                budget -= self.plan_running(id, want, &mut planned, &mut plan);
            }
        }
        for &(_, id) in &order {
            if budget == 0 {
                break;
            }
            if !self.running.contains(&id) || planned.contains(&id) {
                continue;
            }
            let Some(want) = self
                .seqs
                .get(&id)
                .filter(|s| s.is_prefill())
                .map(|s| s.chunk_left().min(budget))
            else {
                continue;
            };
            budget -= self.plan_running(id, want, &mut planned, &mut plan);
        }
        if plan.preempted.is_empty() {
            while budget > 0 {
                let Some(id) = self.fair.next_waiting() else {
                    break;
                };
                let background = self.is_background(id);
                if yielding && background {
                    break;
                }
                // Foreground work takes a background sequence's place (and its blocks) when
                // there is no other room: interactive requests preempt batch work.
                if self.running.len() >= self.config.max_running {
                    if background || !self.preempt_background(&planned, &mut plan) {
                        break;
                    }
                    continue;
                }
                let admitted = self.admit(id, budget, &mut plan);
                if admitted == 0 {
                    if !background && self.preempt_background(&planned, &mut plan) {
                        continue;
                    }
                    break;
                }
                budget -= admitted;
            }
        }
        // Generated chunks lead the batch (a device rounds the leading decoding rows as a
        // decoding step does), also a resumption's output or a recompute planned among prompts.
        plan.chunks.sort_by_key(|c| !c.generated);
        plan
    }

    /// Whether `id` is background work ([`BACKGROUND_PRIORITY`] or below).
    fn is_background(&self, id: SeqId) -> bool {
        self.seqs
            .get(&id)
            .is_some_and(|s| s.priority <= BACKGROUND_PRIORITY)
    }

    /// Whether work above the background waits to be admitted or is still in its prompt.
    fn foreground_waits(&self) -> bool {
        self.fair
            .highest_waiting_priority()
            .is_some_and(|p| p > BACKGROUND_PRIORITY)
            || self.running.iter().any(|&id| {
                self.seqs
                    .get(&id)
                    .is_some_and(|s| s.priority > BACKGROUND_PRIORITY && s.is_prefill())
            })
    }

    /// Preempts the least preferred running background sequence not planned in this step;
    /// false when there is none.
    fn preempt_background(&mut self, planned: &HashSet<SeqId>, plan: &mut StepPlan) -> bool {
        let victim = self
            .running
            .iter()
            .filter(|id| !planned.contains(id) && self.is_background(**id))
            .filter_map(|&id| self.preference(id).map(|p| (p, id)))
            .max();
        match victim {
            Some((_, id)) => {
                self.preempt(id, plan);
                true
            }
            None => false,
        }
    }

    fn preference(&self, id: SeqId) -> Option<Preference> {
        let s = self.seqs.get(&id)?;
        Some((Reverse(s.priority), self.fair.vt(&s.tenant), s.arrival, id))
    }

    /// Plans up to `want` tokens of the running sequence `id`; while not even one token fits,
    /// preempts the lowest-preference running sequence not planned yet (possibly `id` itself).
    /// Returns the tokens planned.
    fn plan_running(
        &mut self,
        id: SeqId,
        want: usize,
        planned: &mut HashSet<SeqId>,
        plan: &mut StepPlan,
    ) -> usize {
        loop {
            let fit = self.grow(id, want, &mut plan.copies);
            if fit > 0 {
                self.push_chunk(id, fit, 0, plan);
                planned.insert(id);
                return fit;
            }
            let victim = self
                .running
                .iter()
                .filter(|v| !planned.contains(v))
                .filter_map(|&v| self.preference(v).map(|p| (p, v)))
                .max();
            let Some((_, victim)) = victim else {
                return 0;
            };
            self.preempt(victim, plan);
            if victim == id {
                return 0;
            }
        }
    }

    /// Makes the blocks for positions `[computed, computed + want)` of `id` writable (copying
    /// shared ones) and allocates missing ones, as far as blocks can be had. Returns how many of
    /// the `want` tokens fit.
    fn grow(&mut self, id: SeqId, want: usize, copies: &mut Vec<BlockCopy>) -> usize {
        let bs = self.blocks.block_size();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        let start = seq.computed;
        let end = start + want;
        let existing = end.div_ceil(bs).min(seq.table.len());
        for i in start / bs..existing {
            match self.blocks.make_writable(seq.table[i]) {
                Ok(None) => {}
                Ok(Some(copy)) => {
                    seq.table[i] = copy.dst;
                    copies.push(copy);
                }
                Err(_) => return (i * bs).saturating_sub(start).min(want),
            }
        }
        while seq.table.len() * bs < end {
            match self.blocks.allocate() {
                Some(b) => seq.table.push(b),
                None => break,
            }
        }
        (seq.table.len() * bs).saturating_sub(start).min(want)
    }

    /// Adds the chunk of the next `len` tokens of `id` and charges its tenant.
    fn push_chunk(&mut self, id: SeqId, len: usize, cached_tokens: usize, plan: &mut StepPlan) {
        let Some(seq) = self.seqs.get(&id) else {
            return;
        };
        let start = seq.computed;
        let end = (start + len).min(seq.tokens.len());
        let mut tokens = seq.tokens[start..end].to_vec();
        // A decode carries its drafts into the positions after its last token.
        let drafts = if end == seq.tokens.len() {
            let drafts = (start + len - end).min(seq.draft.len());
            tokens.extend_from_slice(&seq.draft[..drafts]);
            drafts
        } else {
            0
        };
        plan.chunks.push(PlannedChunk {
            seq: id,
            start,
            tokens,
            block_table: seq.table.clone(),
            sample: end == seq.tokens.len(),
            cached_tokens,
            generated: start >= seq.prompt,
            drafts,
        });
        self.fair.charge(&seq.tenant, end - start, seq.weight);
    }

    /// Releases all blocks of the running sequence `id` and puts it back in the waiting queue
    /// with its arrival and tokens.
    fn preempt(&mut self, id: SeqId, plan: &mut StepPlan) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        for &b in seq.table.iter().rev() {
            self.blocks.release(b);
        }
        seq.table.clear();
        seq.hashes.clear();
        seq.draft.clear();
        seq.computed = 0;
        self.running.remove(&id);
        self.fair
            .push_waiting(seq.priority, &seq.tenant, seq.arrival, id);
        self.preemptions += 1;
        plan.preempted.push(id);
    }

    /// Gives back what an admission that cannot go on took: the blocks, the hashes, the tokens
    /// counted as computed and the copies planned after the first `copies`.
    fn unadmit(&mut self, id: SeqId, plan: &mut StepPlan, copies: usize) {
        plan.copies.truncate(copies);
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        for &b in seq.table.iter().rev() {
            self.blocks.release(b);
        }
        seq.table.clear();
        seq.hashes.clear();
        seq.computed = 0;
    }

    /// Tries to admit the waiting sequence `id` with at most `budget` tokens. Returns the tokens
    /// planned; 0 means it was not admitted and nothing changed.
    fn admit(&mut self, id: SeqId, budget: usize, plan: &mut StepPlan) -> usize {
        let bs = self.blocks.block_size();
        let Some(seq) = self.seqs.get(&id) else {
            return 0;
        };
        // At least the last token is computed, for its logits.
        let Some(last) = seq.tokens.len().checked_sub(1) else {
            return 0;
        };
        let peek = self.blocks.peek_reusable(&seq.tokens);
        let mut available = self.blocks.available().saturating_sub(peek.idle);
        // Writing into the last matched block takes a copy; where no block is left for it, the
        // sequence gives that block back instead (see below), so an idle one counts as free.
        if available == 0 && peek.idle > 0 && peek.tokens.min(last) < peek.blocks * bs {
            available = 1;
        }
        let want = (seq.tokens.len() - peek.tokens.min(last)).min(budget);
        if want.min(available * bs) == 0 {
            return 0;
        }
        let copies = plan.copies.len();
        let matched = self.blocks.match_reusable(&seq.tokens);
        let reused = matched.tokens.min(last);
        let writes_matched = reused < matched.blocks.len() * bs;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        seq.computed = reused;
        seq.table = matched.blocks;
        seq.hashes = matched.hashes;
        // The first token to compute lands in the last matched block: that block is the prefix
        // cache's, so the sequence writes into a copy of it. With no block for the copy, the
        // sequence gives that block back and computes its tokens instead (the block can then be
        // evicted for it), rather than waiting for a copy that may never fit.
        if writes_matched && let Some(b) = seq.table.last_mut() {
            match self.blocks.copy_for_write(*b) {
                Ok(copy) => {
                    *b = copy.dst;
                    plan.copies.push(copy);
                }
                Err(_) => {
                    if let Some(b) = seq.table.pop() {
                        self.blocks.release(b);
                    }
                    seq.hashes.truncate(seq.table.len());
                    seq.computed = (seq.table.len() * bs).min(last);
                }
            }
        }
        let cached = seq.computed;
        let want = seq.chunk_left().min(budget);
        let fit = self.grow(id, want, &mut plan.copies);
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        if fit == 0 {
            self.unadmit(id, plan, copies);
            return 0;
        }
        self.fair
            .remove_waiting(seq.priority, &seq.tenant, seq.arrival, id);
        self.running.insert(id);
        self.push_chunk(id, fit, cached, plan);
        fit
    }
}
