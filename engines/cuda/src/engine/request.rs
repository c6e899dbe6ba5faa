//! A request while it runs: its sink, its choices and their samplers, and the rules that end a
//! choice (end-of-sequence, stop ids, `max_tokens`, the context window).

use turnpike_engine_api::plugin::Sink;
use turnpike_engine_api::{Finish, GenerationParams, TopLogprob, Usage};

use crate::grammar::{Allowed, Constraint};
use crate::sampler::{Sampled, SamplingParams, SequenceSampler, mix};
use crate::scheduler::SeqId;

/// A choice's grammar mask computed ahead of its sample (`None`: not computed, or no grammar).
pub(super) type Mask = Option<Result<Allowed, String>>;

/// What a device that samples needs for one choice (see [`LiveRequest::device_inputs`]).
#[derive(Debug)]
pub(super) struct DeviceInputs {
    /// The uniform draw for a non-greedy sample.
    pub uniform: f32,
    /// Tokens it may not pick yet.
    pub banned: Vec<u32>,
    /// Under a grammar, the tokens it allows.
    pub allowed: Option<Allowed>,
}

/// One of a request's `n` choices.
#[derive(Debug)]
pub(super) struct Choice {
    /// Its sequence in the scheduler.
    pub seq: SeqId,
    /// Its sampler (own RNG, own history).
    pub sampler: SequenceSampler,
    /// Tokens generated, stop tokens included.
    pub generated: u32,
    /// Ended.
    pub done: bool,
    /// Where it stands in the request's grammar, when it has one.
    pub constraint: Option<Constraint>,
    /// Tokens the grammar forced after the last sampled one, sent already, for the scheduler
    /// to append with it (see [`LiveRequest::take_forced`]).
    pub forced: Vec<u32>,
    /// How many tokens it drafts, where it speculates ([`crate::speculative`]).
    pub drafts: Option<crate::speculative::DraftLength>,
}

/// What sampling a token did to a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The token was sent; the choice goes on with it.
    Continue(u32),
    /// The choice ended.
    Ended,
    /// The request cannot go on ([`LiveRequest::failure`] says why).
    Failed,
}

/// A request the engine accepted.
#[derive(Debug)]
pub(super) struct LiveRequest {
    /// Where events go; taken when the FINAL is sent.
    pub sink: Option<Sink>,
    /// Its parameters.
    pub params: GenerationParams,
    /// Prompt tokens.
    pub prompt_len: u32,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cached: Option<u32>,
    /// Completion tokens of every choice.
    pub completion: u32,
    /// Choices; one until the prompt is computed, then `n`.
    pub choices: Vec<Choice>,
    /// The seed choices derive theirs from.
    pub seed: u64,
    /// How the last choice to end ended.
    pub last_finish: Finish,
    /// Why the request cannot go on, once it cannot.
    pub failure: Option<String>,
    /// Append the tokens its grammar forces without sampling each.
    pub fast_forward: bool,
    /// Its beam search, once its prompt is computed, when it searches beams.
    pub beams: Option<super::beams::Search>,
}

/// Sampling settings of a request.
pub(super) fn sampling(params: &GenerationParams) -> SamplingParams {
    SamplingParams {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        repetition_penalty: params.repetition_penalty,
        top_logprobs: params.logprobs.then_some(params.top_logprobs),
    }
}

impl LiveRequest {
    /// A request whose first choice is sequence `seq`.
    pub(super) fn new(
        sink: Sink,
        params: GenerationParams,
        prompt: &[u32],
        seq: SeqId,
        seed: u64,
        constraint: Option<Constraint>,
    ) -> Self {
        let sampler = SequenceSampler::new(sampling(&params), mix(&[seed, 0]), prompt);
        Self {
            sink: Some(sink),
            params,
            prompt_len: prompt.len() as u32,
            cached: None,
            completion: 0,
            choices: vec![Choice {
                seq,
                sampler,
                generated: 0,
                done: false,
                constraint,
                forced: Vec::new(),
                drafts: None,
            }],
            seed,
            last_finish: Finish::default(),
            failure: None,
            fast_forward: true,
            beams: None,
        }
    }

