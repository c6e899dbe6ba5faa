//! The worker's side of speculative decoding ([`crate::speculative`]): checking a step's drafts
//! against the logits computed at their positions, and drafting for the next step (by the
//! draft model where there is one, else by prompt lookup). A request
//! under a grammar drafts too: each position is sampled under the mask its grammar's state
//! gives there, and tokens the grammar forces after a kept one end the check.

use std::sync::atomic::Ordering;

use super::draft_model::DraftAsk;
use super::sampling::Advanced;
use super::worker::Worker;
use crate::scheduler::SeqId;
use crate::speculative::lookup_drafts;

/// A decode that carried drafts: its sequence, its first logits row (its last token's) and
/// the drafts, whose rows follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DraftCheck<'a> {
    pub seq: SeqId,
    pub row: usize,
    pub drafts: &'a [u32],
}

impl Worker {
    /// Samples each checked sequence's rows in turn, exactly as plain decoding steps would,
    /// keeping a draft while it equals the token sampled before it; the first token that
    /// differs is kept too and ends the check. Appends what was kept and has the scheduler
    /// count the kept drafts as computed. Returns the sequences that go on.
    pub(super) fn check_drafts(
        &mut self,
        checks: &[DraftCheck<'_>],
        logits: &mut [f32],
    ) -> Vec<SeqId> {
        let vocab = self.vocab.max(1);
        let (mut touched, mut failed, mut going) = (Vec::new(), Vec::new(), Vec::new());
        for check in checks {
            let Some(&(id, index)) = self.seqs.get(&check.seq) else {
                continue;
            };
            let mut kept = 0;
            let mut ended = false;
            for (i, row) in (check.row..=check.row + check.drafts.len()).enumerate() {
                let (Some(live), Some(slice)) = (
                    self.requests.get_mut(&id),
                    logits.get_mut(row * vocab..(row + 1) * vocab),
                ) else {
                    ended = true;
                    break;
                };
                // Under a grammar the mask is computed here, from the state the kept tokens
                // left, so drafts are held to the grammar as sampled tokens are.
                let outcome = live.sample(index, slice, &self.eos, self.max_context, None);
                match self.advance(id, index, check.seq, outcome) {
                    Advanced::Token { token, forced } => {
                        let matched = check.drafts.get(i) == Some(&token);
                        kept += usize::from(matched);
                        // Text the grammar forced after the token (sent with it) takes the
                        // positions the drafts after it were checked at.
                        if forced > 0 || !matched {
                            break;
                        }
                    }
                    Advanced::Ended => {
                        ended = true;
                        break;
                    }
                    Advanced::Failed => {
                        failed.push(id);
                        ended = true;
                        break;
                    }
                }
            }
            self.counters
                .drafted_tokens
                .fetch_add(check.drafts.len() as u64, Ordering::Relaxed);
            self.counters
                .accepted_tokens
                .fetch_add(kept as u64, Ordering::Relaxed);
            if let Some(drafts) = self
                .requests
                .get_mut(&id)
                .and_then(|live| live.choices.get_mut(index))
                .and_then(|choice| choice.drafts.as_mut())
            {
                drafts.record(check.drafts.len(), kept);
            }
            if !ended {
                self.scheduler.accept_drafts(check.seq, kept);
                going.push(check.seq);
            }
            if !failed.contains(&id) && touched.last() != Some(&id) {
                touched.push(id);
            }
        }
        self.settle(touched, failed);
        going
    }

    /// Drafts the next step's tokens for `seqs` (those that just took a token), by the draft
    /// model or by prompt lookup over each one's text, while few enough sequences run for
    /// drafts to pay.
    pub(super) fn draft_next(&mut self, seqs: &[SeqId]) {
        let Some(settings) = &self.speculative else {
            return;
        };
        let (min_ngram, max_ngram) = (settings.min_ngram, settings.max_ngram);
        let confidence = settings.confidence;
        if self.scheduler.running() > settings.max_running {
            return;
        }
        let (mut asks, mut full) = (Vec::new(), Vec::new());
        for &seq in seqs {
            let Some(&(id, index)) = self.seqs.get(&seq) else {
                continue;
            };
            let Some(live) = self.requests.get_mut(&id) else {
                continue;
            };
            let max_tokens = live.params.max_tokens;
            // A request's fixed draft length drafts that many, whatever the model's default
            // confidence; its own threshold replaces the default.
            let threshold = live
                .params
                .assistant_confidence_threshold
                .or(confidence.filter(|_| live.params.num_assistant_tokens.is_none()));
            let Some(choice) = live.choices.get_mut(index).filter(|choice| !choice.done) else {
                continue;
            };
            let generated = choice.generated;
            let Some(length) = choice.drafts.as_mut() else {
                continue;
            };
            let (k, most) = (length.take(), length.full());
            let Some(tokens) = self.scheduler.tokens(seq) else {
                continue;
            };
            // Never past the window (the last token sits at `len - 1`), nor past the tokens
            // the choice may still generate.
            let room = (self.max_context as usize).saturating_sub(tokens.len());
            let left = max_tokens.saturating_sub(generated).saturating_sub(1) as usize;
            full.push(most.min(room).min(left));
            asks.push(DraftAsk {
                seq,
                tokens,
                k: k.min(room).min(left),
                confidence: threshold,
            });
        }
        let drafts: Vec<Vec<u32>> = match &mut self.drafter {
            Some(drafter) => match drafter.draft(&asks) {
                Ok(drafts) => drafts,
                Err(e) => {
                    self.host.error(&format!(
                        "the draft model failed ({e}); decoding goes on without drafts"
                    ));
                    self.drafter = None;
                    self.speculative = None;
                    return;
                }
            },
            None => asks
                .iter()
                .zip(full)
                .map(|(ask, full)| lookup_drafts(ask.tokens, ask.k, full, min_ngram, max_ngram))
                .collect(),
        };
        let seqs: Vec<SeqId> = asks.iter().map(|ask| ask.seq).collect();
        for (seq, draft) in seqs.into_iter().zip(drafts) {
            self.scheduler.set_draft(seq, draft);
        }
    }
}
