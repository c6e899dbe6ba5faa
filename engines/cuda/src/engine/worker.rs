//! The engine loop: one thread per model that owns the scheduler, the device and every live
//! request. Each turn it takes new commands, plans a step, runs it on the device, samples, and
//! sends events. Requests join and leave between any two steps.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnpike_engine_api::plugin::{Host, Request, Sink};
use turnpike_engine_api::{Finish, Status, Usage};

use super::counters::Counters;
use super::request::LiveRequest;
use crate::device::{Batch, Device};
use crate::grammar::Constraint;
use crate::model::pooling::PoolingMode;
use crate::sampler::mix;
use crate::scheduler::{NewSequence, Scheduler, SchedulerStats, SeqId, StepPlan};
use crate::step;

/// A request the worker is to run, with its sink.
#[derive(Debug)]
pub(super) struct Submission {
    /// The request (already validated).
    pub request: Request,
    /// Where its events go.
    pub sink: Sink,
    /// Its grammar, compiled, when it has one.
    pub constraint: Option<Constraint>,
}

/// What the worker is asked to do.
#[derive(Debug)]
pub(super) enum Command {
    /// Run a request (already validated).
    Submit(Box<Submission>),
    /// Stop a request.
    Cancel(u64),
    /// Mean-pooled hidden states of each input.
    Embed(Vec<Vec<u32>>, SyncSender<Result<Vec<Vec<f32>>, String>>),
    /// End every request and stop.
    Stop,
}