    /// Makes this request the continuation of choice `choice` of a request that delivered
    /// `output` elsewhere (see [`turnpike_engine_api::resume`]): its sampler takes that choice's
    /// seed and replays the output (penalties and the RNG's position), and its grammar advances
    /// through it. `prompt` is the original prompt, without the output.
    pub(super) fn resume(
        &mut self,
        prompt: &[u32],
        output: &[u32],
        choice: u32,
    ) -> Result<(), String> {
        let first = &mut self.choices[0];
        first.sampler = SequenceSampler::new(
            sampling(&self.params),
            mix(&[self.seed, u64::from(choice)]),
            prompt,
        );
        for &token in output {
            first.sampler.replay(token);
            if let Some(constraint) = first.constraint.as_mut() {
                constraint
                    .advance(token)
                    .map_err(|why| format!("the resumed output leaves the grammar: {why}"))?;
            }
        }
        Ok(())
    }

    /// Token counts so far.
    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            cached_prompt_tokens: self.cached.unwrap_or(0),
            completion_tokens: self.completion,
        }
    }

    /// Whether every choice has ended.
    pub(super) fn finished(&self) -> bool {
        self.choices.iter().all(|c| c.done)
    }

    /// Adds choices 1..n as copies of choice 0 (before it samples), each with its own RNG.
    pub(super) fn fork_choices(&mut self, mut next_seq: impl FnMut() -> SeqId) -> Vec<SeqId> {
        let n = self.params.n.max(1);
        let mut added = Vec::new();
        for i in 1..n {
            let sampler = self.choices[0]
                .sampler
                .fork(mix(&[self.seed, u64::from(i)]));
            let seq = next_seq();
            added.push(seq);
            let constraint = self.choices[0].constraint.as_ref().map(Constraint::fork);
            self.choices.push(Choice {
                seq,
                sampler,
                generated: 0,
                done: false,
                constraint,
                forced: Vec::new(),
                drafts: None,
            });
        }
        added
    }

    /// Samples choice `index` from its logits, sends the token (or ends the choice), and says
    /// which. `eos` are the model's end-of-sequence ids; `max_context` the window.
    /// `mask` is the choice's grammar mask when it was computed ahead (see [`Mask`]).
    pub(super) fn sample(
        &mut self,
        index: usize,
        logits: &mut [f32],
        eos: &[u32],
        max_context: u32,
        mask: Mask,
    ) -> Outcome {
        let banned = self.banned(index, eos);
        let allowed = match self.allowed(index, mask) {
            Ok(allowed) => allowed,
            Err(outcome) => return outcome,
        };
        if let Some(allowed) = allowed
            && let Err(why) = allowed.apply(logits)
        {
            return self.fail(why);
        }
        let choice = &mut self.choices[index];
        let sampled = choice.sampler.sample(logits, &banned);
        if let Some(constraint) = choice.constraint.as_mut()
            && let Err(why) = constraint.advance(sampled.token)
        {
            return self.fail(why);
        }
        let outcome = self.accept(index, sampled, eos, max_context);
        self.fast_forward(index, outcome, eos, max_context)
    }

    /// After a sampled token that `outcome` continues with, sends the tokens the choice's
    /// grammar forces next (within its `max_tokens` and the window), as if each had been
    /// sampled, and keeps them for the scheduler. Not when log probabilities are asked for:
    /// forced tokens have none.
    fn fast_forward(
        &mut self,
        index: usize,
        outcome: Outcome,
        eos: &[u32],
        max_context: u32,
    ) -> Outcome {
        let p = &self.params;
        if !self.fast_forward
            || !matches!(outcome, Outcome::Continue(_))
            || p.logprobs
            || p.top_logprobs > 0
        {
            return outcome;
        }
        let choice = &mut self.choices[index];
        let Some(constraint) = choice.constraint.as_mut() else {
            return outcome;
        };
        let room = p
            .max_tokens
            .saturating_sub(choice.generated)
            .min(max_context.saturating_sub(self.prompt_len + choice.generated));
        let forced = match constraint.fast_forward(room as usize) {
            Ok(forced) => forced,
            Err(why) => return self.fail(why),
        };
        for token in forced {
            self.choices[index].sampler.record(token);
            let sampled = Sampled {
                token,
                logprob: None,
                top_logprobs: Vec::new(),
            };
            match self.accept(index, sampled, eos, max_context) {
                Outcome::Continue(token) => self.choices[index].forced.push(token),
                ended => return ended,
            }
        }
        outcome
    }

    /// The tokens forced after choice `index`'s last sampled token, to append after it.
    pub(super) fn take_forced(&mut self, index: usize) -> Vec<u32> {
        std::mem::take(&mut self.choices[index].forced)
    }

    /// Choice `index`'s grammar mask: `mask` when computed ahead, else computed now; `None`
    /// without a grammar, the failure when the grammar allows nothing.
    fn allowed(&mut self, index: usize, mask: Mask) -> Result<Option<Allowed>, Outcome> {
        let mask = match mask {
            Some(mask) => Some(mask),
            None => self.choices[index]
                .constraint
                .as_mut()
                .map(Constraint::allowed),
        };
        match mask {
            None => Ok(None),
            Some(Ok(allowed)) => Ok(Some(allowed)),
            Some(Err(why)) => Err(self.fail(why)),
        }
    }

    /// Ends the request: it cannot go on, for `why`.
    fn fail(&mut self, why: String) -> Outcome {
        self.failure = Some(why);
        Outcome::Failed
    }

    /// What a device that samples needs for choice `index`: the uniform it draws with (the
    /// choice's RNG advances as in [`LiveRequest::sample`]), the penalty list into
    /// `penalties`, the banned tokens, and under a grammar the tokens it allows. `Err` is the
    /// outcome when the grammar allows nothing (the request then fails).
    pub(super) fn device_inputs(
        &mut self,
        index: usize,
        eos: &[u32],
        penalties: &mut Vec<(u32, u32)>,
        mask: Mask,
    ) -> Result<DeviceInputs, Outcome> {
        let banned = self.banned(index, eos);
        let allowed = self.allowed(index, mask)?;
        let uniform = self.choices[index].sampler.device_inputs(penalties);
        Ok(DeviceInputs {
            uniform,
            banned,
            allowed,
        })
    }

    /// Takes a token a device sampled for choice `index`, as [`LiveRequest::sample`] does.
    pub(super) fn accept_device(
        &mut self,
        index: usize,
        sampled: Sampled,
        eos: &[u32],
        max_context: u32,
    ) -> Outcome {
        let choice = &mut self.choices[index];
        choice.sampler.record(sampled.token);
        if let Some(constraint) = choice.constraint.as_mut()
            && let Err(why) = constraint.advance(sampled.token)
        {
            return self.fail(why);
        }
        let outcome = self.accept(index, sampled, eos, max_context);
        self.fast_forward(index, outcome, eos, max_context)
    }

    /// The tokens choice `index` may not pick yet: stop ids and (unless ignored) EOS while it is
    /// below `min_tokens`.
    fn banned(&self, index: usize, eos: &[u32]) -> Vec<u32> {
        let p = &self.params;
        let mut banned = Vec::new();
        if self.choices[index].generated < p.min_tokens {
            banned.extend(&p.stop_token_ids);
            if !p.ignore_eos {
                banned.extend(eos);
            }
        }
        banned
    }

    /// Sends a sampled token (or ends the choice) and says which.
    fn accept(&mut self, index: usize, sampled: Sampled, eos: &[u32], max_context: u32) -> Outcome {
        let p = &self.params;
        let choice = &mut self.choices[index];
        let below_min = choice.generated < p.min_tokens;
        let Sampled {
            token,
            logprob,
            top_logprobs,
        } = sampled;
        choice.generated += 1;
        self.completion += 1;
        let stops = p.stop_token_ids.contains(&token) || (!p.ignore_eos && eos.contains(&token));
        let several = p.n > 1;
        let finish = if stops && !below_min {
            Some(Finish::stop(token))
        } else {
            if let Some(sink) = self.sink.as_mut() {
                let top: Vec<TopLogprob> = top_logprobs
                    .iter()
                    .map(|&(token_id, logprob)| TopLogprob { token_id, logprob })
                    .collect();
                sink.token_with_logprobs(index as u32, token, logprob, &top);
            }
            let total = self.prompt_len + choice.generated;
            (choice.generated >= p.max_tokens || total >= max_context).then(Finish::length)
        };
        match finish {
            None => Outcome::Continue(token),
            Some(finish) => {
                choice.done = true;
                self.last_finish = finish;
                if several && let Some(sink) = self.sink.as_mut() {
                    sink.end_choice(index as u32, finish);
                }
                Outcome::Ended
            }
        }
    }
}
