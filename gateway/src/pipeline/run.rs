//! Running a generation: one engine request per prompt, their events merged into per-choice text
//! (detokenized, stop strings applied, log probabilities attached) and finally the usage.
//!
//! This is the one stream every response is made from: streamed responses render its events as
//! they come, non-streamed ones fold it ([`super::fold`]). Dropping it cancels every engine
//! request still running; a request whose choices have all ended, one of them at a stop string,
//! is cancelled early, and its FINAL still read so usage stays exact.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio_util::sync::WaitForCancellationFutureOwned;
use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::{EngineError, EngineEvent, GenerationParams, Status, TokenEvent};

use crate::engine_host::{EngineRun, ServedModel};
use crate::error::ApiError;
use crate::lifecycle::Lifecycle;
use crate::text::decode::IncrementalDecoder;
use crate::text::reasoning::{ReasoningMarkers, ReasoningSplitter};
use crate::text::stop::{StopMatcher, StopOutcome};
use crate::text::tools::{ToolCallFormat, ToolCallParser, ToolOutput};

use super::engine_spans::EngineSpans;
pub(crate) use super::events::{Finished, GenEvent, ServerToolRun, TokenLogprob, Totals};
use super::validate::OutputCheck;

/// What to generate.
#[derive(Debug)]
pub(crate) struct Job {
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
    /// Parse tool calls out of the text.
    pub tools: Option<ToolSetup>,
    /// Split reasoning out of the text (a chat request to a model with reasoning markers).
    pub reasoning: Option<ReasoningMarkers>,
    /// Check each answer's shape (structured output the engine could not constrain).
    pub check: Option<OutputCheck>,
}

/// How to find tool calls in a choice's text.
#[derive(Debug, Clone)]
pub(crate) struct ToolSetup {
    /// The model's format.
    pub format: ToolCallFormat,
    /// The functions offered.
    pub names: Vec<String>,
    /// Most calls per choice.
    pub max_calls: usize,
    /// The request forces a call (a cut one is still returned as a call).
    pub forced: bool,
}

struct ChoiceState {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolCallParser>,
    calls: u32,
    /// The calls this choice made (name and arguments), to know a repeat.
    made: Vec<(String, String)>,
    /// It began to repeat a call it made: the answer ends there.
    repeated: bool,
    finished: bool,
}

struct PromptRun {
    run: EngineRun,
    first_choice: u32,
    open_choices: u32,
    /// A choice of this request was cut by a stop string (so a cancel is ours, not a failure).
    stop_cut: bool,
    cancelled: bool,
    ended: bool,
}

/// The merged events of a generation.
pub(crate) struct GenStream {
    model: Arc<ServedModel>,
    /// Which route and engine of a routed model took it.
    pub(crate) route: Option<String>,
    runs: Vec<PromptRun>,
    choices: Vec<ChoiceState>,
    /// Choices per prompt.
    n: usize,
    logprobs: bool,
    retry_after: Duration,
    pending: VecDeque<GenEvent>,
    totals: Totals,
    next_run: usize,
    /// An engine event has arrived.
    started: bool,
    done: bool,
    /// Tokens the engines sent (also those of choices already cut), for settling on cancel.
    tokens_seen: u64,
    /// The shape each answer must have, when checked here.
    check: Option<OutputCheck>,
    /// Completes when the server cuts running generations on shutdown.
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    /// The trace spans of the engine's part, when traced.
    spans: Option<EngineSpans>,
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
pub(crate) fn start(job: Job, lifecycle: &Lifecycle) -> Result<GenStream, ApiError> {
    let n = job.params.n;
    let prompt_tokens = job.prompts.iter().map(|p| p.len() as u64).sum();
    let spans = EngineSpans::start(&job.model.id, prompt_tokens);
    let trace_context = spans
        .as_ref()
        .and_then(|s| crate::observability::traces::traceparent(&s.engine));
    let mut runs = Vec::with_capacity(job.prompts.len());
    let mut choices = Vec::with_capacity(job.prompts.len() * n as usize);
    let mut totals = Totals::default();
    for (i, prompt) in job.prompts.into_iter().enumerate() {
        totals.prompt += prompt.len() as u64;
        let request = EngineRequest {
            model: job.model.info.id.clone(),
            prompt,
            params: job.params.clone(),
            trace_context: trace_context.clone(),
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
            stop_cut: false,
            cancelled: false,
            ended: false,
        });
        for _ in 0..n {
            choices.push(ChoiceState {
                // A tool-call envelope made of special tokens (mistral) must reach the parser.
                decoder: IncrementalDecoder::new(
                    Arc::clone(&job.model.tokenizer),
                    !job.tools
                        .as_ref()
                        .is_some_and(|t| t.format.needs_special_tokens()),
                ),
                stop: StopMatcher::new(&job.stop),
                reasoning: job.reasoning.clone().map(ReasoningSplitter::new),
                tools: job.tools.as_ref().map(|t| {
                    let parser = ToolCallParser::new(t.format, t.names.clone(), t.max_calls);
                    if t.forced { parser.forced() } else { parser }
                }),
                calls: 0,
                made: Vec::new(),
                repeated: false,
                finished: false,
            });
        }
    }
    Ok(GenStream {
        model: job.model,
        route: runs.first().and_then(|r| r.run.route.clone()),
        runs,
        choices,
        n: n as usize,
        logprobs: job.logprobs,
        retry_after: job.retry_after,
        pending: VecDeque::new(),
        totals,
        next_run: 0,
        started: false,
        done: false,
        tokens_seen: 0,
        check: job.check,
        cut: Box::pin(lifecycle.cut_signal()),
        spans,
    })
}