/// What the worker publishes for `stats`: the scheduler's and the device's figures.
pub(super) type PublishedStats = (SchedulerStats, Vec<(&'static str, f64)>);

/// The worker's state.
pub(super) struct Worker {
    pub(super) device: Box<dyn Device>,
    /// Grammar-forced tokens are appended without sampling (`grammar_fast_forward`).
    pub(super) fast_forward: bool,
    /// How the model speculates, where it does ([`crate::speculative`]).
    pub(super) speculative: Option<crate::speculative::SpeculativeSettings>,
    /// The draft model, where drafts come from one (else from prompt lookup).
    pub(super) drafter: Option<super::draft_model::DraftModel>,
    /// What a drafted token costs, as a share of a step of the model (0 for prompt lookup).
    pub(super) draft_cost: f32,
    pub(super) scheduler: Scheduler,
    /// Where the prefix cache's KV events go (`kv_events`).
    pub(super) kv_events: Option<turnpike_kv_events::Publisher>,
    pub(super) eos: Vec<u32>,
    pub(super) vocab: usize,
    pub(super) max_context: u32,
    pub(super) seed: u64,
    pub(super) counters: Arc<Counters>,
    pub(super) stats: Arc<Mutex<Option<PublishedStats>>>,
    pub(super) host: Host,
    pub(super) requests: HashMap<u64, LiveRequest>,
    /// Sequence -> (request, choice index).
    pub(super) seqs: HashMap<SeqId, (u64, usize)>,
    pub(super) next_seq: SeqId,
    /// How embeddings pool token states.
    pub(super) pooling: PoolingMode,
}

impl Worker {
    /// Runs until `Stop` or until every sender is gone.
    pub(super) fn run(mut self, commands: Receiver<Command>) {
        loop {
            // Idle: sleep until a command comes. Busy: take what has come, then step.
            if self.scheduler.is_idle() {
                match commands.recv() {
                    Ok(command) => {
                        if self.handle(command) {
                            break;
                        }
                    }
                    // Every sender is gone: the engine was dropped.
                    Err(_) => break,
                }
            }
            if commands.try_iter().any(|command| self.handle(command)) {
                break;
            }
            if !self.scheduler.is_idle() {
                self.step();
            }
        }
        self.end_all();
        // Commands that came after `Stop`: their requests end cancelled, their embeds fail.
        for command in commands.try_iter() {
            match command {
                Command::Submit(submission) => {
                    self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
                    self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    submission.sink.cancelled(Usage::default());
                }
                Command::Embed(_, reply) => {
                    let _ = reply.send(Err("the engine is shutting down".into()));
                }
                Command::Cancel(_) | Command::Stop => {}
            }
        }
    }

    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit(submission) => {
                let Submission {
                    request,
                    sink,
                    constraint,
                } = *submission;
                self.admit(request, sink, constraint);
            }
            Command::Cancel(id) => self.cancel(id),
            Command::Embed(inputs, reply) => {
                let result = self
                    .device
                    .embed_batch(&inputs, self.pooling)
                    .map_err(|e| e.to_string());
                let _ = reply.send(result);
            }
            Command::Stop => return true,
        }
        false
    }

    fn admit(&mut self, request: Request, sink: Sink, constraint: Option<Constraint>) {
        let Request {
            id, prompt, params, ..
        } = request;
        let seed = match params.seed {
            Some(s) => mix(&[s]),
            None => mix(&[self.seed, id]),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let new = NewSequence {
            id: seq,
            tokens: prompt.clone(),
            priority: params.priority,
            tenant: params.tenant.clone().unwrap_or_default(),
            weight: params.tenant_weight.max(1),
        };
        if self.requests.contains_key(&id) {
            // The host promises unique ids; a repeat must not replace a live request.
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            sink.fail(
                Status::InvalidRequest,
                format!("request id {id} is already running"),
                Usage::default(),
            );
            return;
        }
        let zero_tokens = params.max_tokens == 0;
        // Drafts for requests of one choice: its positions are checked one after the other on
        // the host, where the choices of `n > 1` would have to follow each other.
        let drafts = self
            .speculative
            .as_ref()
            .filter(|_| params.n <= 1 && params.beam_width.is_none())
            .and_then(|s| {
                use crate::speculative::{DraftLength, MAX_DRAFT};
                match (
                    params.num_assistant_tokens,
                    params.assistant_confidence_threshold,
                ) {
                    // The threshold, not the acceptance, says where a draft ends.
                    (None, Some(_)) => Some(DraftLength::fixed(MAX_DRAFT)),
                    (None, None) => {
                        let length = DraftLength::new(s.tokens)
                            .copying(s.copy_tokens)
                            .costing(self.draft_cost);
                        Some(if self.drafts_pay() {
                            length
                        } else {
                            length.doubtful()
                        })
                    }
                    (Some(0), _) => None,
                    (Some(k), _) => Some(DraftLength::fixed(k as usize)),
                }
            });
        let resume = params.resume;
        let mut live = LiveRequest::new(sink, params, &prompt, seq, seed, constraint);
        live.fast_forward = self.fast_forward;
        live.choices[0].drafts = drafts;
        if let Some(resume) = resume {
            let resumed = resume
                .split(&prompt)
                .and_then(|(original, output)| live.resume(original, output, resume.choice));
            if let Err(why) = resumed {
                self.requests.insert(id, live);
                return self.end(id, Status::InvalidRequest, &why);
            }
        }
        if zero_tokens {
            live.last_finish = Finish::length();
            self.requests.insert(id, live);
            return self.end(id, Status::Ok, "");
        }
        let output = resume.map_or(0, |r| r.tokens as usize);
        match self.scheduler.add_resumed(new, output) {
            Ok(()) => {
                self.requests.insert(id, live);
                self.seqs.insert(seq, (id, 0));
            }
            Err(refused) => {
                self.requests.insert(id, live);
                self.end(id, Status::Overloaded, &refused.to_string());
            }
        }
    }

    /// Whether the draft model's drafts have paid for themselves so far (always, for prompt
    /// lookup, whose drafts cost next to nothing, and until enough were drafted to judge).
    /// A draft model must also see every token it drafts after: a sequence that drafts pays
    /// for that too, so new sequences of a model whose drafts do not pay start paused.
    fn drafts_pay(&self) -> bool {
        const JUDGED_AFTER: u64 = 64;
        let drafted = self.counters.drafted_tokens.load(Ordering::Relaxed);
        let accepted = self.counters.accepted_tokens.load(Ordering::Relaxed);
        self.drafter.is_none()
            || drafted < JUDGED_AFTER
            || crate::speculative::DraftLength::pays(
                self.draft_cost,
                accepted as f32 / drafted as f32,
            )
    }

    fn cancel(&mut self, id: u64) {
        if self.requests.contains_key(&id) {
            self.end(id, Status::Cancelled, "cancelled");
        }
    }

    /// Sends the FINAL of request `id` and forgets it and its sequences.
    pub(super) fn end(&mut self, id: u64, status: Status, message: &str) {
        let Some(mut live) = self.requests.remove(&id) else {
            return;
        };
        let beams = live.beams.iter().flat_map(|b| b.sequences());
        for seq in live.choices.iter().map(|c| c.seq).chain(beams) {
            self.scheduler.remove(seq);
            self.seqs.remove(&seq);
            if let Some(drafter) = &mut self.drafter {
                drafter.forget(seq);
            }
        }
        let usage = live.usage();
        let counter = match status {
            Status::Ok => &self.counters.completed,
            Status::Cancelled => &self.counters.cancelled,
            _ => &self.counters.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(sink) = live.sink.take() {
            match status {
                Status::Ok => sink.complete(live.last_finish, usage),
                Status::Cancelled => sink.cancelled(usage),
                other => sink.fail(other, message, usage),
            }
        }
        if self.scheduler.is_idle() {
            self.publish();
        }
    }

    fn step(&mut self) {
        self.step_once();
        if let Some(publisher) = &self.kv_events {
            publisher.publish(self.scheduler.take_kv_events());
        }
    }

    fn step_once(&mut self) {
        let plan = self.scheduler.schedule();
        if plan.chunks.is_empty() {
            // Nothing fits this step (every block is held); wait for a cancel or a finish.
            std::thread::sleep(Duration::from_millis(1));
            self.publish();
            return;
        }
        self.count_batch(&plan);
        let began = std::time::Instant::now();
        let copies = step::copies(&plan);
        let chunks = step::chunks(&plan);
        let result = self.device.forward(&Batch {
            copies: &copies,
            chunks: &chunks,
        });
        drop(chunks);
        match result {
            Ok(logits) => {
                self.scheduler.complete(&plan);
                self.sample_all(&plan, logits);
            }
            Err(e) => {
                self.host.error(&format!("device step failed: {e}"));
                self.fail_plan(&plan);
            }
        }
        let busy = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.counters.busy_micros.fetch_add(busy, Ordering::Relaxed);
        self.publish();
    }

    /// Ends every request of a step that could not be run or read.
    pub(super) fn fail_plan(&mut self, plan: &StepPlan) {
        let mut ids: Vec<u64> = plan
            .chunks
            .iter()
            .filter_map(|c| self.seqs.get(&c.seq).map(|&(id, _)| id))
            .collect();
        ids.dedup();
        for id in ids {
            self.end(
                id,
                Status::Internal,
                "the engine failed to run this request",
            );
        }
    }

    /// Adds a step's batch, by phase, to the counters.
    fn count_batch(&self, plan: &StepPlan) {
        let (mut prefill, mut prefill_tokens, mut decode, mut decode_tokens) = (0, 0, 0, 0);
        for chunk in &plan.chunks {
            if chunk.generated {
                decode += 1;
                decode_tokens += chunk.tokens.len() as u64;
            } else {
                prefill += 1;
                prefill_tokens += chunk.tokens.len() as u64;
            }
        }
        let c = &self.counters;
        c.steps.fetch_add(1, Ordering::Relaxed);
        c.prefill_sequences.fetch_add(prefill, Ordering::Relaxed);
        c.decode_sequences.fetch_add(decode, Ordering::Relaxed);
        c.prefill_tokens
            .fetch_add(prefill_tokens, Ordering::Relaxed);
        c.decode_tokens.fetch_add(decode_tokens, Ordering::Relaxed);
        c.last_prefill_batch.store(prefill, Ordering::Relaxed);
        c.last_decode_batch.store(decode, Ordering::Relaxed);
    }

    fn publish(&self) {
        if let Ok(mut slot) = self.stats.lock() {
            let mut device = self.device.stats();
            if let Some(drafter) = &self.drafter {
                let (used, total, seqs) = drafter.usage();
                device.push(("spec_draft_kv_blocks_used", used as f64));
                device.push(("spec_draft_kv_blocks_total", total as f64));
                device.push(("spec_draft_sequences", seqs as f64));
            }
            *slot = Some((self.scheduler.stats(), device));
        }
    }

    fn end_all(&mut self) {
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.end(id, Status::Cancelled, "the engine is shutting down");
        }
        self.publish();
    }
}
