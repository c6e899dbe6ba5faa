//! `turnpike-sim`: the simulator engine, a plugin that behaves like an LLM engine without a model.
//!
//! It exists so the rest of Turnpike can be tested, demonstrated and load-tested without weights
//! or a GPU, in the spirit of llmsim but behind the same ABI as a real engine:
//!
//! - **latency profiles** per model: time to first token (plus prefill time per prompt token),
//!   inter-token latency, and jitter on both; presets `instant`, `fast` and `realistic`;
//! - **output modes**: `echo` the prompt's tokens, `random` tokens from the vocabulary (word-like
//!   tokens when a `tokenizer.json` is given), or a fixed `script` of token ids;
//! - **determinism**: tokens, log probabilities and delays come from generators seeded by the
//!   request's seed (or the engine's seed and the request id), and injected faults by the
//!   engine's seed and the request id;
//! - **error injection** by rate: refuse at submit, overload, unavailable, or fail mid-stream;
//! - it honours `max_tokens`, `min_tokens`, stop token ids, `ignore_eos`, `n`, `logprobs` and
//!   `top_logprobs` (synthetic but well-formed), priorities, and `cancel`; queues requests beyond
//!   `max_running` and refuses beyond `max_queued`;
//! - **grammars** (JSON Schema, regex, Lark) for models with a tokenizer: random output that
//!   the grammar allows, drawn through the default engine's grammar library;
//! - **embeddings**: deterministic unit-length vectors;
//! - `stats` reports queued, running, completed, cancelled and failed counts, and under
//!   `models` each model's running and waiting (the one queue's, shared by every model).
//!
//! Its configuration is a JSON document given to `create`; see `README.md` beside this crate.

mod config;
mod constrained;
mod embed;
mod generation;
mod modes;
mod rng;
mod scheduler;
mod vocab;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use turnpike_engine_api::plugin::{EmbedRequest, Engine, Host, Request, Sink};
use turnpike_engine_api::{Capabilities, EngineError, ModelInfo, Stats, Status};

use crate::config::{ModelConfig, SimConfig};
use crate::constrained::Constrained;
use crate::generation::Generation;
use crate::rng::{Rng, mix};
use crate::scheduler::Scheduler;

/// Salt for the fault-injection generator, so faults and tokens draw independently.
const FAULT_SALT: u64 = 0xFA17;

struct SimEngine {
    seed: u64,
    models: Vec<Arc<ModelConfig>>,
    scheduler: Scheduler,
    refused: AtomicU64,
}

impl SimEngine {
    fn model(&self, id: &str) -> Result<&Arc<ModelConfig>, EngineError> {
        self.models
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| EngineError::not_found(format!("the simulator serves no model `{id}`")))
    }

    fn refuse(&self, e: EngineError) -> Result<(), EngineError> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(e)
    }
}

