//! `turnpike-upstream`: an engine plugin that serves each of its models from a pool of remote
//! engine servers, so a Turnpike gateway can front a fleet (Turnpike nodes, SGLang, vLLM,
//! llama.cpp's `llama-server`) through the same ABI as any engine, and the gateway's core does
//! not change.
//!
//! Each pool speaks one token-level protocol ([`wire`]): token ids in, token ids and log
//! probabilities out, streamed. Token-level, because the OpenAI completions API carries text
//! and every hop would detokenize and retokenize; not the gRPC engine protocol, which has no
//! stable published definition yet. Turnpike nodes serve SGLang's `/generate`, so Turnpike
//! routes to Turnpike. What the nodes can do is declared per model (`grammar`, and the
//! protocol's own limits such as one choice for `llama-server`), so the gateway refuses what
//! they cannot; a request a protocol cannot carry is refused at `submit`.
//!
//! Membership ([`discovery`]): the configured endpoints, an endpoints file re-read while serving,
//! and host names re-resolved into one replica per address. Routing ([`pool`]): prefix affinity
//! by rendezvous hashing of the prompt's leading tokens, falling back on power-of-two-choices
//! over in-flight requests; breakers open on consecutive failures and probe after a cooldown; a
//! request that fails before its first token (a replica that accepts it and stays silent past
//! `first_token_timeout_ms` included) is retried on another replica, and one that fails after
//! it goes on there from exactly the tokens it delivered ([`run`], [`delivered`]); each
//! replica's `/health` is probed on an interval ([`health`]), which opens and closes breakers
//! without waiting for traffic. Cancelling a request closes its connection, which every one of
//! these servers takes as its cancel. Requests run on the plugin's own small Tokio runtime. A
//! traced request carries the gateway's `traceparent` on to the server, so a Turnpike node (or
//! any server that honours W3C trace context) continues the same trace.

/// mimalloc: every request builds a JSON body and reads its chunks into small short-lived
/// values; the system allocator took about 6% of a front's time in the fleet profile.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod attempt;
mod cached;
mod config;
mod consult;
mod delivered;
mod discovery;
mod health;
mod lines;
pub mod picker;
mod pool;
mod run;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::sync::Notify;
use turnpike_engine_api::plugin::{Engine, Host, Request, Sink};
use turnpike_engine_api::{Capabilities, EngineError, ModelInfo, Stats, Status};

use config::{Config, ModelConfig};
use pool::{Breaker, Pool};

/// A served model and its replicas.
#[derive(Debug)]
pub(crate) struct Model {
    pub config: ModelConfig,
    pub pool: Pool,
    /// Where the plugin logs (the gateway's log).
    pub host: Host,
    /// Choices resumed on another replica after theirs failed mid-stream.
    pub resumptions: AtomicU64,
    /// Microseconds from those failures to the resumed choices' first tokens, summed.
    pub resume_us: AtomicU64,
    /// The external endpoint picker asked first, if any.
    pub picker: Option<consult::Picker>,
    /// The replicas' caches as their KV events tell, if followed.
    pub cache_view: Option<Arc<cached::CacheView>>,
}

struct Upstream {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    client: run::HttpClient,
    models: Vec<Arc<Model>>,
    /// Requests running, by id, with what cancels each.
    running: Arc<Mutex<HashMap<u64, Arc<Notify>>>>,
    /// Requests accepted so far.
    submitted: AtomicU64,
}

impl Upstream {
    fn model(&self, id: &str) -> Result<&Arc<Model>, EngineError> {
        self.models
            .iter()
            .find(|m| m.config.id == id)
            .ok_or_else(|| EngineError::not_found(format!("no upstream model `{id}`")))
    }
}

