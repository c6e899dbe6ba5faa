//! The worker's side of beam search ([`super::beams`]): each beam's logits row goes to its
//! request's search; once every beam of a request has reported, the search steps, and the
//! worker forks, extends and drops the beams' sequences as it says. A finished search sends
//! its `n` best hypotheses as the request's choices and ends the request.

use turnpike_engine_api::{Finish, GenerationParams, Status};

use super::beam_groups::{GroupBeamSearch, GroupSettings};
use super::beams::{BeamSearch, Search};
use super::worker::Worker;
use crate::scheduler::SeqId;

/// Whether `token` ends a sequence of a request with parameters `p` (`eos`: the model's).
fn ends(p: &GenerationParams, eos: &[u32], token: u32) -> bool {
    p.stop_token_ids.contains(&token) || (!p.ignore_eos && eos.contains(&token))
}

/// A beam's logits row this step: its request, its sequence and its row.
#[derive(Debug, Clone, Copy)]
pub(super) struct BeamRow {
    pub id: u64,
    pub seq: SeqId,
    pub row: usize,
}

impl Worker {
    /// Whether `seq` belongs to a request that searches beams.
    pub(super) fn is_beam(&self, seq: SeqId) -> bool {
        self.seqs
            .get(&seq)
            .and_then(|(id, _)| self.requests.get(id))
            .is_some_and(|live| live.params.beam_width.is_some())
    }

    /// Hands each beam's row of `logits` (rows of the vocabulary) to its search, then steps
    /// every search whose beams have all reported.
    pub(super) fn step_beams(&mut self, rows: &[BeamRow], logits: &[f32]) {
        let vocab = self.vocab.max(1);
        let mut touched: Vec<u64> = Vec::new();
        for r in rows {
            let Some(row) = logits.get(r.row * vocab..(r.row + 1) * vocab) else {
                continue;
            };
            let (eos, max_context) = (&self.eos, self.max_context);
            let Some(live) = self.requests.get_mut(&r.id) else {
                continue;
            };
            let p = &live.params;
            let search = live.beams.get_or_insert_with(|| {
                let room = max_context.saturating_sub(live.prompt_len);
                let mut end_tokens: Vec<u32> = p.stop_token_ids.clone();
                if !p.ignore_eos {
                    end_tokens.extend(eos);
                }
                // The first end token stands for a done group's beams (as padding).
                let pad = end_tokens.first().copied().unwrap_or_default();
                end_tokens.sort_unstable();
                end_tokens.dedup();
                let width = p.beam_width.unwrap_or(1) as usize;
                let max_tokens = p.max_tokens.min(room) as usize;
                if p.beam_groups > 1 {
                    Search::Groups(GroupBeamSearch::new(
                        r.seq,
                        GroupSettings {
                            width,
                            groups: p.beam_groups as usize,
                            diversity_penalty: p.diversity_penalty,
                            length_penalty: p.length_penalty,
                            max_tokens,
                            pad,
                            end_tokens: end_tokens.len(),
                        },
                    ))
                } else {
                    Search::Beams(BeamSearch::new(
                        r.seq,
                        width,
                        p.length_penalty,
                        max_tokens,
                        p.min_tokens as usize,
                        end_tokens.len(),
                    ))
                }
            });
            let generated = search.generated();
            let below_min = generated < p.min_tokens as usize;
            search.offer(r.seq, row, |t| below_min && ends(p, eos, t));
            if !touched.contains(&r.id) {
                touched.push(r.id);
            }
        }
        for id in touched {
            self.advance_beams(id);
        }
    }

    /// Steps request `id`'s search if every beam has reported, and applies the result.
    fn advance_beams(&mut self, id: u64) {
        let eos = self.eos.clone();
        let Some(live) = self.requests.get_mut(&id) else {
            return;
        };
        let p = &live.params;
        let Some(search) = live.beams.as_mut().filter(|s| s.ready()) else {
            return;
        };
        let parents: Vec<SeqId> = search.sequences();
        let successors = search.step(|t| ends(p, &eos, t));
        if search.done() {
            for parent in parents {
                self.scheduler.remove(parent);
                self.seqs.remove(&parent);
            }
            return self.finish_beams(id);
        }
        // Forks first: a child copies its parent's tokens before the parent takes its own.
        let mut kept: Vec<SeqId> = Vec::new();
        let mut forks: Vec<(usize, SeqId)> = Vec::new();
        for (i, s) in successors.iter().enumerate() {
            if kept.contains(&s.parent) {
                forks.push((i, s.parent));
            } else {
                kept.push(s.parent);
            }
        }
        for (i, parent) in forks {
            let child = self.next_seq;
            self.next_seq += 1;
            if !self.scheduler.fork(parent, child) {
                return self.end(id, Status::Internal, "the engine lost a beam's sequence");
            }
            self.seqs.insert(child, (id, 0));
            if let Some(search) = self.requests.get_mut(&id).and_then(|l| l.beams.as_mut()) {
                search.assign(i, child);
            }
        }
        let Some(live) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(search) = live.beams.as_ref() else {
            return;
        };
        for beam in search.running() {
            if let Some(&token) = beam.tokens.last() {
                self.scheduler.append(beam.seq, token);
            }
        }
        for parent in parents.into_iter().filter(|p| !kept.contains(p)) {
            self.scheduler.remove(parent);
            self.seqs.remove(&parent);
        }
    }

    /// Sends the `n` best hypotheses of request `id` as its choices and ends it.
    fn finish_beams(&mut self, id: u64) {
        let Some(live) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(search) = live.beams.as_ref() else {
            return;
        };
        let n = live.params.n.max(1) as usize;
        let best = search.best(n);
        let logprobs = live.params.logprobs;
        let several = n > 1;
        let mut completion = 0;
        let mut last = Finish::length();
        for (index, h) in best.iter().enumerate() {
            completion += h.tokens.len() as u32;
            // The end token is not text: it ends the choice, as in plain decoding.
            let shown = h.tokens.len() - usize::from(h.stop.is_some());
            if let Some(sink) = live.sink.as_mut() {
                for (&token, &lp) in h.tokens[..shown].iter().zip(&h.logprobs) {
                    sink.token_with_logprobs(index as u32, token, logprobs.then_some(lp), &[]);
                }
            }
            last = h.stop.map_or_else(Finish::length, Finish::stop);
            if several && let Some(sink) = live.sink.as_mut() {
                sink.end_choice(index as u32, last);
            }
        }
        live.completion = completion;
        live.last_finish = last;
        self.end(id, Status::Ok, "");
    }
}
