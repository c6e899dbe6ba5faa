//! `turnpike-cuda`: Turnpike's default engine, a continuous-batching engine for Llama-family
//! models on a paged KV cache.
//!
//! # Design
//!
//! The engine is cut into pieces that know as little of each other as possible:
//!
//! - [`model`]: Hugging Face folders (`config.json`, safetensors, tokenizer) validated into a
//!   [`model::ModelSpec`]; and the models the project makes itself (`turnpike make-model`).
//! - [`kv`]: the block manager: fixed-size blocks, reference counts (shared prefixes and the
//!   `n` choices of a request, copy on write), prefix caching by a hash chain over full blocks,
//!   freed blocks kept in LRU order until reused.
//! - [`scheduler`]: pure logic, no model: each step has a token budget; running decodes go
//!   first, then chunked prefill fills the rest; priorities and per-tenant weighted fair
//!   queuing order the waiting; when blocks run out the lowest-preference sequence is
//!   preempted and later recomputed.
//! - [`sampler`]: temperature, top-k, top-p, min-p, penalties, per-sequence seeded RNGs (the
//!   same seed gives the same tokens whatever else is in the batch) and log probabilities.
//! - [`speculative`]: drafts of a sequence's next tokens (prompt lookup, or a draft model run
//!   beside the model by `engine`), checked in the step that decodes its last token, so one
//!   read of the weights can give several tokens.
//! - [`grammar`]: grammar-constrained decoding (`llguidance`): a request's JSON Schema, regex
//!   or Lark grammar bans, before each sample, every token that would leave it.
//! - [`device`]: the seam to hardware, one trait and plain data: "run these chunks against
//!   these block tables and give me these logits". [`cpu`] is the reference device (f32 on
//!   every core); the CUDA device implements the same trait, and samples where its logits are
//!   (a [`device::DeviceSampler`]). [`step`] turns a scheduler's plan into a device's batch,
//!   so neither of the two imports the other.
//! - `engine`: one worker thread per model owns a scheduler, a device and the live requests,
//!   and turns the host's `submit`/`cancel` into steps and events; beam search (`best_of`
//!   above `n`) is its own pure logic there (`engine::beams`), the worker only forking and
//!   dropping the beams' sequences as it says.
//!
//! The plugin is configured with a JSON document (see `README.md` beside this crate) and
//! exported through the engine ABI as `turnpike-cuda`.

pub mod cpu;
pub mod device;
mod engine;
pub mod gpu;
pub use turnpike_grammar as grammar;
pub mod kv;
pub mod model;
pub mod sampler;
pub mod scheduler;
pub mod speculative;
pub mod step;

use turnpike_engine_api::plugin::{EmbedRequest, Engine, Host, Request, Sink};
use turnpike_engine_api::{EngineError, ModelInfo, Stats};

use engine::ModelRuntime;
pub use engine::{DeviceChoice, EngineSettings};

/// The plugin: every configured model with its worker.
#[derive(Debug)]
pub struct DefaultEngine {
    models: Vec<ModelRuntime>,
}

impl DefaultEngine {
    fn model(&self, id: &str) -> Result<&ModelRuntime, EngineError> {
        self.models
            .iter()
            .find(|m| m.info().id == id)
            .ok_or_else(|| EngineError::not_found(format!("this engine serves no model `{id}`")))
    }
}

fn entropy_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    sampler::mix(&[now, u64::from(std::process::id())])
}

impl Engine for DefaultEngine {
    fn create(host: Host, config: &str) -> Result<Self, EngineError> {
        let settings = EngineSettings::parse(config).map_err(EngineError::invalid_config)?;
        let seed = settings.seed.unwrap_or_else(entropy_seed);
        let mut models = Vec::with_capacity(settings.models.len());
        for m in &settings.models {
            match ModelRuntime::start(m, seed, &host) {
                Ok(runtime) => models.push(runtime),
                Err(e) => {
                    models.iter().for_each(ModelRuntime::shutdown);
                    return Err(e);
                }
            }
        }
        Ok(Self { models })
    }

    fn models(&self) -> Vec<ModelInfo> {
        self.models.iter().map(|m| m.info().clone()).collect()
    }

    fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError> {
        self.model(&request.model)?.submit(request, sink)
    }

    fn cancel(&self, request_id: u64) {
        // Ids are unique across models; an unknown id is ignored by each worker.
        for m in &self.models {
            m.cancel(request_id);
        }
    }

    /// `base` already counts every request the SDK saw end (completed, cancelled, failed), and
    /// every one in flight as running; the models' own counters go per model, and their
    /// scheduler queues split what is in flight into waiting and running.
    fn stats(&self, mut base: Stats) -> Stats {
        let mut per_model = serde_json::Map::new();
        let (mut waiting, mut running) = (0, 0);
        for m in &self.models {
            let (completed, cancelled, failed, mut extra) = m.stats();
            waiting += extra["waiting"].as_u64().unwrap_or(0);
            running += extra["running"].as_u64().unwrap_or(0);
            extra["completed"] = completed.into();
            extra["cancelled"] = cancelled.into();
            extra["failed"] = failed.into();
            per_model.insert(m.info().id.clone(), extra);
        }
        // Requests accepted but not yet seen by a scheduler count as waiting.
        base.queued = waiting + base.running.saturating_sub(waiting + running);
        base.running = running;
        base.extra.insert("models".into(), per_model.into());
        base
    }

    fn health(&self) -> Result<(), EngineError> {
        self.models.iter().try_for_each(ModelRuntime::health)
    }

    const EMBEDDINGS: bool = true;

    fn embed(&self, request: EmbedRequest) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model(&request.model)?;
        let full = model.info().embedding_dim.unwrap_or(0) as usize;
        let dim = request
            .params
            .dimensions_for(full)
            .map_err(EngineError::invalid_request)?;
        let pooled = model.embed(request.inputs)?;
        // Fewer dimensions (Matryoshka truncation) are always renormalised.
        let normalize = model.normalizes() || dim < full;
        Ok(pooled
            .into_iter()
            .map(|v| {
                let v = &v[..dim.min(v.len())];
                if normalize { normalise(v) } else { v.to_vec() }
            })
            .collect())
    }

    fn shutdown(&self) {
        self.models.iter().for_each(ModelRuntime::shutdown);
    }
}

/// L2-normalised copy (a zero vector stays zero).
fn normalise(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

turnpike_engine_api::export_engine!(DefaultEngine, "turnpike-cuda");
