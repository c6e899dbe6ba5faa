//! Running a generation: one engine request per prompt, their events merged into per-choice text
//! (detokenized, stop strings applied, log probabilities attached) and finally the usage.
//!
//! This is the one stream every response is made from: streamed responses render its events as
//! they come, non-streamed ones fold it ([`super::fold`]). Dropping it cancels every engine
//! request still running; a request whose choices all hit stop strings is cancelled early, and
//! its FINAL still read so usage stays exact.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::{
    EngineError, EngineEvent, Finish, FinishReason, GenerationParams, Status, TokenEvent,
};

use super::decode::IncrementalDecoder;
use super::stop::{StopMatcher, StopOutcome};
use crate::engine_host::{EngineRun, ServedModel};
use crate::error::ApiError;

/// What to generate.
#[derive(Debug)]
pub struct Job {
    /// The model.
    pub model: Arc<ServedModel>,
    /// Prompt token ids, one engine request each.
    pub prompts: Vec<Vec<u32>>,
    /// Parameters of every request (`n` choices each).
    pub params: GenerationParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Attach log probabilities to text.
    pub logprobs: bool,
    /// `retry-after` for engine overload.
    pub retry_after: Duration,
}

/// One token's log probability, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (its bytes, lossily).
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: f32,
    /// Alternatives: text, bytes, log probability.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Why a choice ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// End of turn, stop token, or stop string.
    Stop,
    /// `max_tokens` or the context window.
    Length,
}

impl Finished {
    /// `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }

    fn from_engine(finish: Finish) -> Self {
        match finish.reason {
            Some(FinishReason::Length) => Self::Length,
            _ => Self::Stop,
        }
    }
}

/// Token counts of the whole generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Prompt tokens (counted here).
    pub prompt: u64,
    /// Generated tokens (counted by the engine).
    pub completion: u64,
    /// Prompt tokens served from the engine's cache.
    pub cached: u64,
}

/// What a generation yields.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// New text of a choice, with the log probabilities of the tokens that made it.
    Text {
        /// Choice index (prompt index times `n`, plus the choice).
        choice: u32,
        /// The text (may be empty when only log probabilities are new).
        text: String,
        /// Per token, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// A choice ended.
    Finish {
        /// Choice index.
        choice: u32,
        /// Why.
        reason: Finished,
    },
    /// Everything ended; the last event.
    Usage(Totals),
    /// The engine failed after the response began; the last event.
    Error(ApiError),
}

struct ChoiceState {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    finished: bool,
}

struct PromptRun {
    run: EngineRun,
    first_choice: u32,
    open_choices: u32,
    cancelled: bool,
    ended: bool,
}

/// The merged events of a generation.
pub struct GenStream {
    model: Arc<ServedModel>,
    runs: Vec<PromptRun>,
    choices: Vec<ChoiceState>,
    /// Choices per prompt.
    n: usize,
    logprobs: bool,
    retry_after: Duration,
    pending: VecDeque<GenEvent>,
    totals: Totals,
    next_run: usize,
    done: bool,
}

impl std::fmt::Debug for GenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenStream")
            .field("model", &self.model.id)
            .field("runs", &self.runs.len())
            .finish()
    }
}

/// Starts every engine request; an engine refusal is an error before any response is sent.
pub fn start(job: Job) -> Result<GenStream, ApiError> {
    let n = job.params.n;
    let mut runs = Vec::with_capacity(job.prompts.len());
    let mut choices = Vec::with_capacity(job.prompts.len() * n as usize);
    let mut totals = Totals::default();
    for (i, prompt) in job.prompts.into_iter().enumerate() {
        totals.prompt += prompt.len() as u64;
        let request = EngineRequest {
            model: job.model.info.id.clone(),
            prompt,
            params: job.params.clone(),
        };
        // On refusal, dropping `runs` cancels the requests already started.
        let run = job
            .model
            .backend
            .submit(&request)
            .map_err(|e| ApiError::from_engine(e, job.retry_after))?;
        runs.push(PromptRun {
            run,
            first_choice: i as u32 * n,
            open_choices: n,
            cancelled: false,
            ended: false,
        });
        for _ in 0..n {
            choices.push(ChoiceState {
                decoder: IncrementalDecoder::new(Arc::clone(&job.model.tokenizer), true),
                stop: StopMatcher::new(&job.stop),
                finished: false,
            });
        }
    }
    Ok(GenStream {
        model: job.model,
        runs,
        choices,
        n: n as usize,
        logprobs: job.logprobs,
        retry_after: job.retry_after,
        pending: VecDeque::new(),
        totals,
        next_run: 0,
        done: false,
    })
}

