//! The token sampler: turns one sequence's logits into its next token.
//!
//! # Design
//!
//! Each sequence owns a [`SequenceSampler`]: its [`SamplingParams`], its own deterministic
//! [`Rng`] and the token history that the penalties need. Nothing is shared between sequences,
//! so a sequence's tokens depend only on its logits, its params and its RNG state, never on
//! which other sequences happen to be in the same batch. A seeded request therefore reproduces
//! exactly; [`mix`] derives per-choice seeds (`mix(&[seed, choice_index])`) and
//! [`SequenceSampler::fork`] copies a sampler for another choice of the same request.
//!
//! [`SequenceSampler::sample`] processes the logits in this order:
//!
//! 1. **Repetition penalty** (HF/vLLM) on every token seen in the prompt or the output:
//!    `logit > 0 ? logit / r : logit * r`.
//! 2. **Frequency and presence penalties** (OpenAI) on generated tokens only:
//!    `logit -= frequency * count + presence`.
//! 3. **Banned tokens** (EOS and stop ids below `min_tokens`) become `-inf`.
//! 4. **Greedy** when `temperature == 0`: the argmax, ties to the lowest id, and no RNG draw.
//! 5. Otherwise **temperature** (weights `exp((logit - max) / temperature)`), then **top-k**
//!    (the `k` best), **top-p** (the smallest set of best tokens holding at least `top_p` of
//!    the mass left by top-k, never empty) and **min-p** (drop tokens below `min_p` times the
//!    best probability); then exactly **one** uniform draw picks a token by inverse CDF over
//!    the kept tokens in descending probability, ties by lower id. Sums are taken in `f64`.
//!    Nothing sorts the whole vocabulary: top-k is a `select_nth_unstable_by` partition, and
//!    top-p and the draw use a weighted selection (`select`) that looks at the few heavy
//!    tokens first and otherwise runs a weighted quickselect, linear time on average.
//!
//! If nothing survives step 3 (every token banned, or every logit `-inf`/NaN) the sampler falls
//! back to the argmax of the raw logits (NaN ignored, ties to the lowest id, token 0 when there
//! is no such logit). A non-greedy call still makes its one draw in that case, so the RNG
//! advances by exactly one draw per non-greedy sample whatever happens. The chosen token is
//! then recorded in the history.
//!
//! The logits slice is scratch only for the duration of the call: every change is undone
//! before `sample` returns. The candidate buffer is kept between calls to avoid allocating, so
//! a sampler holds up to 8 bytes per vocabulary entry of scratch once it has sampled.
//!
//! # Log-probabilities
//!
//! When [`SamplingParams::top_logprobs`] is `Some(k)`, [`Sampled`] reports log-probabilities of
//! the **model's** distribution: `log_softmax` of the **raw** logits, before penalties, bans,
//! temperature and filtering (vLLM's default; what OpenAI reports). They are computed in `f64`
//! with a max-subtracted log-sum-exp and rounded to `f32`.
//!
//! - [`Sampled::logprob`] is the chosen token's log-probability. It can be very negative when
//!   penalties or a high temperature picked a token the model itself rates unlikely, but it is
//!   finite: a token with a `-inf`/NaN raw logit is only ever chosen by the fallback, and then
//!   every token has one, which is the degenerate case below.
//! - [`Sampled::top_logprobs`] is the `k` most likely tokens of that distribution (fewer if the
//!   vocabulary is smaller), most likely first, ties by lower id. It is independent of the
//!   chosen token, which may or may not appear in it; `k == 0` gives an empty list but still a
//!   `logprob`.
//! - NaN logits count as `-inf` and `+inf` as `f32::MAX`, so a top list longer than the number
//!   of finite logits (masked padding, say) ends in `-inf` entries, which JSON cannot carry. If
//!   no raw logit is above `-inf` the distribution is degenerate and every token gets the
//!   uniform `-ln(vocab)`.
//!
//! With `top_logprobs: None` neither is computed (`logprob` is `None`, the list empty).

mod filters;
mod logprobs;
mod penalties;
mod rng;
mod select;
#[cfg(test)]
mod tests;