fn check_request(model: &ModelConfig, request: &Request) -> Result<(), EngineError> {
    let vocab = model.vocab.size();
    if let Some(bad) = request.prompt.iter().find(|&&t| t >= vocab) {
        return Err(EngineError::invalid_request(format!(
            "prompt token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    if request.prompt.len() >= model.max_context as usize {
        return Err(EngineError::invalid_request(format!(
            "the prompt has {} tokens; model `{}` has a context of {}",
            request.prompt.len(),
            model.id,
            model.max_context
        )));
    }
    if request.params.n > model.max_n {
        return Err(EngineError::unsupported(format!(
            "n is {}; model `{}` allows at most {}",
            request.params.n, model.id, model.max_n
        )));
    }
    Ok(())
}

/// Salt for the generator that decides whether a request's answer is a tool call.
const TOOL_SALT: u64 = 0x7001;

/// The grammar the answer follows: the tool call's when the model calls tools, the request
/// offers them, the prompt holds no tool result yet and a draw (seeded by `seed`) under the
/// model's rate says so (a call drawn from it also meets the grammar a `strict` function adds);
/// else the request's, if any.
fn constrain(
    model: &ModelConfig,
    request: &Request,
    seed: u64,
) -> Result<Option<Constrained>, EngineError> {
    let p = &request.params;
    let calls = model.tool_calls.as_ref().is_some_and(|t| {
        !t.answered(&request.prompt) && Rng::new(mix(&[seed, TOOL_SALT])).chance(t.rate)
    });
    let grammar = match (&p.tool_call_grammar, &p.grammar) {
        (Some(call), _) if calls => call,
        (_, Some(grammar)) => grammar,
        _ => return Ok(None),
    };
    let Some(grammars) = &model.grammars else {
        return Err(EngineError::unsupported(format!(
            "model `{}` has no tokenizer, so the simulator cannot constrain its output",
            model.id
        )));
    };
    let constraint = grammars.constraint(grammar)?;
    Ok(Some(Constrained::new(
        constraint,
        Arc::clone(grammars),
        model.eos,
    )))
}

impl Engine for SimEngine {
    fn create(host: Host, config: &str) -> Result<Self, EngineError> {
        let config = SimConfig::parse(config).map_err(EngineError::invalid_config)?;
        let scheduler = Scheduler::start(config.max_running, config.max_queued).map_err(|e| {
            EngineError::internal(format!("cannot start the simulator thread: {e}"))
        })?;
        let names: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
        host.info(&format!("simulator ready with models {}", names.join(", ")));
        Ok(Self {
            seed: config.seed,
            models: config.models.into_iter().map(Arc::new).collect(),
            scheduler,
            refused: AtomicU64::new(0),
        })
    }

    fn models(&self) -> Vec<ModelInfo> {
        self.models
            .iter()
            .map(|m| ModelInfo {
                id: m.id.clone(),
                owned_by: m.owned_by.clone(),
                max_context: m.max_context,
                vocab_size: m.vocab.size(),
                eos_token_ids: vec![m.eos],
                tokenizer: m.tokenizer.clone(),
                embedding_dim: (m.embedding_dim > 0).then_some(m.embedding_dim),
                capabilities: Capabilities {
                    generation: true,
                    max_n: m.max_n,
                    logprobs: true,
                    max_top_logprobs: turnpike_engine_api::json::MAX_TOP_LOGPROBS,
                    sampling: true,
                    penalties: true,
                    grammar: m.grammars.is_some(),
                    tool_call_grammar: m.tool_calls.is_some() && m.grammars.is_some(),
                    speculative: false,
                    draft_confidence: false,
                    max_beam_width: 0,
                    resume: true,
                },
            })
            .collect()
    }

    fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError> {
        let model = Arc::clone(self.model(&request.model)?);
        if let Err(e) = check_request(&model, &request) {
            return self.refuse(e);
        }
        let mut request = request;
        // A resumed request's prompt ends with output delivered elsewhere: the generation
        // replays it from the original prompt, so a seeded choice goes on where it stopped.
        let replay = match request.params.resume {
            None => None,
            Some(resume) => match resume.split(&request.prompt) {
                Ok((original, _)) => {
                    request.prompt.truncate(original.len());
                    Some(resume)
                }
                Err(why) => return self.refuse(EngineError::invalid_request(why)),
            },
        };
        let seed = match request.params.seed {
            Some(seed) => mix(&[seed]),
            None => mix(&[self.seed, request.id]),
        };
        let constrained = match constrain(&model, &request, seed) {
            Ok(c) => c,
            Err(e) => return self.refuse(e),
        };
        let mut faults = Rng::new(mix(&[self.seed, request.id, FAULT_SALT]));
        let errors = model.errors;
        if faults.chance(errors.refuse_rate) {
            return self.refuse(EngineError::internal("simulated engine error at submit"));
        }
        if faults.chance(errors.overload_rate) {
            return self.refuse(EngineError::overloaded("simulated overload"));
        }
        if faults.chance(errors.unavailable_rate) {
            return self.refuse(EngineError::new(
                Status::Unavailable,
                "simulated unavailability",
            ));
        }
        let fail_after = faults
            .chance(errors.fail_midstream_rate)
            .then_some(errors.fail_after_tokens);
        let priority = request.params.priority;
        let generation = Generation::new(
            model,
            request.prompt,
            request.params,
            seed,
            fail_after,
            constrained,
            replay,
        );
        match self
            .scheduler
            .enqueue(request.id, sink, generation, priority)
        {
            Ok(()) => Ok(()),
            Err(e) => self.refuse(e),
        }
    }

    fn cancel(&self, request_id: u64) {
        self.scheduler.cancel(request_id);
    }

    fn stats(&self, _base: Stats) -> Stats {
        let mut stats = self.scheduler.stats();
        stats.extra.insert(
            "refused".into(),
            self.refused.load(Ordering::Relaxed).into(),
        );
        // One queue serves every model, so each model's load is the engine's: what a router
        // or endpoint picker reads as `vllm:num_requests_running` / `_waiting`.
        let load = serde_json::json!({"running": stats.running, "waiting": stats.queued});
        let models: serde_json::Map<String, serde_json::Value> = self
            .models
            .iter()
            .map(|m| (m.id.clone(), load.clone()))
            .collect();
        stats.extra.insert("models".into(), models.into());
        stats
    }

    const EMBEDDINGS: bool = true;

    fn embed(&self, request: EmbedRequest) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model(&request.model)?;
        let full = model.embedding_dim as usize;
        if full == 0 {
            return Err(EngineError::unsupported(format!(
                "model `{}` serves no embeddings",
                model.id
            )));
        }
        let dim = request
            .params
            .dimensions_for(full)
            .map_err(EngineError::invalid_request)?;
        let seed = mix(&[self.seed, 0xE3BE]);
        Ok(request
            .inputs
            .iter()
            .map(|tokens| {
                let v = embed::embed(seed, tokens, full);
                let head: Vec<f64> = v[..dim].iter().map(|&x| f64::from(x)).collect();
                embed::normalise(&head)
            })
            .collect())
    }

    fn shutdown(&self) {
        self.scheduler.shutdown();
    }
}

turnpike_engine_api::export_engine!(SimEngine, "turnpike-sim");
