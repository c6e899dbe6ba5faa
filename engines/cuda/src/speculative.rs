//! Speculative decoding: guesses of a sequence's next tokens (drafts) that the model checks
//! in the step that decodes its last token, so one read of the weights can yield several
//! tokens.
//!
//! The scheduler plans a drafted sequence's step as its last token followed by the drafts,
//! asking for logits at every one of those positions. The engine then samples each position
//! in turn exactly as a plain decoding step would (the same sampler, penalties, RNG draws and
//! log probabilities) and keeps a draft only while it equals the token sampled before it;
//! the first token that differs from its draft is kept too and ends the check. Every token
//! kept is therefore the token plain decoding would have produced, greedy or sampled with
//! the same seed. For drafts that are a single guess, as prompt lookup's are, this is
//! speculative rejection sampling: a draft is kept with the model's probability of it, and
//! a rejected one is replaced by a draw from the model's distribution without it. The cache
//! positions of rejected drafts are simply written again later.
//!
//! Drafts come from [`prompt_lookup`] ([`lookup_drafts`]; no second model): the tokens that
//! followed the latest earlier occurrence of the sequence's last few tokens; or from a draft
//! model sharing the target's vocabulary, which may be the target's own first layers
//! (self-speculation), run greedily by the engine beside the target (`engine::draft_model`).
//! Either way a draft is a single guess per position, so the check above keeps the output
//! exact. [`DraftLength`] adapts how many a sequence drafts to how many it has had accepted,
//! and pauses a sequence whose drafts keep failing, so text that does not repeat pays next to
//! nothing (a lookup that matches the longest n-gram drafts in full all the same: text being
//! copied); a draft model's drafts may instead end where its own confidence falls under a
//! threshold.

use std::path::PathBuf;

use serde::Deserialize;

/// How a model speculates (the engine setting `speculative`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeSettings {
    /// Drafted tokens per step at most (`num_assistant_tokens`); 0 turns speculation off.
    #[serde(default = "default_tokens")]
    pub tokens: usize,
    /// Drafted tokens per step at most while a sequence copies text: after a step whose
    /// drafts, from a match of the longest n-gram, were all kept.
    #[serde(default = "default_copy_tokens")]
    pub copy_tokens: usize,
    /// The longest run of last tokens looked up in the text so far.
    #[serde(default = "default_max_ngram")]
    pub max_ngram: usize,
    /// The shortest.
    #[serde(default = "default_min_ngram")]
    pub min_ngram: usize,
    /// Sequences running at most for drafts to be made: with more, a step's arithmetic, not
    /// its read of the weights, bounds it, and checking drafts costs throughput.
    #[serde(default = "default_max_running")]
    pub max_running: usize,
    /// Drafts come from this model (a folder or GGUF file with the target's vocabulary)
    /// instead of prompt lookup.
    #[serde(default)]
    pub draft_model: Option<PathBuf>,
    /// The draft model runs only its first this many layers (then its final norm and head);
    /// without `draft_model`, these layers of the target itself are the draft.
    #[serde(default)]
    pub draft_layers: Option<usize>,
    /// A draft model's default `assistant_confidence_threshold`: a draft ends at its first
    /// token less likely than this under the draft model.
    #[serde(default)]
    pub confidence: Option<f32>,
}

fn default_tokens() -> usize {
    4
}

/// Seven drafts and the last token make eight rows: one pass of the CPU device's widest byte
/// kernel, and next to nothing more than one row on a GPU.
fn default_copy_tokens() -> usize {
    7
}

fn default_max_ngram() -> usize {
    3
}

fn default_min_ngram() -> usize {
    2
}

fn default_max_running() -> usize {
    4
}

impl Default for SpeculativeSettings {
    fn default() -> Self {
        Self {
            tokens: default_tokens(),
            copy_tokens: default_copy_tokens(),
            max_ngram: default_max_ngram(),
            min_ngram: default_min_ngram(),
            max_running: default_max_running(),
            draft_model: None,
            draft_layers: None,
            confidence: None,
        }
    }
}

