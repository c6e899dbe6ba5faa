//! Resuming a request on another engine after the one serving it failed mid-stream.
//!
//! A host that forwards token ids knows exactly which tokens each choice has delivered. To carry
//! on elsewhere it sends, per unfinished choice, a request of one choice whose prompt is the
//! original prompt followed by that choice's output so far, whose `max_tokens` and `min_tokens`
//! count only what is left, and whose [`Resume`] says how many of the prompt's last tokens are
//! output and which choice they were ([`continuation`] builds it).
//!
//! An engine whose model declares `resume` treats those tokens as its own output: they count
//! for the presence and frequency penalties, advance the grammar, and move a seeded choice's
//! random stream past their draws, so a greedy or seeded choice continues as if nothing had
//! happened. To an engine that does not, the host sends the same prompt and budget without the
//! [`Resume`]: a valid continuation of the text, without that state.

use serde::{Deserialize, Serialize};

use crate::event::Finish;
use crate::json::GenerationParams;

/// The prompt's last `tokens` ids are choice `choice`'s output so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// How many of the prompt's last ids were output.
    pub tokens: u32,
    /// Which choice of the original request they belong to (its seed derives from it).
    pub choice: u32,
}

impl Resume {
    /// The rules every engine relies on: one choice, no beams.
    pub fn check(self, params: &GenerationParams) -> Result<(), String> {
        if params.n != 1 {
            return Err(format!(
                "a resumed request has one choice, not {}",
                params.n
            ));
        }
        if params.beam_width.is_some() {
            return Err("a beam search cannot be resumed".into());
        }
        Ok(())
    }

    /// `prompt` split into the original prompt and the output already delivered.
    pub fn split(self, prompt: &[u32]) -> Result<(&[u32], &[u32]), String> {
        let output = self.tokens as usize;
        if output >= prompt.len() {
            return Err(format!(
                "resume.tokens ({output}) must be below the prompt's length ({})",
                prompt.len()
            ));
        }
        Ok(prompt.split_at(prompt.len() - output))
    }
}

/// The request that continues choice `choice` of (`prompt`, `params`) after it delivered
/// `output`: the prompt followed by the output, one choice, the budget that is left, and a
/// [`Resume`] when `exact` (the engine declares `resume`). `None` when the choice has spent its
/// `max_tokens` (it ended by length).
pub fn continuation(
    prompt: &[u32],
    params: &GenerationParams,
    choice: u32,
    output: &[u32],
    exact: bool,
) -> Option<(Vec<u32>, GenerationParams)> {
    let delivered = u32::try_from(output.len()).unwrap_or(u32::MAX);
    if delivered >= params.max_tokens {
        return None;
    }
    let mut tokens = Vec::with_capacity(prompt.len() + output.len());
    tokens.extend_from_slice(prompt);
    tokens.extend_from_slice(output);
    let resumed = GenerationParams {
        n: 1,
        max_tokens: params.max_tokens - delivered,
        min_tokens: params.min_tokens.saturating_sub(delivered),
        resume: exact.then_some(Resume {
            tokens: delivered,
            choice,
        }),
        ..params.clone()
    };
    Some((tokens, resumed))
}

/// Per choice of a request, the tokens it delivered and whether it ended, and how the last one
/// to end ended: what a host keeps to resume the unfinished choices elsewhere and to send the
/// one FINAL.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    tokens: Vec<Vec<u32>>,
    ended: Vec<bool>,
    last: Finish,
}

impl Outputs {
    /// Nothing delivered yet by `n` choices.
    pub fn new(n: u32) -> Self {
        let n = n.max(1) as usize;
        Self {
            tokens: vec![Vec::new(); n],
            ended: vec![false; n],
            last: Finish::default(),
        }
    }

    /// Choice `choice` delivered `token`.
    pub fn push(&mut self, choice: u32, token: u32) {
        if let Some(tokens) = self.tokens.get_mut(choice as usize) {
            tokens.push(token);
        }
    }

    /// Ends choice `choice` with `finish`; whether it was open (an unknown choice never is).
    /// A choice that ends while others go on is owed a CHOICE_END; the last one's finish is the
    /// FINAL's ([`Outputs::last`]).
    pub fn end(&mut self, choice: u32, finish: Finish) -> bool {
        let open = self
            .ended
            .get_mut(choice as usize)
            .is_some_and(|ended| !std::mem::replace(ended, true));
        if open {
            self.last = finish;
        }
        open
    }

    /// How the last choice to end ended.
    pub fn last(&self) -> Finish {
        self.last
    }

    /// Whether choice `choice` has ended (an unknown choice has).
    pub fn ended(&self, choice: u32) -> bool {
        self.ended.get(choice as usize).copied().unwrap_or(true)
    }

    /// Whether every choice has ended.
    pub fn finished(&self) -> bool {
        self.ended.iter().all(|e| *e)
    }

    /// The tokens choice `choice` delivered.
    pub fn of(&self, choice: u32) -> &[u32] {
        self.tokens.get(choice as usize).map_or(&[], Vec::as_slice)
    }

    /// Those of `choices` that have not ended.
    pub fn open(&self, choices: &[u32]) -> Vec<u32> {
        choices
            .iter()
            .copied()
            .filter(|&c| !self.ended(c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continuation_carries_the_output_and_the_budget_left() {
        let params = GenerationParams {
            n: 3,
            max_tokens: 10,
            min_tokens: 4,
            seed: Some(7),
            ..GenerationParams::default()
        };
        let (prompt, p) = continuation(&[1, 2], &params, 2, &[5, 6, 7], true).unwrap();
        assert_eq!(prompt, [1, 2, 5, 6, 7]);
        assert_eq!(
            (p.n, p.max_tokens, p.min_tokens, p.seed),
            (1, 7, 1, Some(7))
        );
        assert_eq!(
            p.resume,
            Some(Resume {
                tokens: 3,
                choice: 2
            })
        );
        let (original, output) = p.resume.unwrap().split(&prompt).unwrap();
        assert_eq!((original, output), (&[1, 2][..], &[5, 6, 7][..]));
        // Round trip through the ABI's JSON, checked as a plugin checks it.
        let back = GenerationParams::from_json(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);

        let (_, plain) = continuation(&[1], &params, 0, &[5], false).unwrap();
        assert_eq!(plain.resume, None);
        assert!(continuation(&[1], &params, 0, &[5; 10], true).is_none());
    }

    #[test]
    fn outputs_keep_each_choice_and_end_it_once() {
        let mut outputs = Outputs::new(2);
        outputs.push(1, 9);
        outputs.push(1, 8);
        assert_eq!(outputs.of(1), [9, 8]);
        let done = Finish::default();
        assert!(outputs.end(0, done) && !outputs.end(0, done) && !outputs.end(7, done));
        assert_eq!(outputs.open(&[0, 1]), [1]);
        assert!(!outputs.finished() && outputs.end(1, Finish::length()) && outputs.finished());
        assert_eq!(outputs.last(), Finish::length());
    }

    #[test]
    fn a_resume_needs_one_choice_and_a_prompt_longer_than_its_output() {
        let resume = Resume {
            tokens: 2,
            choice: 0,
        };
        let params = GenerationParams {
            n: 2,
            resume: Some(resume),
            ..GenerationParams::default()
        };
        let json = serde_json::to_string(&params).unwrap();
        let err = GenerationParams::from_json(&json).unwrap_err();
        assert!(err.contains("one choice"), "{err}");
        assert!(resume.split(&[1, 2]).is_err());
    }
}
