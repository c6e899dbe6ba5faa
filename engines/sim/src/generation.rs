//! One request's generation: which token each choice emits next, when, and how it ends.
//!
//! Everything is drawn from generators seeded by the request's seed (or, without one, by the
//! engine's seed and the request id), so a request replays token for token and delay for delay.

use std::sync::Arc;
use std::time::Duration;

use turnpike_engine_api::plugin::Sink;
use turnpike_engine_api::resume::Resume;
use turnpike_engine_api::{FinalEvent, Finish, GenerationParams, Status, TopLogprob, Usage};

use crate::config::{ModelConfig, Output, Reasoning, secs};
use crate::constrained::Constrained;
use crate::rng::{Rng, mix};

/// What happens after a step.
pub(crate) enum Step {
    /// Wait this long, then step again.
    Continue(Duration),
    /// The request has ended.
    Done(FinalEvent),
}

enum Next {
    Token(u32),
    End(Finish),
    /// The grammar allows nothing more: the request fails.
    Fail(String),
}

/// Tokens a constrained choice writes before it finishes, when its output mode sets no length.
const GRAMMAR_BUDGET: u32 = 16;

struct Choice {
    rng: Rng,
    /// Reasoning tokens (markers included) still to send before the answer.
    reasoning: std::collections::VecDeque<u32>,
    /// Position in the echoed prompt or the script.
    pos: usize,
    /// Tokens produced, stop tokens included.
    produced: u32,
    /// Random mode: end after this many tokens.
    target: Option<u32>,
    /// The request's grammar, when it has one: it picks every answer token.
    constrained: Option<Constrained>,
    done: bool,
}

pub(crate) struct Generation {
    model: Arc<ModelConfig>,
    params: GenerationParams,
    prompt: Vec<u32>,
    choices: Vec<Choice>,
    timing: Rng,
    usage: Usage,
    fail_after: Option<u32>,
    steps: u32,
    last_finish: Finish,
}

impl Generation {
    pub(crate) fn new(
        model: Arc<ModelConfig>,
        prompt: Vec<u32>,
        params: GenerationParams,
        seed: u64,
        fail_after: Option<u32>,
        constrained: Option<Constrained>,
        replay: Option<Resume>,
    ) -> Self {
        // A resumed request is one choice of the original, with that choice's generator.
        let first = replay.map_or(0, |r| r.choice);
        let choices = (first..first.saturating_add(params.n))
            .map(|i| {
                let mut rng = Rng::new(mix(&[seed, u64::from(i)]));
                let target = match model.output {
                    Output::Random {
                        length: Some([lo, hi]),
                    } => Some(lo + rng.below(u64::from(hi - lo) + 1) as u32),
                    _ => None,
                };
                let mut reasoning = std::collections::VecDeque::new();
                if let Some(r) = &model.reasoning
                    && params.reasoning_effort.as_deref() != Some("none")
                {
                    let answer = target.unwrap_or(16);
                    let count = Reasoning::tokens(params.reasoning_effort.as_deref(), answer);
                    reasoning.extend(&r.start);
                    reasoning.extend((0..count).map(|_| model.vocab.draw(&mut rng)));
                    reasoning.extend(&r.end);
                }
                // The answer's length does not include the reasoning before it.
                let target = target.map(|t| t + reasoning.len() as u32);
                Choice {
                    rng,
                    reasoning,
                    pos: 0,
                    produced: 0,
                    target,
                    constrained: constrained.as_ref().map(Constrained::fork),
                    done: false,
                }
            })
            .collect();
        let replayed = replay.map_or(0, |r| r.tokens);
        let usage = Usage {
            prompt_tokens: prompt.len() as u32 + replayed,
            ..Usage::default()
        };
        let mut generation = Self {
            timing: Rng::new(mix(&[seed, u64::MAX])),
            model,
            params,
            prompt,
            choices,
            usage,
            fail_after,
            steps: 0,
            last_finish: Finish::default(),
        };
        if replayed > 0 {
            generation.replay(replayed);
        }
        generation
    }

