//! One served model: its device, its worker thread and the checks a request passes before it
//! is accepted. [`ModelRuntime`] is what the plugin's entry points talk to.

mod beam_groups;
mod beam_step;
mod beams;
mod config;
mod counters;
mod draft_load;
mod draft_model;
mod open;
mod request;
mod sampling;
mod speculation;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Value, json};
use turnpike_engine_api::plugin::{Host, Request, Sink};
use turnpike_engine_api::{Capabilities, EngineError, ModelInfo};

pub use config::{DeviceChoice, EngineSettings};
pub(crate) use config::{KvBudget, ModelSettings, available_memory};
use counters::Counters;
use open::open_device;
use worker::{Command, PublishedStats, Submission, Worker};

use crate::grammar::Grammars;
use crate::model::ModelFolder;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// A model being served.
#[derive(Debug)]
pub(crate) struct ModelRuntime {
    info: ModelInfo,
    device: &'static str,
    num_blocks: u32,
    block_size: u32,
    max_queued: u64,
    max_n: u32,
    commands: Mutex<Sender<Command>>,
    counters: Arc<Counters>,
    stats: Arc<Mutex<Option<PublishedStats>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The grammar compiler, where the model can be constrained (see [`grammars_for`]).
    grammars: Option<Grammars>,
    /// Whether its embeddings are L2-normalised (see [`crate::model::pooling`]).
    normalize: bool,
    /// Its KV-event publisher's counters (`kv_events`), read live.
    kv_events: Option<Arc<turnpike_kv_events::PublisherStats>>,
}

/// The grammar compiler for a model (built on first use), or `None` without the model's
/// `tokenizer.json`. Either device applies the masks: the CPU's on the host logits, the
/// CUDA device's in its sampling kernel.
fn grammars_for(folder: &ModelFolder) -> Option<Grammars> {
    let tokenizer = folder.tokenizer.as_ref()?;
    Some(Grammars::new(
        tokenizer,
        folder.spec.vocab_size,
        &folder.eos_token_ids,
    ))
}

impl ModelRuntime {
    /// Loads the model and starts its worker.
    pub(crate) fn start(
        settings: &ModelSettings,
        seed: u64,
        host: &Host,
    ) -> Result<Self, EngineError> {
        let fail = |e: String| EngineError::invalid_config(format!("model `{}`: {e}", settings.id));
        let mut folder = ModelFolder::open(&settings.path).map_err(|e| fail(e.to_string()))?;
        if let Some(why) = &folder.tokenizer_error {
            // Served without a tokenizer the model would be listed by no gateway.
            return Err(fail(format!("its vocabulary cannot be used: {why}")));
        }
        let max_context = settings
            .max_context
            .map_or(folder.spec.max_context, |c| c.min(folder.spec.max_context));
        // The devices size rotary scaling by the context served (LongRoPE's factors).
        folder.spec.max_context = max_context;
        // The draft first: on a GPU the target's cache takes a share of what is left.
        let drafter = draft_load::load_draft(settings, &folder, host)?;
        let device = open_device(settings, &folder, host)?;
        let grammars = grammars_for(&folder);
        let num_blocks = device.num_blocks();
        let min_blocks = max_context.div_ceil(settings.block_size as usize);
        if (num_blocks as usize) < min_blocks {
            return Err(fail(format!(
                "the KV cache budget holds {num_blocks} blocks; one full context of {max_context} tokens needs {min_blocks}"
            )));
        }
        let scheduler_config = SchedulerConfig {
            max_batch_tokens: settings.max_batch_tokens,
            max_running: settings.max_running,
            // Requests are bounded in `submit`; the scheduler also queues preempted sequences
            // and the n choices of each request, which must never be refused after acceptance.
            max_waiting: (settings.max_running + settings.max_waiting) * settings.max_n as usize,
            block_size: settings.block_size,
            num_blocks,
        };
        scheduler_config.validate().map_err(fail)?;
        let device_name = device.name();
        host.info(&format!(
            "model `{}` loaded from {} on the {device_name}: {} KV blocks of {} tokens, context {max_context}",
            settings.id,
            folder.path.display(),
            num_blocks,
            settings.block_size
        ));
        let mut scheduler = Scheduler::new(scheduler_config);
        let kv_events = match &settings.kv_events {
            Some(k) => {
                let publisher = turnpike_kv_events::Publisher::bind(&k.endpoint, &k.topic, k.queue)
                    .map_err(|e| fail(format!("kv_events.endpoint `{}`: {e}", k.endpoint)))?;
                scheduler.enable_kv_events(crate::kv::events::EventLog::new(
                    &k.hash_seed,
                    settings.block_size as usize,
                ));
                host.info(&format!(
                    "model `{}`: KV events on tcp://{} (topic `{}`)",
                    settings.id, publisher.local_addr, k.topic
                ));
                Some(publisher)
            }
            None => None,
        };
        let kv_events_stats = kv_events.as_ref().map(|p| Arc::clone(&p.stats));
        let counters = Arc::new(Counters::default());
        let stats = Arc::new(Mutex::new(None));
        let speculative = settings.speculative.clone();
        let speculates = speculative.is_some();
        let draft_confidence = drafter.is_some();
        let draft_cost = drafter.as_ref().map_or(0.0, |d| d.cost());
        if let Some(drafter) = &drafter {
            host.info(&format!(
                "model `{}`: a drafted token costs {:.2} of a step; drafting pauses below that acceptance",
                settings.id,
                drafter.cost()
            ));
        }
        let worker = Worker {
            device,
            fast_forward: settings.grammar_fast_forward,
            speculative,
            drafter,
            draft_cost,
            scheduler,
            kv_events,
            eos: folder.eos_token_ids.clone(),
            vocab: folder.spec.vocab_size,
            max_context: max_context as u32,
            seed,
            counters: Arc::clone(&counters),
            stats: Arc::clone(&stats),
            host: host.clone(),
            requests: HashMap::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            pooling: folder.pooling.mode,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("turnpike-engine-{}", settings.id))
            .spawn(move || worker.run(rx))
            .map_err(|e| EngineError::internal(format!("cannot start the engine thread: {e}")))?;
        let info = ModelInfo {
            id: settings.id.clone(),
            owned_by: settings.owned_by.clone(),
            max_context: max_context as u32,
            vocab_size: folder.spec.vocab_size as u32,
            eos_token_ids: folder.eos_token_ids.clone(),
            tokenizer: folder.tokenizer.as_ref().map(|p| p.display().to_string()),
            embedding_dim: Some(folder.spec.hidden_size as u32),
            capabilities: Capabilities {
                generation: folder.encoder.is_none(),
                max_n: settings.max_n,
                logprobs: true,
                max_top_logprobs: turnpike_engine_api::json::MAX_TOP_LOGPROBS,
                sampling: true,
                penalties: true,
                grammar: grammars.is_some(),
                tool_call_grammar: false,
                speculative: speculates,
                draft_confidence,
                // Beams are sequences, as many as a request's choices may be.
                max_beam_width: if settings.max_n > 1 {
                    settings.max_n
                } else {
                    0
                },
                resume: true,
            },
        };
        Ok(Self {
            info,
            device: device_name,
            num_blocks,
            block_size: settings.block_size,
            max_queued: (settings.max_running + settings.max_waiting) as u64,
            max_n: settings.max_n,
            commands: Mutex::new(tx),
            counters,
            stats,
            thread: Mutex::new(Some(thread)),
            grammars,
            normalize: folder.pooling.normalize,
            kv_events: kv_events_stats,
        })
    }

