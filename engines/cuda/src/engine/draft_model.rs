//! Drafts from a model: a smaller model sharing the target's vocabulary, or the target's own
//! first layers (self-speculation), run greedily on a device of its own with its own paged KV
//! cache ([`crate::speculative`] says why any single guess per position keeps the output
//! exact).
//!
//! The draft model keeps, per drafting sequence, the tokens whose keys and values it holds.
//! Each call first catches up with what the target kept since the last call: the longest
//! common prefix of what it holds and the sequence's tokens is reused, so the positions of
//! drafts the target rejected are simply written again (the roll-back). It then decodes up to
//! `k` tokens greedily, every asking sequence in one batched step per position. A token whose
//! probability under the draft model is below the request's confidence threshold ends that
//! sequence's draft (and is not drafted).
//!
//! The cache is bounded by its blocks: a sequence that cannot get blocks gives way to the
//! sequences that drafted least recently, and drafts nothing when none can. Nothing here fails
//! a request: the worker turns drafting off on a device error.

use std::collections::HashMap;

use crate::device::{Batch, Chunk, Device, DeviceError, SampleRequest};
use crate::sampler::{SamplingParams, most_likely};
use crate::scheduler::SeqId;

/// One sequence's request for a draft.
#[derive(Debug, Clone, Copy)]
pub(super) struct DraftAsk<'a> {
    pub seq: SeqId,
    /// The sequence's tokens; the last one's keys and values are not computed by the target
    /// yet, and the draft continues after it.
    pub tokens: &'a [u32],
    /// Tokens to draft at most.
    pub k: usize,
    /// End the draft at a token less likely than this under the draft model.
    pub confidence: Option<f32>,
}

/// The blocks a sequence holds and the tokens whose keys and values are in them.
#[derive(Debug)]
struct Held {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    /// The call that last used it (for eviction).
    used: u64,
}

/// A sequence drafting in the current call.
#[derive(Debug)]
struct Drafting {
    ask: usize,
    /// Tokens to draft at most.
    k: usize,
    /// Next position whose keys and values the draft model computes.
    fed: usize,
}

