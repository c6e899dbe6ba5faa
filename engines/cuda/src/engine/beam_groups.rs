//! Diverse (group) beam search: `width` beams in `groups` groups of equal size, each group a
//! beam search of its own that, at every step, pays `diversity_penalty` for each time a group
//! before it chose the same token at that step (Hamming diversity, arXiv 1610.02424), so the
//! groups spread over different continuations. The penalty is part of the beams' cumulative
//! scores.
//!
//! The rules are those of `transformers`' group beam search (its `BeamSearchScorer`, which
//! `generate(num_beam_groups=…, diversity_penalty=…)` ran until it moved out of the library):
//! - per group, the `keep` = max(2, 1 + end tokens) × group size best (beam, token) pairs; an
//!   ending pair among the first group-size ones becomes a hypothesis (its tokens before the
//!   end token, scored by its cumulative score over (generated + 1) ^ `length_penalty`); the
//!   first group-size pairs that do not end become the group's beams;
//! - a group is done once it holds group-size hypotheses none of which its best pair could beat;
//!   a done group's beams stand for the padding token in the penalty of later groups;
//! - at `max_tokens` the beams of groups not done become hypotheses too, and the request
//!   returns the `n` best hypotheses of all groups.

use std::collections::HashMap;

use super::beams::{Beam, Hypothesis, Successor};
use crate::scheduler::SeqId;

#[derive(Debug)]
struct Group {
    running: Vec<Beam>,
    hypotheses: Vec<Hypothesis>,
    done: bool,
}

/// The settings of a diverse search.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupSettings {
    pub width: usize,
    pub groups: usize,
    pub diversity_penalty: f32,
    pub length_penalty: f32,
    pub max_tokens: usize,
    /// The token a done group's beams stand for in the penalty (the first end token).
    pub pad: u32,
    /// Tokens that end a sequence, all counted (for `keep`).
    pub end_tokens: usize,
}

/// The diverse search of one request.
#[derive(Debug)]
pub(super) struct GroupBeamSearch {
    settings: GroupSettings,
    size: usize,
    keep: usize,
    groups: Vec<Group>,
    /// Per beam, its step's best tokens and their log-probabilities, best first: enough that
    /// the penalised best `keep` are among them.
    pending: HashMap<SeqId, Vec<(u32, f32)>>,
    generated: usize,
    done: bool,
}

impl GroupBeamSearch {
    /// A search from sequence `seq` (the computed prompt); `groups` divides `width`.
    pub(super) fn new(seq: SeqId, settings: GroupSettings) -> Self {
        let groups = settings.groups.clamp(1, settings.width.max(1));
        let size = (settings.width / groups).max(1);
        let start = Group {
            running: vec![Beam {
                seq,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                score: 0.0,
            }],
            hypotheses: Vec::new(),
            done: false,
        };
        let mut all = vec![start];
        // Every group starts from the prompt: the later ones fork it on their first step.
        for _ in 1..groups {
            all.push(Group {
                running: all[0].running.clone(),
                hypotheses: Vec::new(),
                done: false,
            });
        }
        Self {
            settings,
            size,
            keep: 2usize.max(1 + settings.end_tokens) * size,
            groups: all,
            pending: HashMap::new(),
            generated: 0,
            done: false,
        }
    }

    /// The sequences of the running beams, each once.
    pub(super) fn sequences(&self) -> Vec<SeqId> {
        let mut seqs: Vec<SeqId> = self
            .groups
            .iter()
            .flat_map(|g| g.running.iter().map(|b| b.seq))
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs
    }

    /// Takes beam `seq`'s logits row (see [`super::beams::BeamSearch::offer`]).
    pub(super) fn offer(&mut self, seq: SeqId, logits: &[f32], banned: impl Fn(u32) -> bool) {
        if !self.sequences().contains(&seq) {
            return;
        }
        let best = super::beams::best_log_probs(logits, self.keep + self.settings.width, banned);
        self.pending.insert(seq, best);
    }

