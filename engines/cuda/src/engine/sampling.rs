//! The worker's sampling pass after a step: fork the `n` choices of requests whose prompt just
//! finished, sample every choice that the step fed (on the host from logits rows, or on a
//! device that samples), check the drafts decodes carried, then advance, end or finish each
//! choice and request, and draft for the next step where the model speculates.

use turnpike_engine_api::Status;

use std::collections::HashMap;

use rayon::prelude::*;

use super::beam_step::BeamRow;
use super::request::{LiveRequest, Mask, Outcome};
use super::speculation::DraftCheck;
use super::worker::Worker;
use crate::device::SampleRequest;
use crate::grammar::Constraint;
use crate::sampler::Sampled;
use crate::scheduler::{SeqId, StepPlan};

/// Constrained choices from which a step's masks are computed in parallel.
const PARALLEL_MASKS: usize = 4;

/// What [`Worker::advance`] did with a sampled outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Advanced {
    /// The token was appended, and `forced` tokens its grammar forced after it.
    Token { token: u32, forced: usize },
    /// The choice ended; its sequence is gone.
    Ended,
    /// The request cannot go on.
    Failed,
}

/// A choice to sample this step: its request, its index and its logits row.
#[derive(Debug, Clone, Copy)]
struct Target {
    id: u64,
    index: usize,
    row: usize,
}

impl Worker {
    /// Samples every choice the step's logits feed, and checks the drafts of decodes that
    /// carried some (`check_drafts`). `logits` is empty for a device that samples; otherwise
    /// it holds one row per chunk that asked for logits and one more per draft it carried.
    pub(super) fn sample_all(&mut self, plan: &StepPlan, mut logits: Vec<f32>) {
        let wanted: usize = plan
            .chunks
            .iter()
            .filter(|c| c.sample)
            .map(|c| 1 + c.drafts)
            .sum();
        let on_device = self.device.sampler().is_some();
        if !on_device && logits.len() != wanted * self.vocab {
            self.host.error(&format!(
                "the device returned {} logits for {wanted} rows of {}",
                logits.len(),
                self.vocab
            ));
            return self.fail_plan(plan);
        }
        let mut targets = Vec::new();
        let mut checks = Vec::new();
        let mut beams = Vec::new();
        let mut row = 0;
        for chunk in &plan.chunks {
            if let Some(&(id, _)) = self.seqs.get(&chunk.seq)
                && let Some(live) = self.requests.get_mut(&id)
                && live.cached.is_none()
            {
                live.cached = Some(chunk.cached_tokens as u32);
            }
            if !chunk.sample {
                continue;
            }
            if self.is_beam(chunk.seq) {
                if let Some(&(id, _)) = self.seqs.get(&chunk.seq) {
                    beams.push(BeamRow {
                        id,
                        seq: chunk.seq,
                        row,
                    });
                }
                row += 1 + chunk.drafts;
                continue;
            }
            if chunk.drafts > 0 {
                checks.push(DraftCheck {
                    seq: chunk.seq,
                    row,
                    drafts: &chunk.tokens[chunk.tokens.len() - chunk.drafts..],
                });
                row += 1 + chunk.drafts;
                continue;
            }
            self.choices_of(chunk.seq, row, &mut targets);
            row += 1 + chunk.drafts;
        }
        // Beams rank every token and drafts are checked position by position on the host: a
        // device that samples hands its logits rows back.
        let ranked_on_host = !(beams.is_empty() && checks.is_empty());
        if ranked_on_host && let Some(sampler) = self.device.sampler() {
            match sampler.read_logits(wanted) {
                Ok(rows) => logits = rows,
                Err(e) => {
                    self.host
                        .error(&format!("cannot read the logits back: {e}"));
                    return self.fail_plan(plan);
                }
            }
        }
        if !beams.is_empty() {
            self.step_beams(&beams, &logits);
        }
        let mut masks = self.masks(&targets);
        let outcomes = if on_device {
            match self.sample_on_device(&targets, masks) {
                Ok(outcomes) => outcomes,
                Err(message) => {
                    self.host.error(&message);
                    return self.fail_plan(plan);
                }
            }
        } else {
            let vocab = self.vocab.max(1);
            targets
                .iter()
                .zip(masks.iter_mut())
                .map(|(t, mask)| {
                    let slice = logits.get_mut(t.row * vocab..(t.row + 1) * vocab);
                    match (self.requests.get_mut(&t.id), slice) {
                        (Some(live), Some(slice)) => Some(live.sample(
                            t.index,
                            slice,
                            &self.eos,
                            self.max_context,
                            mask.take(),
                        )),
                        _ => None,
                    }
                })
                .collect()
        };
        self.apply(&targets, &outcomes);
        let checked = self.check_drafts(&checks, &mut logits);
        if self.speculative.is_some() {
            let seqs: Vec<SeqId> = targets
                .iter()
                .filter_map(|t| {
                    let live = self.requests.get(&t.id)?;
                    live.choices.get(t.index).map(|c| c.seq)
                })
                .chain(checked)
                .collect();
            self.draft_next(&seqs);
        }
    }