/// A draft model on its device.
pub(super) struct DraftModel {
    device: Box<dyn Device>,
    block_size: usize,
    total_blocks: usize,
    free: Vec<u32>,
    held: HashMap<SeqId, Held>,
    vocab: usize,
    /// Tokens one step may compute (the device's workspace).
    step_tokens: usize,
    /// The draft model's context window.
    max_context: usize,
    /// A drafted token's cost as a share of a step of the model.
    cost: f32,
    calls: u64,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("device", &self.device.name())
            .field("blocks", &self.total_blocks)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl DraftModel {
    /// A draft model on `device`, whose cache has blocks of `block_size` tokens, each of
    /// whose drafted tokens costs `cost` of a step of the model.
    pub(super) fn new(
        device: Box<dyn Device>,
        block_size: usize,
        vocab: usize,
        step_tokens: usize,
        max_context: usize,
        cost: f32,
    ) -> Self {
        let total_blocks = device.num_blocks() as usize;
        Self {
            device,
            block_size: block_size.max(1),
            total_blocks,
            free: (0..total_blocks as u32).rev().collect(),
            held: HashMap::new(),
            vocab,
            step_tokens: step_tokens.max(1),
            max_context,
            cost,
            calls: 0,
        }
    }

    /// A drafted token's cost as a share of a step of the model.
    pub(super) fn cost(&self) -> f32 {
        self.cost
    }

    /// Gives up what `seq` holds (it ended).
    pub(super) fn forget(&mut self, seq: SeqId) {
        if let Some(held) = self.held.remove(&seq) {
            self.free.extend(held.blocks);
        }
    }

    /// Blocks held and blocks in all, and the sequences holding them.
    pub(super) fn usage(&self) -> (usize, usize, usize) {
        (
            self.total_blocks - self.free.len(),
            self.total_blocks,
            self.held.len(),
        )
    }

    /// Up to `k` greedy tokens after each ask's tokens, in ask order (empty where it drafts
    /// nothing).
    pub(super) fn draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<u32>>, DeviceError> {
        self.calls += 1;
        let mut drafts = vec![Vec::new(); asks.len()];
        let mut drafting = Vec::new();
        for ask in asks {
            if let Some(held) = self.held.get_mut(&ask.seq) {
                held.used = self.calls;
            }
        }
        for (i, ask) in asks.iter().enumerate() {
            // The cache covers the tokens and every draft but the last (never fed back).
            let end = ask.tokens.len() + ask.k.saturating_sub(1);
            if ask.k == 0 || ask.tokens.is_empty() || end > self.max_context {
                continue;
            }
            if !self.reserve(ask.seq, end.div_ceil(self.block_size)) {
                continue;
            }
            let Some(held) = self.held.get_mut(&ask.seq) else {
                continue;
            };
            let common = held
                .tokens
                .iter()
                .zip(ask.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(ask.tokens.len() - 1);
            held.tokens.truncate(common);
            drafting.push(Drafting {
                ask: i,
                k: ask.k,
                fed: common,
            });
        }
        // Catch up: the tokens the draft model has not seen, in steps of its workspace; each
        // sequence's last token gives the logits of its first draft.
        let mut first = Vec::with_capacity(drafting.len());
        while first.len() < drafting.len() {
            let mut budget = self.step_tokens;
            let mut parts = Vec::new();
            for (d, seq) in drafting.iter().enumerate() {
                let len = asks[seq.ask].tokens.len();
                if seq.fed >= len || budget == 0 {
                    continue;
                }
                let take = budget.min(len - seq.fed);
                budget -= take;
                parts.push((d, seq.fed, seq.fed + take));
            }
            let chunks: Vec<(&[u32], usize, Vec<u32>, bool)> = parts
                .iter()
                .map(|&(d, from, to)| {
                    let ask = &asks[drafting[d].ask];
                    let table = self.table(ask.seq);
                    (&ask.tokens[from..to], from, table, to == ask.tokens.len())
                })
                .collect();
            let picked = self.step(&chunks, false)?;
            let mut picked = picked.into_iter();
            for &(d, _, to) in &parts {
                drafting[d].fed = to;
                if to == asks[drafting[d].ask].tokens.len() {
                    let Some(pick) = picked.next() else {
                        return Err(DeviceError::InvalidBatch("a draft row is missing".into()));
                    };
                    first.push((d, pick));
                }
            }
        }
        // Each sequence's held tokens are now its tokens.
        for seq in &drafting {
            let ask = &asks[seq.ask];
            if let Some(held) = self.held.get_mut(&ask.seq) {
                held.tokens = ask.tokens.to_vec();
            }
        }
        // Decode: keep each pick while it is confident enough, feeding it back for the next.
        let mut going: Vec<(usize, u32)> = Vec::new();
        for (d, (token, p)) in first {
            let ask = &asks[drafting[d].ask];
            if ask.confidence.is_some_and(|c| p < c) {
                continue;
            }
            drafts[drafting[d].ask].push(token);
            if drafting[d].k > 1 {
                going.push((d, token));
            }
        }
        while !going.is_empty() {
            let tables: Vec<Vec<u32>> = going
                .iter()
                .map(|&(d, _)| self.table(asks[drafting[d].ask].seq))
                .collect();
            let tokens: Vec<[u32; 1]> = going.iter().map(|&(_, t)| [t]).collect();
            let chunks: Vec<(&[u32], usize, Vec<u32>, bool)> = going
                .iter()
                .zip(&tokens)
                .zip(tables)
                .map(|((&(d, _), token), table)| {
                    let ask = &asks[drafting[d].ask];
                    let position = ask.tokens.len() + drafts[drafting[d].ask].len() - 1;
                    (token.as_slice(), position, table, true)
                })
                .collect();
            let picked = self.step(&chunks, true)?;
            let mut next = Vec::with_capacity(going.len());
            for ((d, fed), (token, p)) in going.into_iter().zip(picked) {
                let i = drafting[d].ask;
                if let Some(held) = self.held.get_mut(&asks[i].seq) {
                    held.tokens.push(fed);
                }
                if asks[i].confidence.is_some_and(|c| p < c) {
                    continue;
                }
                drafts[i].push(token);
                if drafts[i].len() < drafting[d].k {
                    next.push((d, token));
                }
            }
            going = next;
        }
        Ok(drafts)
    }

    /// Makes `seq` hold `blocks` blocks, taking them from the sequences that drafted least
    /// recently where too few are free. False when it cannot.
    fn reserve(&mut self, seq: SeqId, blocks: usize) -> bool {
        let have = self.held.get(&seq).map_or(0, |h| h.blocks.len());
        let want = blocks.saturating_sub(have);
        let evictable: usize = self.idle(seq).map(|(_, h)| h.blocks.len()).sum();
        if want > self.free.len() + evictable {
            return false;
        }
        while self.free.len() < want {
            let oldest = self
                .idle(seq)
                .min_by_key(|(s, h)| (h.used, **s))
                .map(|(s, _)| *s);
            match oldest {
                Some(old) => self.forget(old),
                None => return false,
            }
        }
        let taken = self.free.split_off(self.free.len() - want);
        let held = self.held.entry(seq).or_insert_with(|| Held {
            tokens: Vec::new(),
            blocks: Vec::new(),
            used: 0,
        });
        held.blocks.extend(taken);
        held.used = self.calls;
        true
    }

    /// The sequences other than `seq` that are not drafting in this call (whose blocks may be
    /// taken).
    fn idle(&self, seq: SeqId) -> impl Iterator<Item = (&SeqId, &Held)> {
        self.held
            .iter()
            .filter(move |(s, h)| **s != seq && h.used < self.calls)
    }

    fn table(&self, seq: SeqId) -> Vec<u32> {
        self.held
            .get(&seq)
            .map(|h| h.blocks.clone())
            .unwrap_or_default()
    }

    /// Runs one step over `(tokens, start, block table, wants logits)` chunks and returns the
    /// greedy token and its probability for each chunk that wants logits, in order.
    fn step(
        &mut self,
        chunks: &[(&[u32], usize, Vec<u32>, bool)],
        generated: bool,
    ) -> Result<Vec<(u32, f32)>, DeviceError> {
        let views: Vec<Chunk<'_>> = chunks
            .iter()
            .map(|(tokens, start, table, logits)| Chunk {
                tokens,
                start: *start,
                block_table: table,
                logits: *logits,
                generated,
                drafts: 0,
            })
            .collect();
        let rows = views.iter().filter(|c| c.logits).count();
        let logits = self.device.forward(&Batch {
            copies: &[],
            chunks: &views,
        })?;
        if let Some(sampler) = self.device.sampler() {
            let greedy = SamplingParams {
                temperature: 0.0,
                top_logprobs: Some(0),
                ..SamplingParams::default()
            };
            let requests: Vec<SampleRequest<'_>> = (0..rows)
                .map(|logits_row| SampleRequest {
                    logits_row,
                    params: &greedy,
                    uniform: 0.0,
                    penalties: &[],
                    banned: &[],
                    allowed: None,
                })
                .collect();
            let sampled = sampler.sample(&requests)?;
            return Ok(sampled
                .iter()
                .map(|s| (s.token, s.logprob.map_or(1.0, f32::exp)))
                .collect());
        }
        let vocab = self.vocab.max(1);
        if logits.len() != rows * vocab {
            return Err(DeviceError::InvalidBatch(format!(
                "the draft model returned {} logits for {rows} rows of {vocab}",
                logits.len()
            )));
        }
        logits
            .chunks_exact(vocab)
            .map(|row| {
                most_likely(row).ok_or_else(|| {
                    DeviceError::InvalidBatch("the draft model's logits hold no number".into())
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "draft_model_tests.rs"]
mod tests;