impl Engine for Upstream {
    fn create(host: Host, config: &str) -> Result<Self, EngineError> {
        let config = Config::parse(config).map_err(EngineError::invalid_config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("turnpike-upstream")
            .enable_all()
            .build()
            .map_err(|e| EngineError::internal(format!("cannot start the runtime: {e}")))?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let mut models: Vec<Arc<Model>> = Vec::with_capacity(config.models.len());
        for c in config.models {
            let urls = discovery::initial(&c.members, &runtime, |why| {
                host.warn(&format!("upstream model `{}`: {why}", c.id));
            })
            .map_err(EngineError::invalid_config)?;
            let pool = Pool::new(&urls, c.affinity_tokens, c.affinity_max_imbalance);
            let cache_view = c
                .kv_events
                .clone()
                .map(|k| Arc::new(cached::CacheView::new(k)));
            let picker = match &c.picker {
                Some(url) => {
                    // The channel's worker runs on the plugin's runtime.
                    let _inside = runtime.enter();
                    let timeout = Duration::from_millis(c.picker_timeout_ms);
                    Some(consult::Picker::new(url, timeout).map_err(EngineError::invalid_config)?)
                }
                None => None,
            };
            models.push(Arc::new(Model {
                config: c,
                pool,
                host: host.clone(),
                resumptions: AtomicU64::new(0),
                resume_us: AtomicU64::new(0),
                picker,
                cache_view,
            }));
        }
        let timeout = Duration::from_millis(config.connect_timeout_ms);
        for m in &models {
            if let Some(view) = &m.cache_view {
                let every = Duration::from_millis(m.config.members.refresh_ms);
                runtime.spawn(Arc::clone(view).follow_every(every, Arc::clone(m), |m| &m.pool));
            }
            if discovery::dynamic(&m.config.members) {
                runtime.spawn(discovery::refresh_forever(Arc::clone(m), host.clone()));
            }
            let interval = m.config.health_interval_ms;
            if interval > 0 {
                runtime.spawn(health::probe_forever(
                    client.clone(),
                    Arc::clone(m),
                    Duration::from_millis(interval),
                    timeout,
                ));
            }
            let urls: Vec<String> = m.pool.replicas().iter().map(|r| r.url.clone()).collect();
            host.info(&format!(
                "upstream model `{}` ({:?}) over {}",
                m.config.id,
                m.config.protocol,
                urls.join(", ")
            ));
        }
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
            client,
            models,
            running: Arc::default(),
            submitted: AtomicU64::new(0),
        })
    }

    fn models(&self) -> Vec<ModelInfo> {
        self.models
            .iter()
            .map(|m| {
                let c = &m.config;
                ModelInfo {
                    id: c.id.clone(),
                    owned_by: None,
                    max_context: c.max_context,
                    vocab_size: c.vocab_size,
                    eos_token_ids: c.eos_token_ids.clone(),
                    tokenizer: c.tokenizer.clone(),
                    embedding_dim: None,
                    capabilities: Capabilities {
                        generation: true,
                        max_n: c.max_n,
                        logprobs: true,
                        max_top_logprobs: turnpike_engine_api::json::MAX_TOP_LOGPROBS,
                        sampling: true,
                        penalties: true,
                        grammar: c.grammar,
                        tool_call_grammar: false,
                        speculative: c.speculative,
                        draft_confidence: c.speculative,
                        max_beam_width: 0,
                        resume: false,
                    },
                }
            })
            .collect()
    }

    fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError> {
        let model = Arc::clone(self.model(&request.model)?);
        if let Some(bad) = request
            .prompt
            .iter()
            .find(|&&t| t >= model.config.vocab_size)
        {
            return Err(EngineError::invalid_request(format!(
                "prompt token id {bad} is outside the vocabulary"
            )));
        }
        if !model.pool.available() {
            // Said at submit, so a gateway with standby engines fails over at once.
            return Err(EngineError::new(
                Status::Unavailable,
                format!(
                    "no replica of model `{}` is available (every breaker is open)",
                    model.config.id
                ),
            ));
        }
        let c = &model.config;
        let mut request = request;
        if c.mid_stream_failover
            && request.params.temperature > 0.0
            && request.params.seed.is_none()
        {
            // A seed of its own, so a choice resumed elsewhere continues the same random stream.
            request.params.seed = Some(fresh_seed(request.id));
        }
        let body = c
            .protocol
            .body(
                c.upstream_model.as_deref(),
                &request,
                &format!("tp-{}", request.id),
            )
            .map_err(EngineError::invalid_request)?;
        let body = Bytes::from(body);
        let cancel = Arc::new(Notify::new());
        let id = request.id;
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&cancel));
        let (client, running) = (self.client.clone(), Arc::clone(&self.running));
        self.handle.spawn(async move {
            run::run(client, model, request, body, sink, cancel).await;
            running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        });
        self.submitted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn cancel(&self, request_id: u64) {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cancel) = running.get(&request_id) {
            cancel.notify_one();
        }
    }

    fn stats(&self, mut base: Stats) -> Stats {
        base.running = self.running.lock().map_or(0, |r| r.len() as u64);
        let mut models = serde_json::Map::new();
        for m in &self.models {
            let replicas: Vec<_> = m
                .pool
                .replicas()
                .iter()
                .map(|r| {
                    let requests = r.requests.load(Ordering::Relaxed);
                    let breaker = match r.breaker() {
                        Breaker::Closed { .. } => "closed",
                        Breaker::Open { .. } => "open",
                        Breaker::HalfOpen => "half_open",
                    };
                    json!({
                        "url": r.url,
                        "in_flight": r.in_flight.load(Ordering::Relaxed),
                        "requests": requests,
                        "errors": r.errors.load(Ordering::Relaxed),
                        "probe_failures": r.probe_failures.load(Ordering::Relaxed),
                        "first_token_ms_mean": r.first_token_us.load(Ordering::Relaxed) as f64
                            / 1000.0 / requests.max(1) as f64,
                        "breaker": breaker,
                        "kv_blocks_known": m.cache_view.as_ref().map_or(0, |v| v.known(&r.url)),
                    })
                })
                .collect();
            let resumptions = m.resumptions.load(Ordering::Relaxed);
            models.insert(
                m.config.id.clone(),
                json!({
                    "replicas": replicas,
                    "affine_requests": m.pool.affine.load(Ordering::Relaxed),
                    "resumptions": resumptions,
                    "resume_ms_mean": m.resume_us.load(Ordering::Relaxed) as f64
                        / 1000.0 / resumptions.max(1) as f64,
                    "kv_routed": m.cache_view.as_ref().map_or(0, |v| v.routed.load(Ordering::Relaxed)),
                    "picker_chosen": m.picker.as_ref().map_or(0, |p| p.chosen.load(Ordering::Relaxed)),
                    "picker_failed": m.picker.as_ref().map_or(0, |p| p.failed.load(Ordering::Relaxed)),
                }),
            );
        }
        base.extra.insert("models".into(), models.into());
        base.extra.insert(
            "submitted".into(),
            self.submitted.load(Ordering::Relaxed).into(),
        );
        base
    }

    fn shutdown(&self) {
        if let Some(runtime) = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// A seed no other request shares: the request id hashed with this process's random keys.
fn fresh_seed(id: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(id)
}

turnpike_engine_api::export_engine!(Upstream, "turnpike-upstream");