    /// The choices that `seq`'s logits row feeds, forking choices 1..n when the first choice
    /// of a request with `n > 1` samples for the first time.
    fn choices_of(&mut self, seq: SeqId, row: usize, targets: &mut Vec<Target>) {
        let Some(&(id, index)) = self.seqs.get(&seq) else {
            return;
        };
        let Some(live) = self.requests.get_mut(&id) else {
            return;
        };
        targets.push(Target { id, index, row });
        if index != 0 || live.choices.len() != 1 || live.params.n <= 1 {
            return;
        }
        let mut next = self.next_seq;
        let added = live.fork_choices(|| {
            next += 1;
            next - 1
        });
        self.next_seq = next;
        for (i, child) in added.into_iter().enumerate() {
            if !self.scheduler.fork(seq, child) {
                // Cannot happen for a sequence that was just computed; end the request rather
                // than leave a choice that never runs.
                targets.retain(|t| t.id != id);
                return self.end(id, Status::Internal, "the engine lost a choice's sequence");
            }
            self.seqs.insert(child, (id, i + 1));
            targets.push(Target {
                id,
                index: i + 1,
                row,
            });
        }
    }

    /// Samples `targets` on the device and hands each token to its choice. A choice whose
    /// grammar allows nothing is not sampled: its outcome is the failure.
    fn sample_on_device(
        &mut self,
        targets: &[Target],
        masks: Vec<Mask>,
    ) -> Result<Vec<Option<Outcome>>, String> {
        let mut inputs = Vec::with_capacity(targets.len());
        let mut outcomes: Vec<Option<Outcome>> = vec![None; targets.len()];
        for ((i, t), mask) in targets.iter().enumerate().zip(masks) {
            let Some(live) = self.requests.get_mut(&t.id) else {
                return Err(format!("request {} vanished before sampling", t.id));
            };
            let mut penalties = Vec::new();
            match live.device_inputs(t.index, &self.eos, &mut penalties, mask) {
                Ok(row) => inputs.push((i, row, penalties)),
                Err(outcome) => outcomes[i] = Some(outcome),
            }
        }
        let params: Vec<_> = inputs
            .iter()
            .map(|(i, _, _)| {
                let t = targets[*i];
                self.requests
                    .get(&t.id)
                    .map(|live| live.choices[t.index].sampler.params().clone())
                    .unwrap_or_default()
            })
            .collect();
        let rows: Vec<SampleRequest<'_>> = inputs
            .iter()
            .zip(&params)
            .map(|((i, row, penalties), params)| SampleRequest {
                logits_row: targets[*i].row,
                params,
                uniform: row.uniform,
                penalties,
                banned: &row.banned,
                allowed: row.allowed.as_ref().map(|a| a.words()),
            })
            .collect();
        let sampler = self
            .device
            .sampler()
            .ok_or("the device does not sample: its logits were expected")?;
        let sampled: Vec<Sampled> = sampler
            .sample(&rows)
            .map_err(|e| format!("device sampling failed: {e}"))?;
        if sampled.len() != rows.len() {
            return Err(format!(
                "the device sampled {} of {} choices",
                sampled.len(),
                rows.len()
            ));
        }
        for ((i, _, _), s) in inputs.iter().zip(sampled) {
            let t = targets[*i];
            outcomes[*i] = self
                .requests
                .get_mut(&t.id)
                .map(|live| live.accept_device(t.index, s, &self.eos, self.max_context));
        }
        Ok(outcomes)
    }