    /// What `models` reports.
    pub(crate) fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn send(&self, command: Command) -> Result<(), EngineError> {
        let tx = self
            .commands
            .lock()
            .map_err(|_| EngineError::internal("the engine's command channel is poisoned"))?;
        tx.send(command).map_err(|_| {
            EngineError::new(
                turnpike_engine_api::Status::Unavailable,
                "the engine has stopped",
            )
        })
    }

    /// Checks a request and hands it to the worker.
    pub(crate) fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError> {
        let params = &request.params;
        if let Some(width) = params.beam_width {
            if width > self.info.capabilities.max_beam_width {
                return Err(EngineError::unsupported(format!(
                    "model `{}` searches at most {} beams, asked for {width}",
                    self.info.id, self.info.capabilities.max_beam_width
                )));
            }
            if params.grammar.is_some() || params.top_logprobs > 0 {
                return Err(EngineError::unsupported(
                    "beam search takes neither a grammar nor top_logprobs",
                ));
            }
        }
        if params.assistant_confidence_threshold.is_some()
            && !self.info.capabilities.draft_confidence
        {
            return Err(EngineError::unsupported(format!(
                "model `{}` has no draft model whose confidence ends a draft",
                self.info.id
            )));
        }
        self.check(
            &request.prompt,
            params.n.max(params.beam_width.unwrap_or(1)),
        )?;

        let constraint = match (&params.grammar, &self.grammars) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(EngineError::unsupported(format!(
                    "model `{}` cannot constrain its output by a grammar",
                    self.info.id
                )));
            }
            (Some(grammar), Some(grammars)) => Some(grammars.constraint(grammar)?),
        };
        let in_flight = self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        if in_flight >= self.max_queued {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineError::overloaded(format!(
                "model `{}` has {in_flight} requests in flight, its limit",
                self.info.id
            )));
        }
        let sent = self.send(Command::Submit(Box::new(Submission {
            request,
            sink,
            constraint,
        })));
        if sent.is_err() {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        sent
    }

    fn check(&self, prompt: &[u32], n: u32) -> Result<(), EngineError> {
        let vocab = self.info.vocab_size;
        if prompt.is_empty() {
            return Err(EngineError::invalid_request("the prompt is empty"));
        }
        if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::invalid_request(format!(
                "prompt token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if prompt.len() >= self.info.max_context as usize {
            return Err(EngineError::invalid_request(format!(
                "the prompt has {} tokens; model `{}` has a context of {}",
                prompt.len(),
                self.info.id,
                self.info.max_context
            )));
        }
        if n > self.max_n {
            return Err(EngineError::unsupported(format!(
                "n is {n}; model `{}` allows at most {}",
                self.info.id, self.max_n
            )));
        }
        Ok(())
    }

    /// Stops a request (idempotent).
    pub(crate) fn cancel(&self, id: u64) {
        let _ = self.send(Command::Cancel(id));
    }

    /// Whether its embeddings are L2-normalised.
    pub(crate) fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Pooled last hidden states of each input, computed between steps.
    pub(crate) fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, EngineError> {
        for tokens in &inputs {
            self.check(tokens, 1)?;
        }
        let (tx, rx): (SyncSender<_>, _) = std::sync::mpsc::sync_channel(1);
        self.send(Command::Embed(inputs, tx))?;
        rx.recv()
            .map_err(|_| EngineError::internal("the engine stopped while embedding"))?
            .map_err(EngineError::internal)
    }

    /// Counters and cache statistics.
    pub(crate) fn stats(&self) -> (u64, u64, u64, Value) {
        let c = &self.counters;
        let mut extra = json!({
            "device": self.device,
            "kv_blocks_total": self.num_blocks,
            "kv_block_size": self.block_size,
        });
        if let Ok(slot) = self.stats.lock()
            && let Some((s, device)) = slot.as_ref()
        {
            for &(key, value) in device {
                extra[key] = json!(value);
            }
            extra["waiting"] = json!(s.waiting);
            extra["running"] = json!(s.running);
            extra["prefilling"] = json!(s.prefilling);
            extra["decoding"] = json!(s.running - s.prefilling);
            extra["preemptions"] = json!(s.preemptions);
            extra["kv_blocks_used"] = json!(s.kv.used);
            extra["kv_blocks_cached"] = json!(s.kv.cached);
            extra["kv_blocks_free"] = json!(s.kv.free);
            extra["prefix_hit_rate"] = json!(s.kv.prefix_hit_rate());
            extra["prefix_hit_tokens"] = json!(s.kv.prefix_hit_tokens);
            extra["evictions"] = json!(s.kv.evictions);
        }
        for (key, counter) in [
            ("steps", &c.steps),
            ("prefill_sequences", &c.prefill_sequences),
            ("decode_sequences", &c.decode_sequences),
            ("prefill_tokens", &c.prefill_tokens),
            ("decode_tokens", &c.decode_tokens),
            ("last_prefill_batch", &c.last_prefill_batch),
            ("last_decode_batch", &c.last_decode_batch),
        ] {
            extra[key] = json!(counter.load(Ordering::Relaxed));
        }
        extra["busy_seconds"] = json!(c.busy_micros.load(Ordering::Relaxed) as f64 / 1e6);
        if let Some(k) = &self.kv_events {
            extra["kv_events_published"] = json!(k.published.load(Ordering::Relaxed));
            extra["kv_events_dropped"] = json!(k.dropped.load(Ordering::Relaxed));
            extra["kv_events_subscribers"] = json!(k.subscribers.load(Ordering::Relaxed));
        }
        if let Some(grammars) = &self.grammars {
            let (compiled, hits, cached) = grammars.counts();
            extra["grammars_compiled"] = json!(compiled);
            extra["grammar_cache_hits"] = json!(hits);
            extra["grammars_cached"] = json!(cached);
            extra["grammar_cache_limit"] = json!(crate::grammar::CACHED);
            extra["grammar_forced_tokens"] = json!(c.forced_tokens.load(Ordering::Relaxed));
        }
        if self.info.capabilities.speculative {
            let drafted = c.drafted_tokens.load(Ordering::Relaxed);
            let accepted = c.accepted_tokens.load(Ordering::Relaxed);
            extra["spec_drafted_tokens"] = json!(drafted);
            extra["spec_accepted_tokens"] = json!(accepted);
            extra["spec_acceptance_rate"] = json!(accepted as f64 / drafted.max(1) as f64);
        }
        (
            c.completed.load(Ordering::Relaxed),
            c.cancelled.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
            extra,
        )
    }

    /// `Ok` while the worker runs; a worker that stopped (a bug made it panic) cannot serve.
    pub(crate) fn health(&self) -> Result<(), EngineError> {
        let stopped = self
            .thread
            .lock()
            .map(|t| t.as_ref().is_none_or(JoinHandle::is_finished))
            .unwrap_or(true);
        if stopped {
            return Err(EngineError::new(
                turnpike_engine_api::Status::Unavailable,
                format!("model `{}`: the engine thread has stopped", self.info.id),
            ));
        }
        Ok(())
    }

    /// Ends every request and joins the worker.
    pub(crate) fn shutdown(&self) {
        let _ = self.send(Command::Stop);
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}