    /// Every running beam's row has arrived.
    pub(super) fn ready(&self) -> bool {
        !self.done
            && self
                .sequences()
                .iter()
                .all(|s| self.pending.contains_key(s))
    }

    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// Advances every group by one token (see [`super::beams::BeamSearch::step`]); the
    /// successors are the running beams of every group, in order.
    pub(super) fn step(&mut self, ends: impl Fn(u32) -> bool) -> Vec<Successor> {
        let generated = self.generated + 1;
        let (size, lp, dp) = (
            self.size,
            self.settings.length_penalty,
            self.settings.diversity_penalty,
        );
        let mut chosen: Vec<u32> = Vec::new();
        for group in &mut self.groups {
            if group.done {
                chosen.extend(std::iter::repeat_n(self.settings.pad, size));
                continue;
            }
            let mut candidates: Vec<(f32, usize, u32, f32)> = Vec::new();
            for (b, beam) in group.running.iter().enumerate() {
                for &(token, raw) in self.pending.get(&beam.seq).into_iter().flatten() {
                    let times = chosen.iter().filter(|&&t| t == token).count() as f32;
                    candidates.push((beam.score + raw - dp * times, b, token, raw));
                }
            }
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
            candidates.truncate(self.keep);
            let mut next: Vec<Beam> = Vec::new();
            for (rank, &(total, b, token, raw)) in candidates.iter().enumerate() {
                let parent = &group.running[b];
                if ends(token) {
                    if rank < size {
                        add(
                            &mut group.hypotheses,
                            size,
                            Hypothesis {
                                tokens: [parent.tokens.as_slice(), &[token]].concat(),
                                logprobs: [parent.logprobs.as_slice(), &[raw]].concat(),
                                score: total / (generated as f32).powf(lp),
                                stop: Some(token),
                            },
                        );
                    }
                } else {
                    next.push(Beam {
                        seq: parent.seq,
                        tokens: [parent.tokens.as_slice(), &[token]].concat(),
                        logprobs: [parent.logprobs.as_slice(), &[raw]].concat(),
                        score: total,
                    });
                }
                if next.len() == size {
                    break;
                }
            }
            let best = candidates.first().map_or(f32::NEG_INFINITY, |c| c.0);
            let worst = group.hypotheses.last().map(|h| h.score);
            group.done = group.hypotheses.len() >= size
                && worst.is_some_and(|w| w >= best / (generated as f32).powf(lp));
            chosen.extend(next.iter().filter_map(|b| b.tokens.last().copied()));
            group.running = next;
        }
        self.pending.clear();
        self.generated = generated;
        if generated >= self.settings.max_tokens {
            for group in self.groups.iter_mut().filter(|g| !g.done) {
                for beam in std::mem::take(&mut group.running) {
                    let score = beam.score / (beam.tokens.len().max(1) as f32).powf(lp);
                    add(
                        &mut group.hypotheses,
                        size,
                        Hypothesis {
                            tokens: beam.tokens,
                            logprobs: beam.logprobs,
                            score,
                            stop: None,
                        },
                    );
                }
                group.done = true;
            }
        }
        for group in self.groups.iter_mut().filter(|g| g.done) {
            group.running.clear();
        }
        if self.groups.iter().all(|g| g.done || g.running.is_empty()) {
            self.done = true;
            return Vec::new();
        }
        // The new beams still carry their parents' sequences.
        self.running()
            .map(|b| Successor {
                parent: b.seq,
                token: b.tokens.last().copied().unwrap_or_default(),
            })
            .collect()
    }

    /// Tokens every beam has generated.
    pub(super) fn generated(&self) -> usize {
        self.generated
    }

    /// Sets the sequence of running beam `index` (counted over the groups in order).
    pub(super) fn assign(&mut self, index: usize, seq: SeqId) {
        if let Some(beam) = self
            .groups
            .iter_mut()
            .flat_map(|g| g.running.iter_mut())
            .nth(index)
        {
            beam.seq = seq;
        }
    }

    /// The running beams of every group, in order.
    pub(super) fn running(&self) -> impl Iterator<Item = &Beam> {
        self.groups.iter().flat_map(|g| g.running.iter())
    }

    /// The `n` best hypotheses over every group, best first.
    pub(super) fn best(&self, n: usize) -> Vec<Hypothesis> {
        let mut all: Vec<Hypothesis> = self
            .groups
            .iter()
            .flat_map(|g| g.hypotheses.iter().cloned())
            .collect();
        all.sort_by(|a, b| b.score.total_cmp(&a.score));
        all.truncate(n);
        all
    }
}

/// Adds `h` to a group's hypotheses (best first, at most `size`) unless it is no better than
/// the worst of a full list.
fn add(hypotheses: &mut Vec<Hypothesis>, size: usize, h: Hypothesis) {
    if hypotheses.len() >= size && hypotheses.last().is_some_and(|w| h.score <= w.score) {
        return;
    }
    let at = hypotheses.partition_point(|x| x.score >= h.score);
    hypotheses.insert(at, h);
    hypotheses.truncate(size);
}