    /// Draws (and drops) the first `count` tokens of the only choice, as the run that delivered
    /// them did. Its budget counts them again (the request's budget is what was left), so the
    /// rest of the request is the rest of that run.
    fn replay(&mut self, count: u32) {
        self.params.max_tokens = self.params.max_tokens.saturating_add(count);
        self.params.min_tokens = self.params.min_tokens.saturating_add(count);
        for _ in 0..count {
            if !matches!(self.next_for(0), Next::Token(_)) {
                break;
            }
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }

    /// Time to the first token: base, jitter, and prefill of the prompt.
    pub(crate) fn first_delay(&mut self) -> Duration {
        let l = self.model.latency;
        let prefill = l.prefill_per_token * self.prompt.len() as f64;
        secs(l.ttft + l.ttft_jitter * self.timing.normal() + prefill)
    }

    fn next_delay(&mut self) -> Duration {
        let l = self.model.latency;
        secs(l.itl + l.itl_jitter * self.timing.normal())
    }

    /// Emits one token (or the end) for each live choice.
    pub(crate) fn step(&mut self, sink: &mut Sink) -> Step {
        let several = self.choices.len() > 1;
        for i in 0..self.choices.len() {
            if self.choices[i].done {
                continue;
            }
            match self.next_for(i) {
                Next::Token(token) => {
                    self.usage.completion_tokens += 1;
                    self.send(sink, i as u32, token);
                }
                Next::Fail(why) => {
                    return Step::Done(FinalEvent::failed(Status::InvalidRequest, why, self.usage));
                }
                Next::End(finish) => {
                    if finish.stop_token.is_some() {
                        self.usage.completion_tokens += 1;
                    }
                    self.choices[i].done = true;
                    self.last_finish = finish;
                    if several {
                        sink.end_choice(i as u32, finish);
                    }
                }
            }
        }
        self.steps += 1;
        let live = self.choices.iter().any(|c| !c.done);
        if live && self.fail_after.is_some_and(|n| self.steps >= n) {
            return Step::Done(FinalEvent::failed(
                Status::Internal,
                "simulated engine failure mid-stream",
                self.usage,
            ));
        }
        if live {
            Step::Continue(self.next_delay())
        } else {
            Step::Done(FinalEvent::ok(self.last_finish, self.usage))
        }
    }

    /// The next candidate from the output mode; `None` is end-of-sequence.
    fn source(&mut self, i: usize) -> Option<u32> {
        let c = &mut self.choices[i];
        if let Some(token) = c.reasoning.pop_front() {
            return Some(token);
        }
        let from = |list: &[u32], pos: &mut usize| {
            let t = list.get(*pos).copied();
            *pos += 1;
            t
        };
        match &self.model.output {
            Output::Echo if !self.prompt.is_empty() => from(&self.prompt, &mut c.pos),
            Output::Script { tokens } if !tokens.is_empty() => from(tokens, &mut c.pos),
            Output::Random { .. } if c.target.is_some_and(|t| c.produced >= t) => None,
            _ => Some(self.model.vocab.draw(&mut c.rng)),
        }
    }

    fn next_for(&mut self, i: usize) -> Next {
        let (max_tokens, min_tokens, ignore_eos) = (
            self.params.max_tokens,
            self.params.min_tokens,
            self.params.ignore_eos,
        );
        let produced = self.choices[i].produced;
        let context_full =
            self.prompt.len() as u64 + u64::from(produced) >= u64::from(self.model.max_context);
        if produced >= max_tokens || context_full {
            return Next::End(Finish::length());
        }
        if self.choices[i].constrained.is_some() {
            return self.constrained_next(i, max_tokens);
        }
        let may_stop = produced >= min_tokens;
        for _ in 0..64 {
            let candidate = self.source(i);
            let c = &mut self.choices[i];
            let token = match candidate {
                Some(t) if t != self.model.eos => t,
                end => {
                    if ignore_eos || !may_stop {
                        if end.is_none() {
                            // Echo and script wrap around; random mode goes on without a target.
                            c.pos = 0;
                            c.target = None;
                        }
                        continue;
                    }
                    c.produced += 1;
                    return Next::End(Finish::stop(self.model.eos));
                }
            };
            if self.params.stop_token_ids.contains(&token) {
                if !may_stop {
                    continue;
                }
                c.produced += 1;
                return Next::End(Finish::stop(token));
            }
            c.produced += 1;
            return Next::Token(token);
        }
        // Every candidate was a stop token that may not stop yet: fall back to any token.
        let c = &mut self.choices[i];
        c.produced += 1;
        Next::Token(self.model.vocab.draw(&mut c.rng))
    }

    /// A constrained choice's next token: its reasoning first, then the output mode's token if
    /// the grammar allows it, else the grammar's pick, finishing once the length budget (or
    /// half of `max_tokens`) is spent.
    fn constrained_next(&mut self, i: usize, max_tokens: u32) -> Next {
        let c = &mut self.choices[i];
        c.produced += 1;
        if let Some(token) = c.reasoning.pop_front() {
            return Next::Token(token);
        }
        let budget = c.target.unwrap_or(GRAMMAR_BUDGET);
        let finishing = c.produced > budget || c.produced.saturating_mul(2) > max_tokens;
        // The output mode's own next token (its end: end-of-sequence), where the grammar allows it.
        let wanted = self.source(i).unwrap_or(self.model.eos);
        let c = &mut self.choices[i];
        let Some(constrained) = c.constrained.as_mut() else {
            return Next::Fail("the choice has no grammar".into());
        };
        match constrained.draw(&self.model.vocab, &mut c.rng, finishing, wanted) {
            Ok(token) if token == self.model.eos || self.params.stop_token_ids.contains(&token) => {
                Next::End(Finish::stop(token))
            }
            Ok(token) => Next::Token(token),
            Err(why) => Next::Fail(why),
        }
    }

    fn send(&mut self, sink: &mut Sink, choice: u32, token: u32) {
        let p = &self.params;
        if !p.logprobs && p.top_logprobs == 0 {
            return sink.token(choice, token);
        }
        // Synthetic but well-formed: the chosen token is the most likely, the alternatives
        // follow in falling order, and the probabilities sum to less than one.
        let rng = &mut self.choices[choice as usize].rng;
        let p0 = 0.35 + 0.6 * rng.unit();
        let logprob = p0.ln() as f32;
        let mut top = Vec::with_capacity(p.top_logprobs as usize);
        if p.top_logprobs > 0 {
            top.push(TopLogprob {
                token_id: token,
                logprob,
            });
        }
        let mut mass = 1.0 - p0;
        while top.len() < p.top_logprobs as usize {
            let alt = self.model.vocab.draw(rng);
            if top.iter().any(|t| t.token_id == alt) {
                // Small vocabularies: take the next id instead of drawing forever.
                let next =
                    (0..self.model.vocab.size()).find(|id| top.iter().all(|t| t.token_id != *id));
                let Some(next) = next else { break };
                mass *= 0.5;
                top.push(TopLogprob {
                    token_id: next,
                    logprob: mass.ln() as f32,
                });
                continue;
            }
            mass *= 0.5;
            top.push(TopLogprob {
                token_id: alt,
                logprob: mass.ln() as f32,
            });
        }
        sink.token_with_logprobs(choice, token, Some(logprob), &top);
    }
}