impl GenStream {
    /// Whether any engine has sent an event yet (so it accepted the work and is under way).
    pub(crate) fn engine_started(&self) -> bool {
        self.started
    }

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

    /// Sends text of choice `c` on: its reasoning apart (when the model has reasoning markers;
    /// `tokens` made the text and count as reasoning if it was), the answer through its
    /// tool-call parser when it has one (which `last` flushes); log probabilities ride with the
    /// first piece, or alone when the parser holds all.
    fn emit_text(
        &mut self,
        c: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
        last: bool,
        tokens: u64,
    ) {
        let choice = c as u32;
        let text = match self.choices[c].reasoning.as_mut() {
            Some(splitter) => {
                let split = splitter.push(&text, last);
                if split.reasoned {
                    self.totals.reasoning += tokens;
                }
                if !split.reasoning.is_empty() {
                    self.pending.push_back(GenEvent::Reasoning {
                        choice,
                        text: split.reasoning,
                    });
                }
                split.answer
            }
            None => text,
        };
        let state = &mut self.choices[c];
        let Some(parser) = state.tools.as_mut() else {
            if !text.is_empty() || !logprobs.is_empty() {
                self.pending.push_back(GenEvent::Text {
                    choice,
                    text,
                    logprobs,
                });
            }
            return;
        };
        let mut out = Vec::new();
        parser.push(&text, &mut out);
        if last {
            parser.finish(&mut out);
        }
        let mut logprobs = Some(logprobs).filter(|l| !l.is_empty());
        for piece in out {
            match piece {
                ToolOutput::Text(text) => self.pending.push_back(GenEvent::Text {
                    choice,
                    text,
                    logprobs: logprobs.take().unwrap_or_default(),
                }),
                ToolOutput::Call(call) => {
                    // A call the choice made already is never a new one: a small model forced
                    // to call tools repeats its call until max_tokens. The answer ends here.
                    let seen = (call.name.clone(), call.arguments.clone());
                    if state.repeated || state.made.contains(&seen) {
                        state.repeated = true;
                        continue;
                    }
                    state.made.push(seen);
                    self.pending.push_back(GenEvent::ToolCall {
                        choice,
                        index: state.calls,
                        id: crate::ids::new_id("call_"),
                        name: call.name,
                        arguments: call.arguments,
                    });
                    state.calls += 1;
                }
            }
        }
        if let Some(logprobs) = logprobs {
            self.pending.push_back(GenEvent::Text {
                choice,
                text: String::new(),
                logprobs,
            });
        }
    }

    /// Marks choice `c` ended for `reason` (`tool_calls` when it stopped after calling tools).
    fn push_finish(&mut self, c: usize, reason: Finished) {
        let reason = match reason {
            Finished::Stop if self.choices[c].calls > 0 => Finished::ToolCalls,
            other => other,
        };
        self.pending.push_back(GenEvent::Finish {
            choice: c as u32,
            reason,
        });
    }