impl GenStream {
    fn token_logprob(&self, t: &TokenEvent) -> Option<TokenLogprob> {
        let logprob = t.logprob?;
        let tokenizer = &self.model.tokenizer;
        let describe = |id: u32| {
            let bytes = tokenizer.token_bytes(id);
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (token, bytes) = describe(t.token_id);
        let top = t
            .top_logprobs
            .iter()
            .map(|a| {
                let (text, bytes) = describe(a.token_id);
                (text, bytes, a.logprob)
            })
            .collect();
        Some(TokenLogprob {
            token,
            bytes,
            logprob,
            top,
        })
    }

    /// Ends choice `c` (flushing what the decoder and stop matcher hold) with `reason`.
    fn end_choice(&mut self, c: usize, reason: Finished) {
        let state = &mut self.choices[c];
        if state.finished {
            return;
        }
        state.finished = true;
        let tail = state.decoder.flush();
        let mut text = match state.stop.push(&tail) {
            StopOutcome::Text(t) => t,
            StopOutcome::Stopped(t) => t,
        };
        text.push_str(&state.stop.finish());
        if !text.is_empty() {
            self.pending.push_back(GenEvent::Text {
                choice: c as u32,
                text,
                logprobs: Vec::new(),
            });
        }
        self.pending.push_back(GenEvent::Finish {
            choice: c as u32,
            reason,
        });
    }

    fn on_token(&mut self, run: usize, t: TokenEvent) {
        let c = (self.runs[run].first_choice + t.choice) as usize;
        if self.choices.get(c).is_none_or(|s| s.finished) {
            return;
        }
        let logprobs: Vec<TokenLogprob> = if self.logprobs {
            self.token_logprob(&t).into_iter().collect()
        } else {
            Vec::new()
        };
        let state = &mut self.choices[c];
        let piece = state.decoder.push(t.token_id);
        match state.stop.push(&piece) {
            StopOutcome::Text(text) => {
                if !text.is_empty() || !logprobs.is_empty() {
                    self.pending.push_back(GenEvent::Text {
                        choice: c as u32,
                        text,
                        logprobs,
                    });
                }
            }
            StopOutcome::Stopped(text) => {
                state.finished = true;
                if !text.is_empty() || !logprobs.is_empty() {
                    self.pending.push_back(GenEvent::Text {
                        choice: c as u32,
                        text,
                        logprobs,
                    });
                }
                self.pending.push_back(GenEvent::Finish {
                    choice: c as u32,
                    reason: Finished::Stop,
                });
                let r = &mut self.runs[run];
                r.open_choices -= 1;
                if r.open_choices == 0 && !r.cancelled {
                    r.cancelled = true;
                    r.run.cancel();
                }
            }
        }
    }

    fn on_event(&mut self, run: usize, event: EngineEvent) {
        match event {
            EngineEvent::Token(t) => self.on_token(run, t),
            EngineEvent::ChoiceEnd { choice, finish } => {
                let c = (self.runs[run].first_choice + choice) as usize;
                if c < self.choices.len() {
                    self.end_choice(c, Finished::from_engine(finish));
                }
            }
            EngineEvent::Final(fin) => {
                let r = &mut self.runs[run];
                r.ended = true;
                self.totals.completion += u64::from(fin.usage.completion_tokens);
                self.totals.cached += u64::from(fin.usage.cached_prompt_tokens);
                let (first, cancelled) = (r.first_choice as usize, r.cancelled);
                let n = self.n;
                let ok = fin.status == Status::Ok || (fin.status == Status::Cancelled && cancelled);
                if ok {
                    for c in first..first + n {
                        self.end_choice(c, Finished::from_engine(fin.finish));
                    }
                } else {
                    let error = ApiError::from_engine(
                        EngineError::new(fin.status, fin.message),
                        self.retry_after,
                    );
                    self.pending.push_back(GenEvent::Error(error));
                    self.done = true;
                    self.runs.clear(); // cancels the others
                }
            }
        }
    }
}

impl Stream for GenStream {
    type Item = GenEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GenEvent>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(event));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if this.runs.iter().all(|r| r.ended) {
                this.done = true;
                this.pending.push_back(GenEvent::Usage(this.totals));
                continue;
            }
            let count = this.runs.len();
            let mut progressed = false;
            for k in 0..count {
                let i = (this.next_run + k) % count;
                if this.runs[i].ended {
                    continue;
                }
                match this.runs[i].run.events.as_mut().poll_next(cx) {
                    Poll::Ready(Some(event)) => {
                        this.next_run = (i + 1) % count;
                        this.on_event(i, event);
                        progressed = true;
                        break;
                    }
                    Poll::Ready(None) => {
                        // The bridge always ends with a FINAL; a stream that does not is broken.
                        this.on_event(
                            i,
                            EngineEvent::Final(turnpike_engine_api::FinalEvent::failed(
                                Status::Internal,
                                "engine stream ended without a final event",
                                Default::default(),
                            )),
                        );
                        progressed = true;
                        break;
                    }
                    Poll::Pending => {}
                }
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }
}