pub use rng::{Rng, mix};

use filters::Candidates;
use logprobs::{LogSoftmax, top_tokens};
use penalties::{History, restore};

/// Per-sequence sampling settings (already range-checked upstream).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax, no RNG draw).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` means off.
    pub top_k: u32,
    /// Nucleus sampling mass in `(0, 1]`; `1` means off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one, in `[0, 1]`; `0` = off.
    pub min_p: f32,
    /// Subtracted once from every token generated at least once, in `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted per generation from every generated token, in `[-2, 2]`.
    pub frequency_penalty: f32,
    /// HF-style penalty on every token seen in the prompt or output, `> 0`; `1` means off.
    pub repetition_penalty: f32,
    /// `None`: no logprobs. `Some(k)`: the chosen token's logprob and the `k` (0 to 20) most
    /// likely tokens with theirs.
    pub top_logprobs: Option<u32>,
}

impl Default for SamplingParams {
    /// Plain sampling from the model's distribution at temperature 1, with no filter, no
    /// penalty and no logprobs.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            top_logprobs: None,
        }
    }
}

/// The outcome of one [`SequenceSampler::sample`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// The chosen token's log-probability under the raw logits; `None` unless logprobs were
    /// requested.
    pub logprob: Option<f32>,
    /// The `k` most likely tokens under the raw logits with their log-probabilities, most
    /// likely first, ties by lower id; empty unless logprobs were requested.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One sequence's sampler: its params, its own RNG, and the token history penalties need.
#[derive(Debug)]
pub struct SequenceSampler {
    params: SamplingParams,
    rng: Rng,
    history: History,
    /// Scratch: the candidates of a non-greedy draw.
    candidates: Candidates,
    /// Scratch: `(id, raw logit)` for every logit changed during a call, to undo the changes.
    saved: Vec<(u32, f32)>,
    /// Scratch: the top-logprob tokens as `(id, clean raw logit)`.
    top: Vec<(u32, f64)>,
}

impl SequenceSampler {
    /// A sampler for one sequence whose RNG is seeded by `seed`.
    ///
    /// `prompt` tokens count for the repetition penalty only (as in HF/vLLM); presence/frequency
    /// penalties count generated tokens only (OpenAI semantics).
    pub fn new(params: SamplingParams, seed: u64, prompt: &[u32]) -> Self {
        Self::with_history(params, Rng::new(seed), History::from_prompt(prompt))
    }

    /// A copy for another choice of the same request (n > 1) with its own RNG seeded by `seed`,
    /// sharing the history so far (afterwards the two histories evolve separately).
    #[must_use]
    pub fn fork(&self, seed: u64) -> Self {
        Self::with_history(self.params.clone(), Rng::new(seed), self.history.clone())
    }

    fn with_history(params: SamplingParams, rng: Rng, history: History) -> Self {
        Self {
            params,
            rng,
            history,
            candidates: Candidates::default(),
            saved: Vec::new(),
            top: Vec::new(),
        }
    }

    /// The params this sampler was created with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Samples one token from raw logits (`logits` may be used as scratch; its contents are
    /// restored before returning). `banned` token ids can never be chosen (the engine passes
    /// EOS and stop ids while below `min_tokens`); if every token is banned or all logits are
    /// `-inf`/NaN, falls back to the argmax of the raw logits. Records the chosen token in the
    /// history. Token ids are indices into `logits`; out-of-range ids are ignored.
    pub fn sample(&mut self, logits: &mut [f32], banned: &[u32]) -> Sampled {
        // Logprobs describe the raw distribution, so they are taken before anything changes.
        let log_softmax = self.params.top_logprobs.map(|k| {
            top_tokens(
                logits,
                usize::try_from(k).unwrap_or(usize::MAX),
                &mut self.top,
            );
            LogSoftmax::new(logits)
        });

        self.saved.clear();
        self.history.apply(&self.params, logits, &mut self.saved);
        for &token in banned {
            if let Some(x) = logits.get_mut(token as usize) {
                self.saved.push((token, *x));
                *x = f32::NEG_INFINITY;
            }
        }

        let temperature = self.params.temperature;
        let choice = if temperature.is_nan() || temperature <= 0.0 {
            argmax(logits)
                .filter(|&(_, x)| x > f32::NEG_INFINITY)
                .map(|(id, _)| id)
        } else {
            self.draw(logits, temperature)
        };

        restore(logits, &mut self.saved);
        let token = choice.unwrap_or_else(|| argmax(logits).map_or(0, |(id, _)| id));
        self.history.record(token);

        match log_softmax {
            None => Sampled {
                token,
                logprob: None,
                top_logprobs: Vec::new(),
            },
            Some(lsm) => Sampled {
                token,
                logprob: Some(lsm.of_token(logits, token)),
                top_logprobs: self
                    .top
                    .iter()
                    .map(|&(id, value)| (id, lsm.of_clean(value)))
                    .collect(),
            },
        }
    }

