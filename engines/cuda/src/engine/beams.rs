//! Beam search for one request (`best_of` > `n`): `width` beams advance together, each step
//! keeping the `width` best continuations of all of them by cumulative log-probability, and
//! the request returns the `n` best finished hypotheses by length-normalised score.
//!
//! The rules are those of Hugging Face `transformers`' `generate(num_beams=…)` (with its
//! default `early_stopping=False`), so the same weights give the same sequences and scores:
//! - each step takes the `keep` = max(2, 1 + end tokens) × width best (beam, token) pairs;
//! - a pair that ends the sequence (an end token, or the last token `max_tokens` allows)
//!   becomes a hypothesis only when it ranks among the first `width`, scored by its
//!   cumulative log-probability over (tokens generated, its own included) ^ `length_penalty`;
//!   the `width` best hypotheses are kept;
//! - the `width` best pairs that do not end become the next step's beams;
//! - the search stops when no beam is left, or once `width` hypotheses exist and the best
//!   beam, normalised at its current length, cannot beat the worst of them.
//!
//! Beams are scheduler sequences: a beam chosen by several successors is forked (its KV blocks
//! shared copy-on-write), a beam chosen by none is dropped. A step waits until every beam's
//! logits arrived (a preempted beam recomputes first), so beams never drift apart.

use std::collections::HashMap;

use crate::scheduler::SeqId;

/// One running beam.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Beam {
    pub seq: SeqId,
    /// Tokens generated so far.
    pub tokens: Vec<u32>,
    /// Each token's log-probability.
    pub logprobs: Vec<f32>,
    /// Their sum.
    pub score: f32,
}

/// A finished sequence.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hypothesis {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Cumulative log-probability over length ^ `length_penalty`.
    pub score: f32,
    /// The end token it stopped on (`None`: it ran out of tokens).
    pub stop: Option<u32>,
}

/// A beam of the next step: which beam it continues (by sequence) and with which token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Successor {
    pub parent: SeqId,
    pub token: u32,
}

/// The search of one request.
#[derive(Debug)]
pub(super) struct BeamSearch {
    width: usize,
    keep: usize,
    length_penalty: f32,
    max_tokens: usize,
    min_tokens: usize,
    pub running: Vec<Beam>,
    pub finished: Vec<Hypothesis>,
    /// Per beam, its step's best tokens and their log-probabilities, best first.
    pending: HashMap<SeqId, Vec<(u32, f32)>>,
    /// Alternatives kept per pending row.
    row_keep: usize,
    done: bool,
}

impl BeamSearch {
    /// A search of `width` beams starting from sequence `seq` (the computed prompt), for a
    /// model with `end_tokens` tokens that end a sequence.
    pub(super) fn new(
        seq: SeqId,
        width: usize,
        length_penalty: f32,
        max_tokens: usize,
        min_tokens: usize,
        end_tokens: usize,
    ) -> Self {
        let keep = 2usize.max(1 + end_tokens) * width.max(1);
        Self {
            width: width.max(1),
            keep,
            length_penalty,
            max_tokens: max_tokens.max(1),
            min_tokens,
            running: vec![Beam {
                seq,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                score: 0.0,
            }],
            finished: Vec::new(),
            pending: HashMap::new(),
            row_keep: keep,
            done: false,
        }
    }

    /// Whether `seq` is one of the running beams.
    pub(super) fn runs(&self, seq: SeqId) -> bool {
        self.running.iter().any(|b| b.seq == seq)
    }

    /// Takes beam `seq`'s logits row: its log-softmax's best tokens, `banned` ones left out.
    pub(super) fn offer(&mut self, seq: SeqId, logits: &[f32], banned: impl Fn(u32) -> bool) {
        if !self.runs(seq) {
            return;
        }
        let best = best_log_probs(logits, self.row_keep, banned);
        self.pending.insert(seq, best);
    }

    /// Tokens the beams have generated.
    pub(super) fn generated(&self) -> usize {
        self.running.first().map_or(0, |b| b.tokens.len())
    }

    /// Every running beam's row has arrived.
    pub(super) fn ready(&self) -> bool {
        !self.done
            && self
                .running
                .iter()
                .all(|b| self.pending.contains_key(&b.seq))
    }