impl SpeculativeSettings {
    /// Checks the n-gram bounds (`1 <= min_ngram <= max_ngram`) and a draft length of at most
    /// [`MAX_DRAFT`].
    pub fn validate(&self) -> Result<(), String> {
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(format!(
                "speculative.min_ngram ({}) must be at least 1 and at most max_ngram ({})",
                self.min_ngram, self.max_ngram
            ));
        }
        for (name, value) in [("tokens", self.tokens), ("copy_tokens", self.copy_tokens)] {
            if value > MAX_DRAFT {
                return Err(format!(
                    "speculative.{name} ({value}) must be at most {MAX_DRAFT}"
                ));
            }
        }
        if self.draft_layers == Some(0) {
            return Err("speculative.draft_layers must be at least 1".into());
        }
        if let Some(confidence) = self.confidence {
            if !(confidence > 0.0 && confidence <= 1.0) {
                return Err(format!(
                    "speculative.confidence ({confidence}) must be in (0, 1]"
                ));
            }
            if !self.uses_model() {
                return Err(
                    "speculative.confidence applies to a draft model (draft_model or draft_layers); prompt lookup has no confidence"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// Whether drafts come from a model (`draft_model` or `draft_layers`).
    pub fn uses_model(&self) -> bool {
        self.draft_model.is_some() || self.draft_layers.is_some()
    }
}

/// The most tokens a sequence drafts in one step (what a request may ask for).
pub const MAX_DRAFT: usize = turnpike_engine_api::json::MAX_ASSISTANT_TOKENS as usize;

/// How far back [`prompt_lookup`] searches (the text's last tokens): bounds its work per step.
pub const LOOKUP_WINDOW: usize = 1 << 16;

/// Up to `k` tokens that followed the latest earlier occurrence of the last `n` tokens of
/// `tokens`, for `n` from `max_ngram` down to `min_ngram` (the first `n` found wins), and that
/// `n`. Empty (and 0) when nothing repeats.
pub fn prompt_lookup(
    tokens: &[u32],
    k: usize,
    min_ngram: usize,
    max_ngram: usize,
) -> (Vec<u32>, usize) {
    let window = &tokens[tokens.len().saturating_sub(LOOKUP_WINDOW)..];
    let len = window.len();
    if k == 0 || min_ngram == 0 {
        return (Vec::new(), 0);
    }
    for n in (min_ngram..=max_ngram.min(len.saturating_sub(1))).rev() {
        let tail = &window[len - n..];
        // Latest first; an occurrence must leave at least one token after it before the tail.
        for start in (0..len - n).rev() {
            if &window[start..start + n] == tail {
                let from = start + n;
                let end = (from + k).min(len);
                return (window[from..end].to_vec(), n);
            }
        }
    }
    (Vec::new(), 0)
}

/// Prompt lookup's drafts for a sequence whose [`DraftLength`] gave `k` this step: a match of
/// the longest n-gram (`max_ngram`) is text being copied and drafts up to `full` tokens
/// ([`DraftLength::full`]) whatever `k` (even while paused), since such matches are mostly
/// kept (replaying the speculative bench's rewrites, 88–100% of first drafts after a match of
/// 3 or more tokens, against 62% after a match of 2) and a step checking a few drafts costs
/// little more than a plain one; a shorter match drafts `k`.
pub fn lookup_drafts(
    tokens: &[u32],
    k: usize,
    full: usize,
    min_ngram: usize,
    max_ngram: usize,
) -> Vec<u32> {
    let (mut drafts, n) = prompt_lookup(tokens, full.max(k), min_ngram, max_ngram);
    if n < max_ngram {
        drafts.truncate(k);
    }
    drafts
}

/// Steps a sequence skips drafting after its acceptance falls under [`PAUSE_BELOW`]; doubled
/// after each pause that a retry did not end, up to `PAUSE_STEPS << MAX_BACKOFF`.
const PAUSE_STEPS: u32 = 16;
/// The most doublings of a pause.
const MAX_BACKOFF: u32 = 4;
/// Acceptance (a moving average of accepted over drafted) under which drafting pauses, where
/// drafts cost next to nothing (prompt lookup).
const PAUSE_BELOW: f32 = 0.2;
/// The highest acceptance a draft's cost can demand before drafting pauses.
const MOST_DEMANDED: f32 = 0.9;
/// Weight of the newest step in the moving average.
const RATE_WEIGHT: f32 = 0.3;

/// One sequence's draft length, adapted to how many of its drafts were accepted, or fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftLength {
    most: usize,
    /// The most while copying (see [`Self::full`]).
    copy: usize,
    /// Whether the last check kept every draft of a full-length draft.
    copying: bool,
    rate: f32,
    paused: u32,
    fixed: bool,
    /// Acceptance under which drafting pauses.
    pause_below: f32,
    /// Pauses in a row.
    pauses: u32,
}

impl DraftLength {
    /// Starts hopeful: the full `most` tokens.
    pub fn new(most: usize) -> Self {
        Self {
            most: most.min(MAX_DRAFT),
            copy: most.min(MAX_DRAFT),
            copying: false,
            rate: 1.0,
            paused: 0,
            fixed: false,
            pause_below: PAUSE_BELOW,
            pauses: 0,
        }
    }

    /// Drafts up to `copy` tokens (at least the usual most) at a match of the longest n-gram
    /// once a full-length draft was kept whole: text being copied goes on being copied, and a
    /// longer draft there yields more tokens per read of the weights.
    pub fn copying(self, copy: usize) -> Self {
        Self {
            copy: copy.clamp(self.most, MAX_DRAFT),
            ..self
        }
    }

    /// Drafts that each cost `cost` of a step of the model (a draft model's share of the
    /// weights a step reads): with one draft per step, a step yields `1 + a` tokens for
    /// `1 + cost` of the time at acceptance `a`, so drafting pauses while `a` is below the
    /// cost.
    pub fn costing(self, cost: f32) -> Self {
        Self {
            pause_below: cost.clamp(PAUSE_BELOW, MOST_DEMANDED),
            ..self
        }
    }

    /// Always `k` tokens (a request's `num_assistant_tokens`).
    pub fn fixed(k: usize) -> Self {
        Self {
            fixed: true,
            ..Self::new(k)
        }
    }

    /// Starts paused as long as repeated failures would pause it: for a model whose drafts
    /// have not paid so far.
    pub fn doubtful(self) -> Self {
        Self {
            paused: PAUSE_STEPS << MAX_BACKOFF,
            pauses: MAX_BACKOFF,
            rate: 1.0 / self.most.max(1) as f32,
            ..self
        }
    }

    /// Whether drafts kept at `acceptance` pay for drafts of this cost (see [`Self::costing`]).
    pub fn pays(cost: f32, acceptance: f32) -> bool {
        acceptance >= cost.clamp(PAUSE_BELOW, MOST_DEMANDED)
    }

    /// Tokens to draft this step (0 while paused); counts a paused step.
    pub fn take(&mut self) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        if self.most == 0 {
            return 0;
        }
        ((self.rate * self.most as f32).round() as usize).clamp(1, self.most)
    }

    /// The most tokens a match of the longest n-gram drafts: the copying length after a
    /// full-length draft was kept whole, else [`Self::most`].
    pub fn full(&self) -> usize {
        if self.copying { self.copy } else { self.most }
    }

    /// After a step that checked `drafted` drafts and kept `accepted` of them.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 || self.fixed {
            return;
        }
        self.copying = accepted == drafted && drafted >= self.most;
        let step = accepted as f32 / drafted as f32;
        self.rate = (1.0 - RATE_WEIGHT) * self.rate + RATE_WEIGHT * step;
        if self.rate < self.pause_below {
            // Each pause a retry does not end is longer: text that never repeats, or a draft
            // model that keeps guessing wrong, costs ever less.
            self.paused = PAUSE_STEPS << self.pauses.min(MAX_BACKOFF);
            self.pauses += 1;
            // After the pause, one token at a time until drafts are accepted again.
            self.rate = 1.0 / self.most.max(1) as f32;
        } else if step >= self.pause_below {
            self.pauses = 0;
        }
    }
}

#[cfg(test)]
#[path = "speculative_tests.rs"]
mod tests;