    /// What a device that samples on its own needs for this sequence's next token: the one
    /// uniform draw a non-greedy sample makes (so the RNG advances exactly as in [`sample`])
    /// and the penalty list. Call [`SequenceSampler::record`] with the token it chose.
    ///
    /// [`sample`]: SequenceSampler::sample
    pub fn device_inputs(&mut self, penalties: &mut Vec<(u32, u32)>) -> f32 {
        self.history.penalty_list(&self.params, penalties);
        let t = self.params.temperature;
        if t.is_nan() || t <= 0.0 {
            0.0
        } else {
            // f32 rounding may reach 1.0; the device clamps its walk to the last kept token.
            self.rng.next_f64() as f32
        }
    }

    /// Records a token a device sampled (see [`SequenceSampler::device_inputs`]).
    pub fn record(&mut self, token: u32) {
        self.history.record(token);
    }

    /// Takes `token` as if this sampler had sampled it: recorded in the history, and the RNG
    /// moved past the draw a non-greedy sample makes. A resumed request replays the output it
    /// delivered elsewhere so its next samples are the ones an uninterrupted run would make.
    pub fn replay(&mut self, token: u32) {
        let t = self.params.temperature;
        if !(t.is_nan() || t <= 0.0) {
            self.rng.next_f64();
        }
        self.history.record(token);
    }

    /// Temperature, the filters and one draw over processed `logits`; `None` (after drawing)
    /// when no token is left.
    fn draw(&mut self, logits: &[f32], temperature: f32) -> Option<u32> {
        let c = &mut self.candidates;
        let top_k = usize::try_from(self.params.top_k).unwrap_or(usize::MAX);
        if c.fill(logits, temperature, top_k) {
            c.top_p(self.params.top_p);
            c.min_p(self.params.min_p);
        }
        c.draw(&mut self.rng)
    }
}

/// The most likely token of `logits` (ties to the lowest id, as greedy sampling picks) and its
/// probability under the raw logits; `None` when no logit is a number.
pub(crate) fn most_likely(logits: &[f32]) -> Option<(u32, f32)> {
    let (id, _) = argmax(logits)?;
    Some((id, LogSoftmax::new(logits).of_token(logits, id).exp()))
}

/// The largest non-NaN logit and its id, ties to the lowest id; `None` if there is none.
fn argmax(logits: &[f32]) -> Option<(u32, f32)> {
    const CHUNK: usize = 64;
    let max = max_logit(logits);
    // Find the chunk first with a branch-free test, which vectorises, then the position in it.
    let chunk = logits
        .chunks(CHUNK)
        .position(|c| c.iter().fold(false, |found, &x| found | (x == max)))?;
    let start = chunk * CHUNK;
    let id = start + logits.get(start..)?.iter().position(|&x| x == max)?;
    Some((u32::try_from(id).ok()?, max))
}

/// The largest non-NaN logit (`-inf` when there is none).
///
/// Eight independent running maxima instead of one chain let the compiler vectorise the loop;
/// `f32::max` ignores NaN, so the result is the same as a plain fold.
pub(crate) fn max_logit(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}
