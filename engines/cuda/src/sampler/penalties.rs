//! Token history and the penalties computed from it.
//!
//! Two views of the history, following the usual conventions:
//! - the repetition penalty (HF/vLLM) looks at every token *seen*, prompt and output alike;
//! - the presence and frequency penalties (OpenAI) look only at *generated* tokens and their
//!   counts.

use std::collections::{HashMap, HashSet};

use super::SamplingParams;

/// What one sequence has seen and generated so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct History {
    /// How often each generated token was generated (prompt excluded); every count is > 0.
    counts: HashMap<u32, u32>,
    /// Every token of the prompt or the output.
    seen: HashSet<u32>,
}

impl History {
    /// A history that has seen `prompt` and generated nothing yet.
    pub(crate) fn from_prompt(prompt: &[u32]) -> Self {
        Self {
            counts: HashMap::new(),
            seen: prompt.iter().copied().collect(),
        }
    }

    /// Records one generated token.
    pub(crate) fn record(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        self.seen.insert(token);
    }

    /// How often `token` was generated (prompt occurrences do not count).
    #[cfg(test)]
    pub(crate) fn count(&self, token: u32) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }

    /// Whether `token` appeared in the prompt or the output.
    #[cfg(test)]
    pub(crate) fn seen(&self, token: u32) -> bool {
        self.seen.contains(&token)
    }

    /// The tokens the penalties of `params` touch, as `(token, generated count)` pairs: every
    /// seen token when the repetition penalty is on (count 0 for prompt-only tokens), else the
    /// generated ones when a frequency or presence penalty is on, else none. This is what a
    /// device that samples on its own needs to apply [`History::apply`] itself.
    pub(crate) fn penalty_list(&self, params: &SamplingParams, out: &mut Vec<(u32, u32)>) {
        out.clear();
        let rep = params.repetition_penalty;
        if rep != 1.0 && rep.is_finite() && rep > 0.0 {
            out.extend(
                self.seen
                    .iter()
                    .map(|&t| (t, self.counts.get(&t).copied().unwrap_or(0))),
            );
        } else if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            out.extend(self.counts.iter().map(|(&t, &c)| (t, c)));
        }
        out.sort_unstable();
    }

    /// Applies the repetition, then the frequency and presence penalties to `logits` in place.
    ///
    /// Every entry is pushed onto `saved` as `(id, old value)` before it is changed, so undoing
    /// the entries in reverse order restores the logits exactly. Ids beyond the end of `logits`
    /// are ignored.
    pub(crate) fn apply(
        &self,
        params: &SamplingParams,
        logits: &mut [f32],
        saved: &mut Vec<(u32, f32)>,
    ) {
        let rep = params.repetition_penalty;
        if rep != 1.0 && rep.is_finite() && rep > 0.0 {
            for &token in &self.seen {
                if let Some(x) = logits.get_mut(token as usize) {
                    saved.push((token, *x));
                    *x = if *x > 0.0 { *x / rep } else { *x * rep };
                }
            }
        }
        let freq = params.frequency_penalty;
        let pres = params.presence_penalty;
        if freq != 0.0 || pres != 0.0 {
            for (&token, &count) in &self.counts {
                if let Some(x) = logits.get_mut(token as usize) {
                    saved.push((token, *x));
                    // `count` is at least 1 here, so the presence penalty applies once.
                    *x -= freq * count as f32 + pres;
                }
            }
        }
    }
}

/// Undoes the changes recorded in `saved` (in reverse order) and empties it.
pub(crate) fn restore(logits: &mut [f32], saved: &mut Vec<(u32, f32)>) {
    while let Some((token, old)) = saved.pop() {
        if let Some(x) = logits.get_mut(token as usize) {
            *x = old;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    fn penalised(history: &History, p: &SamplingParams, logits: &[f32]) -> Vec<f32> {
        let mut out = logits.to_vec();
        let mut saved = Vec::new();
        history.apply(p, &mut out, &mut saved);
        let mut restored = out.clone();
        restore(&mut restored, &mut saved);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&restored),
            bits(logits),
            "restore must undo every change"
        );
        assert!(saved.is_empty());
        out
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_logits() {
        let history = History::from_prompt(&[0, 1]);
        let mut p = params();
        p.repetition_penalty = 2.0;
        let out = penalised(&history, &p, &[2.0, -2.0, 3.0, 0.0]);
        assert_eq!(out, [1.0, -4.0, 3.0, 0.0]);
    }

    #[test]
    fn repetition_counts_generated_tokens_once_each() {
        let mut history = History::from_prompt(&[]);
        history.record(2);
        history.record(2);
        let mut p = params();
        p.repetition_penalty = 0.5;
        let out = penalised(&history, &p, &[1.0, 1.0, 1.0]);
        assert_eq!(out, [1.0, 1.0, 2.0]);
    }

    #[test]
    fn frequency_is_proportional_to_the_generated_count() {
        let mut history = History::from_prompt(&[0, 1, 2]);
        for token in [1, 2, 2, 2] {
            history.record(token);
        }
        let mut p = params();
        p.frequency_penalty = 0.5;
        let out = penalised(&history, &p, &[1.0, 1.0, 1.0, 1.0]);
        // The prompt occurrence of 0 does not count; 1 was generated once, 2 three times.
        assert_eq!(out, [1.0, 0.5, -0.5, 1.0]);
        assert_eq!(history.count(2), 3);
        assert_eq!(history.count(0), 0);
        assert!(history.seen(0));
    }

    #[test]
    fn presence_applies_once_whatever_the_count() {
        let mut history = History::from_prompt(&[3]);
        for token in [1, 2, 2, 2] {
            history.record(token);
        }
        let mut p = params();
        p.presence_penalty = 1.0;
        let out = penalised(&history, &p, &[1.0, 1.0, 1.0, 1.0]);
        assert_eq!(out, [1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn negative_penalties_encourage_and_penalties_combine_in_order() {
        let mut history = History::from_prompt(&[0]);
        history.record(1);
        history.record(1);
        let mut p = params();
        p.repetition_penalty = 2.0;
        p.frequency_penalty = -1.0;
        p.presence_penalty = 0.5;
        let out = penalised(&history, &p, &[4.0, 4.0, 4.0]);
        // Token 1: 4 / 2 = 2, then + 1 * 2 (negative frequency), then - 0.5.
        assert_eq!(out, [2.0, 3.5, 4.0]);
    }

    #[test]
    fn out_of_range_ids_and_special_values_are_harmless() {
        let mut history = History::from_prompt(&[0, 1, 1000]);
        history.record(2000);
        history.record(1);
        let mut p = params();
        p.repetition_penalty = 1.5;
        p.frequency_penalty = 1.0;
        p.presence_penalty = 1.0;
        let out = penalised(&history, &p, &[f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(out[0], f32::NEG_INFINITY);
        assert!(out[1].is_nan());
    }
}