    /// The grammar masks of `targets`, in order (`None` for a choice without a grammar),
    /// computed in parallel on the engine's threads. On a device that samples, this runs while
    /// the device still computes the step (its forward returns before the step ends).
    fn masks(&mut self, targets: &[Target]) -> Vec<Mask> {
        let constraint = |requests: &mut HashMap<u64, LiveRequest>, t: &Target| {
            requests
                .get_mut(&t.id)
                .and_then(|live| live.choices.get_mut(t.index))
                .and_then(|choice| choice.constraint.as_mut())
                .map(Constraint::allowed)
        };
        let constrained = targets
            .iter()
            .filter(|t| {
                self.requests
                    .get(&t.id)
                    .and_then(|live| live.choices.get(t.index))
                    .is_some_and(|choice| choice.constraint.is_some())
            })
            .count();
        if constrained < PARALLEL_MASKS {
            // None, or so few that waking the thread pool costs more than they take.
            if constrained == 0 {
                return targets.iter().map(|_| None).collect();
            }
            return targets
                .iter()
                .map(|t| constraint(&mut self.requests, t))
                .collect();
        }
        let mut constraints: HashMap<(u64, usize), &mut Constraint> = HashMap::new();
        for (&id, live) in &mut self.requests {
            for (index, choice) in live.choices.iter_mut().enumerate() {
                if let Some(constraint) = choice.constraint.as_mut() {
                    constraints.insert((id, index), constraint);
                }
            }
        }
        let mut work: Vec<Option<&mut Constraint>> = targets
            .iter()
            .map(|t| constraints.remove(&(t.id, t.index)))
            .collect();
        work.par_iter_mut()
            .map(|c| c.as_mut().map(|c| c.allowed()))
            .collect()
    }

    /// Advances or ends each sampled choice, then finishes the requests whose choices all ended.
    fn apply(&mut self, targets: &[Target], outcomes: &[Option<Outcome>]) {
        let mut touched: Vec<u64> = Vec::new();
        let mut failed: Vec<u64> = Vec::new();
        for (t, outcome) in targets.iter().zip(outcomes) {
            let Some(seq) = self
                .requests
                .get(&t.id)
                .map(|live| live.choices[t.index].seq)
            else {
                continue;
            };
            let Some(outcome) = outcome else {
                continue;
            };
            if self.advance(t.id, t.index, seq, *outcome) == Advanced::Failed {
                failed.push(t.id);
                continue;
            }
            if touched.last() != Some(&t.id) {
                touched.push(t.id);
            }
        }
        self.settle(touched, failed);
    }

    /// Takes one sampled outcome of choice `index` of request `id` into its sequence `seq`:
    /// appends the token and the tokens its grammar forced after it, or drops the sequence
    /// of a choice that ended.
    pub(super) fn advance(
        &mut self,
        id: u64,
        index: usize,
        seq: SeqId,
        outcome: Outcome,
    ) -> Advanced {
        match outcome {
            Outcome::Continue(token) => {
                self.scheduler.append(seq, token);
                let forced = self
                    .requests
                    .get_mut(&id)
                    .map(|live| live.take_forced(index))
                    .unwrap_or_default();
                self.counters
                    .forced_tokens
                    .fetch_add(forced.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for &token in &forced {
                    self.scheduler.append(seq, token);
                }
                Advanced::Token {
                    token,
                    forced: forced.len(),
                }
            }
            Outcome::Ended => {
                self.scheduler.remove(seq);
                self.seqs.remove(&seq);
                Advanced::Ended
            }
            Outcome::Failed => Advanced::Failed,
        }
    }

    /// Ends the requests in `failed` with their failure, then those of `touched` whose choices
    /// have all ended.
    pub(super) fn settle(&mut self, touched: Vec<u64>, failed: Vec<u64>) {
        for id in failed {
            let why = self
                .requests
                .get_mut(&id)
                .and_then(|live| live.failure.take());
            if let Some(why) = why {
                self.end(id, Status::InvalidRequest, &why);
            }
        }
        for id in touched {
            if self.requests.get(&id).is_some_and(|live| live.finished()) {
                self.end(id, Status::Ok, "");
            }
        }
    }
}