    /// The search has ended.
    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// Advances every beam by one token once [`BeamSearch::ready`]; `ends` says whether a
    /// token ends a sequence. Returns the next step's beams in order (the running beams'
    /// sequences are still their parents': the caller forks and renumbers them with
    /// [`BeamSearch::assign`]); empty once the search is done.
    pub(super) fn step(&mut self, ends: impl Fn(u32) -> bool) -> Vec<Successor> {
        let generated = self.running.first().map_or(0, |b| b.tokens.len()) + 1;
        let mut candidates: Vec<(f32, usize, u32, f32)> = Vec::new();
        for (b, beam) in self.running.iter().enumerate() {
            for &(token, lp) in self.pending.get(&beam.seq).into_iter().flatten() {
                candidates.push((beam.score + lp, b, token, lp));
            }
        }
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        candidates.truncate(self.keep);
        let last = generated >= self.max_tokens;
        let mut next = Vec::new();
        let mut fresh = Vec::new();
        for (rank, &(total, b, token, lp)) in candidates.iter().enumerate() {
            let parent = &self.running[b];
            let stops = last || (ends(token) && generated > self.min_tokens);
            if stops {
                if rank < self.width {
                    let mut tokens = parent.tokens.clone();
                    let mut logprobs = parent.logprobs.clone();
                    tokens.push(token);
                    logprobs.push(lp);
                    fresh.push(Hypothesis {
                        tokens,
                        logprobs,
                        score: total / (generated as f32).powf(self.length_penalty),
                        stop: (!last || ends(token)).then_some(token),
                    });
                }
            } else if next.len() < self.width {
                let mut tokens = parent.tokens.clone();
                let mut logprobs = parent.logprobs.clone();
                tokens.push(token);
                logprobs.push(lp);
                next.push((
                    Successor {
                        parent: parent.seq,
                        token,
                    },
                    Beam {
                        seq: parent.seq,
                        tokens,
                        logprobs,
                        score: total,
                    },
                ));
            }
        }
        self.finished.extend(fresh);
        self.finished.sort_by(|a, b| b.score.total_cmp(&a.score));
        self.finished.truncate(self.width);
        self.pending.clear();
        let (successors, beams): (Vec<Successor>, Vec<Beam>) = next.into_iter().unzip();
        self.running = beams;
        let improvable = self.finished.len() < self.width
            || self.running.first().is_some_and(|best| {
                let worst = self.finished.last().map_or(f32::NEG_INFINITY, |h| h.score);
                best.score / (generated as f32).powf(self.length_penalty) > worst
            });
        if self.running.is_empty() || !improvable {
            self.done = true;
            return Vec::new();
        }
        successors
    }

    /// Sets the sequence of running beam `index` (after the caller forked its parent).
    pub(super) fn assign(&mut self, index: usize, seq: SeqId) {
        if let Some(beam) = self.running.get_mut(index) {
            beam.seq = seq;
        }
    }

    /// The `n` best hypotheses, best first; running beams (normalised at their length) make up
    /// for any missing.
    pub(super) fn best(&self, n: usize) -> Vec<Hypothesis> {
        let mut all = self.finished.clone();
        if all.len() < n {
            all.extend(self.running.iter().map(|b| Hypothesis {
                tokens: b.tokens.clone(),
                logprobs: b.logprobs.clone(),
                score: b.score / (b.tokens.len().max(1) as f32).powf(self.length_penalty),
                stop: None,
            }));
            all.sort_by(|a, b| b.score.total_cmp(&a.score));
        }
        all.truncate(n);
        all
    }
}

/// The `keep` most likely tokens of a logits row under its log-softmax (over every token,
/// `banned` ones included), `banned` ones left out, most likely first.
pub(super) fn best_log_probs(
    logits: &[f32],
    keep: usize,
    banned: impl Fn(u32) -> bool,
) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_norm = max + sum.ln() as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(keep + 1);
    for (token, &l) in logits.iter().enumerate() {
        let token = token as u32;
        if banned(token) {
            continue;
        }
        let lp = l - log_norm;
        if best.len() == keep && best.last().is_some_and(|&(_, worst)| lp <= worst) {
            continue;
        }
        let at = best.partition_point(|&(_, v)| v >= lp);
        best.insert(at, (token, lp));
        best.truncate(keep);
    }
    best
}

/// A request's search: plain beams, or beams in diverse groups.
#[derive(Debug)]
pub(super) enum Search {
    Beams(BeamSearch),
    Groups(super::beam_groups::GroupBeamSearch),
}

impl Search {
    pub(super) fn offer(&mut self, seq: SeqId, logits: &[f32], banned: impl Fn(u32) -> bool) {
        match self {
            Search::Beams(s) => s.offer(seq, logits, banned),
            Search::Groups(s) => s.offer(seq, logits, banned),
        }
    }

    pub(super) fn ready(&self) -> bool {
        match self {
            Search::Beams(s) => s.ready(),
            Search::Groups(s) => s.ready(),
        }
    }

    pub(super) fn done(&self) -> bool {
        match self {
            Search::Beams(s) => s.done(),
            Search::Groups(s) => s.done(),
        }
    }

    pub(super) fn generated(&self) -> usize {
        match self {
            Search::Beams(s) => s.generated(),
            Search::Groups(s) => s.generated(),
        }
    }

    pub(super) fn step(&mut self, ends: impl Fn(u32) -> bool) -> Vec<Successor> {
        match self {
            Search::Beams(s) => s.step(ends),
            Search::Groups(s) => s.step(ends),
        }
    }

    pub(super) fn assign(&mut self, index: usize, seq: SeqId) {
        match self {
            Search::Beams(s) => s.assign(index, seq),
            Search::Groups(s) => s.assign(index, seq),
        }
    }

    /// The running beams, in the order of the last step's successors.
    pub(super) fn running(&self) -> Box<dyn Iterator<Item = &Beam> + '_> {
        match self {
            Search::Beams(s) => Box::new(s.running.iter()),
            Search::Groups(s) => Box::new(s.running()),
        }
    }

    /// The running beams' sequences, each once.
    pub(super) fn sequences(&self) -> Vec<SeqId> {
        let mut seqs: Vec<SeqId> = self.running().map(|b| b.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs
    }

    pub(super) fn best(&self, n: usize) -> Vec<Hypothesis> {
        match self {
            Search::Beams(s) => s.best(n),
            Search::Groups(s) => s.best(n),
        }
    }
}

#[cfg(test)]
#[path = "beams_tests.rs"]
mod tests;