    /// Ends choice `c` (flushing what the decoder, stop matcher and parser hold) with `reason`,
    /// or with `stop` when the flushed text completes a stop string.
    fn end_choice(&mut self, c: usize, reason: Finished) {
        let state = &mut self.choices[c];
        if state.finished {
            return;
        }
        state.finished = true;
        let tail = state.decoder.flush();
        let (text, reason) = match state.stop.push(&tail) {
            StopOutcome::Text(mut t) => {
                t.push_str(&state.stop.finish());
                (t, reason)
            }
            StopOutcome::Stopped(t, i) => (t, Finished::StopString(i as u32)),
        };
        self.emit_text(c, text, Vec::new(), true, 0);
        self.push_finish(c, reason);
    }

    /// The index of choice `choice` of request `run`, when the engine named a real one.
    fn choice_index(&self, run: usize, choice: u32) -> Option<usize> {
        if choice as usize >= self.n {
            tracing::warn!(model = %self.model.id, choice, "engine sent an event for a choice it was not asked for");
            return None;
        }
        Some(self.runs[run].first_choice as usize + choice as usize)
    }

    /// Counts a choice of request `run` as closed; once all are, and one was cut by a stop
    /// string while the engine still runs, the engine work left is cancelled.
    fn choice_closed(&mut self, run: usize) {
        let r = &mut self.runs[run];
        r.open_choices = r.open_choices.saturating_sub(1);
        if r.open_choices == 0 && r.stop_cut && !r.cancelled && !r.ended {
            r.cancelled = true;
            r.run.cancel();
        }
    }

    fn on_token(&mut self, run: usize, t: TokenEvent) {
        let Some(c) = self.choice_index(run, t.choice) else {
            return;
        };
        if self.choices[c].finished {
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
                self.emit_text(c, text, logprobs, false, 1);
                if self.choices[c].repeated {
                    // Ends as a stop after calls (`tool_calls`); the engine's work is cut.
                    self.choices[c].finished = true;
                    self.push_finish(c, Finished::Stop);
                    self.runs[run].stop_cut = true;
                    self.choice_closed(run);
                }
            }
            StopOutcome::Stopped(text, index) => {
                state.finished = true;
                self.emit_text(c, text, logprobs, true, 1);
                self.push_finish(c, Finished::StopString(index as u32));
                self.runs[run].stop_cut = true;
                self.choice_closed(run);
            }
        }
    }

    /// The tokens used so far: the prompts' and every token the engines sent (also those of
    /// choices already cut), or the engines' own count once it is larger.
    pub(crate) fn tokens_used(&self) -> u64 {
        self.totals.prompt + self.tokens_seen.max(self.totals.completion)
    }

    fn on_event(&mut self, run: usize, event: EngineEvent) {
        self.started = true;
        if matches!(event, EngineEvent::Token(_)) {
            self.tokens_seen += 1;
        }
        match event {
            EngineEvent::Token(t) => self.on_token(run, t),
            EngineEvent::ChoiceEnd { choice, finish } => {
                let Some(c) = self.choice_index(run, choice) else {
                    return;
                };
                if !self.choices[c].finished {
                    self.end_choice(c, Finished::from_engine(finish));
                    self.choice_closed(run);
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
                if let Some(broken) = this.check.as_mut().and_then(|c| c.observe(&event)) {
                    // The answer breaks its shape: the generation ends here, with the error.
                    this.done = true;
                    this.pending.clear();
                    return Poll::Ready(Some(GenEvent::Error(broken)));
                }
                return Poll::Ready(Some(event));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if this.runs.iter().all(|r| r.ended) {
                this.done = true;
                if let Some(spans) = this.spans.take() {
                    spans
                        .engine
                        .record("completion_tokens", this.totals.completion as i64);
                }
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
                        if let Some(spans) = this.spans.as_mut() {
                            spans.first_event();
                        }
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
                if this.cut.as_mut().poll(cx).is_ready() {
                    // Shutting down: the protocol renders this as its own failure event, and
                    // dropping the stream cancels the engine requests.
                    this.done = true;
                    return Poll::Ready(Some(GenEvent::Error(ApiError::ShuttingDown {
                        retry_after: this.retry_after,
                    })));
                }
                return Poll::Pending;
            }
        }
    }
}
