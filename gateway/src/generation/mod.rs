//! The facade between the protocols and the engine (what TGI calls `Infer`): one
//! [`GenerationRequest`] in, one stream of generation events out.
//!
//! Every protocol (chat, legacy completions, Responses, their WebSocket turns) translates its
//! wire request into a [`GenerationRequest`] and hands it to [`Generator::prepare`], which does,
//! in this order and nowhere else: model lookup and the caller's scope, parameter checks
//! against the model with templating and tokenization within the prompt budget (one step,
//! [`plan`]), and admission under the tenant's limits (tokens, concurrency, the model's queue:
//! the second of the two limit phases; request rates were counted at the edge). [`Prepared::start`] submits to the engine
//! and returns a [`Generation`], the stream every response is rendered or folded from.
//! Dropping it cancels the engine work and settles the tenant's tokens.
//!
//! Errors name the caller's own parameters ([`ParamNames`]), so a Responses request hears about
//! `input` and `max_output_tokens`, never chat's names.

mod embed;
pub(crate) mod record;
mod stream;
mod tokens;
pub(crate) mod tool_loop;
mod tool_result;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

// What protocols build requests from and render answers by: the facade owns these names, so no
// protocol reaches into `pipeline` (gateway/tests/layers.rs keeps it so).
pub(crate) use crate::pipeline::events::{Finished, GenEvent, ServerToolRun, TokenLogprob, Totals};
pub(crate) use crate::pipeline::extensions::{SamplingExtensions, StructuredOutputs};
pub(crate) use crate::pipeline::fold::{Folded, fold};
pub(crate) use crate::pipeline::params::{MAX_N, MAX_STOP_TOKEN_IDS, MAX_TOP_LOGPROBS};
pub(crate) use crate::pipeline::request::{
    GenerationRequest, HostedServer, OutputFormat, ParamNames, Prompt, Sampling, ToolChoice, Tools,
    template_tool,
};
pub(crate) use embed::EmbeddingRequest;
pub(crate) use stream::Generation;
pub(crate) use tokens::{TokenRequest, TokenRun};

use crate::engine_host::{Defaults, ModelRegistry, ServedModel};
use crate::error::ApiError;
use crate::lifecycle::Lifecycle;
use crate::pipeline::run::{self, Job};
use crate::pipeline::{plan, prompt};
use crate::spend::usage::RecordContext;
use crate::tenancy::{Admission, AdmitRequest, Caller, Tenancy};
use record::RequestRecord;

impl Generator {
    /// The price in effect of a model called `asked` and served as `id`: the admin API's, else
    /// the configuration's.
    pub(crate) fn price(&self, asked: &str, id: &str) -> Option<crate::spend::prices::Price> {
        let now = i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX);
        self.registry
            .price(asked, id, now)
            .or_else(|| self.tenancy.price(asked, id))
    }
}

/// What a request's usage record says besides its counts.
pub(crate) fn record_context(
    caller: &Caller,
    id: &str,
    endpoint: &'static str,
    asked: &str,
    served: &str,
    started: Instant,
) -> RecordContext {
    let principal = &caller.principal;
    RecordContext {
        request_id: id.to_string(),
        tenant: principal.tenant.name.clone(),
        key_id: principal.key_id.clone().unwrap_or_else(|| "-".into()),
        model: asked.to_string(),
        served: served.to_string(),
        endpoint,
        started,
        batch: caller.batch.as_deref().map(str::to_string),
    }
}

/// How long a generation may take, and what an overloaded engine tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// From arrival to the last byte.
    pub request_timeout: Duration,
    /// `retry-after` on engine overload.
    pub retry_after: Duration,
}

/// Model lookup, checks, tokenization, admission and engine submit, for every protocol.
#[derive(Debug, Clone)]
pub struct Generator {
    registry: Arc<ModelRegistry>,
    defaults: Arc<Defaults>,
    tenancy: Arc<Tenancy>,
    timing: Timing,
    lifecycle: Lifecycle,
    /// Gateway plugins: guards before the plan, transforms over the output.
    plugins: Arc<crate::plugins::PluginHost>,
}

/// A generation checked, tokenized and admitted: ready to start.
#[derive(Debug)]
pub struct Prepared {
    /// The model.
    pub model: Arc<ServedModel>,
    /// Each prompt's text (legacy prompts only; for `echo`).
    pub prompt_texts: Vec<String>,
    job: Job,
    admission: Admission,
    lifecycle: Lifecycle,
    transforms: Option<crate::plugins::OutputTransforms>,
    tool_loop: Option<tool_loop::ToolLoop>,
}

/// A started generation, with what its protocol renders it by.
#[derive(Debug)]
pub(crate) struct Started {
    /// The events.
    pub(crate) stream: Generation,
    /// Its record, accounted when it ends.
    pub(crate) record: RequestRecord,
    /// The model.
    pub(crate) model: Arc<ServedModel>,
    /// Choices per prompt.
    pub(crate) n: u32,
    /// Alternatives per token, when log probabilities were asked for.
    pub(crate) logprobs: Option<u32>,
    /// Prompts.
    pub(crate) prompts: usize,
    /// Prompt tokens of all prompts (of the first round, for a request with server tools).
    pub(crate) prompt_tokens: u64,
    /// Each prompt's text (legacy prompts only; for `echo`).
    pub(crate) prompt_texts: Vec<String>,
}

impl Prepared {
    /// Choices per prompt.
    pub fn n(&self) -> u32 {
        self.job.params.n
    }

    /// Alternatives per token, when log probabilities were asked for.
    pub fn logprobs(&self) -> Option<u32> {
        let p = &self.job.params;
        p.logprobs.then_some(p.top_logprobs)
    }

    /// Prompts (one engine request each).
    pub fn prompts(&self) -> usize {
        self.job.prompts.len()
    }

    /// Prompt tokens of all prompts.
    pub fn prompt_tokens(&self) -> u64 {
        self.job.prompts.iter().map(|p| p.len() as u64).sum()
    }

    /// Whether it still waits for its place in the model's queue (only when prepared without
    /// waiting).
    pub fn is_waiting(&self) -> bool {
        self.admission.is_waiting()
    }

    /// Waits, until `deadline`, for its place in the model's queue.
    pub async fn seated(&mut self, deadline: Instant) -> Result<(), ApiError> {
        let queue_wait =
            tracing::info_span!(target: crate::observability::traces::TARGET, "queue_wait");
        let seating = self.admission.seated(deadline).instrument(queue_wait);
        until_cut(&self.lifecycle, self.job.retry_after, seating).await?
    }

    /// Submits to the engine; a refusal is an error before any response is sent.
    pub fn start(self) -> Result<Generation, ApiError> {
        let stream = run::start(self.job, &self.lifecycle)?;
        let generation = Generation::new(stream, self.admission, self.transforms);
        Ok(match self.tool_loop {
            Some(tool_loop) => generation.with_tool_loop(tool_loop),
            None => generation,
        })
    }
}

/// `work`, unless the server cuts running generations first (a request still waiting for its
/// place in a queue then hears `server_shutting_down` rather than nothing at all).
async fn until_cut<T>(
    lifecycle: &Lifecycle,
    retry_after: Duration,
    work: impl std::future::Future<Output = T>,
) -> Result<T, ApiError> {
    tokio::select! {
        done = work => Ok(done),
        () = lifecycle.cut_signal() => Err(ApiError::ShuttingDown { retry_after }),
    }
}

impl Generator {
    /// The facade over `registry`'s models, admitting under `tenancy`.
    pub fn new(
        registry: Arc<ModelRegistry>,
        defaults: Arc<Defaults>,
        tenancy: Arc<Tenancy>,
        timing: Timing,
    ) -> Self {
        Self {
            registry,
            defaults,
            tenancy,
            timing,
            lifecycle: Lifecycle::default(),
            plugins: Arc::default(),
        }
    }

    /// Whether the engine serving `model` has room for batch work: fewer than `short`
    /// requests wait in its queue. An unknown model has room (its line fails as any request
    /// would).
    pub(crate) fn has_room(&self, model: &str, short: u64) -> bool {
        self.registry
            .resolve(model)
            .is_none_or(|m| m.backend.stats().map_or(true, |s| s.queued < short))
    }

    /// The gateway plugins it runs.
    pub(crate) fn plugins(&self) -> Arc<crate::plugins::PluginHost> {
        Arc::clone(&self.plugins)
    }

    /// The server tools to offer `req`: every one configured for its model and tenant, or those
    /// of the servers it names (`tools.hosted`), less names the client's own tools take. None
    /// when it cannot loop (`n` > 1, no chat prompt, no tool-call format, `tool_choice: none`);
    /// a request that names servers then, or names one that is not there, is refused.
    fn server_tools(
        &self,
        caller: &Caller,
        req: &GenerationRequest,
        model: &ServedModel,
        endpoint: &str,
    ) -> Result<Vec<crate::plugins::ServerTool>, ApiError> {
        let hosted = req.tools.hosted.as_deref();
        let refuse = |why: &str| match hosted.and_then(|h| h.first()) {
            Some(first) => Err(ApiError::unsupported(first.param.clone(), why)),
            None => Ok(Vec::new()),
        };
        let n = req.sampling.n.unwrap_or(1);
        if !matches!(req.prompt, Prompt::Chat { .. }) || n != 1 {
            return refuse("the gateway runs its tools for one choice of a conversation (n = 1)");
        }
        if matches!(req.tools.choice, ToolChoice::None) {
            return Ok(Vec::new());
        }
        if self.plugins.is_empty() {
            return refuse("no MCP server or other server tool is configured on this gateway");
        }
        if model.tool_call_parser.is_none() {
            return refuse(
                "this model has no tool-call format configured, so it cannot call tools",
            );
        }
        let scope = crate::plugins::Scope {
            tenant: &caller.principal.tenant.name,
            model: [req.model.as_str(), model.id.as_str()],
            endpoint,
        };
        let mut tools = self.plugins.server_tools(scope);
        tools.retain(|t| !req.tools.names.contains(&t.spec.name));
        let Some(servers) = hosted else {
            return Ok(tools);
        };
        for server in servers {
            if !tools
                .iter()
                .any(|t| self.plugins.server_of(t) == server.label)
            {
                return Err(ApiError::invalid(
                    format!("{}.server_label", server.param),
                    format!(
                        "no MCP server `{}` is configured for this model on this gateway",
                        server.label
                    ),
                ));
            }
        }
        tools.retain(|t| {
            servers.iter().any(|s| {
                self.plugins.server_of(t) == s.label
                    && s.allowed
                        .as_ref()
                        .is_none_or(|names| names.contains(&t.spec.name))
            })
        });
        Ok(tools)
    }

    /// The same facade, running `plugins`.
    pub fn with_plugins(self, plugins: Arc<crate::plugins::PluginHost>) -> Self {
        Self { plugins, ..self }
    }

    /// Where the server is in its life: a cut ends every generation still running.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The served models.
    pub fn registry(&self) -> &ModelRegistry {
        &self.registry
    }

    /// The request defaults.
    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// How long a generation may take.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// [`Self::model_for`], for a request that generates: an embedding-only model is a 400.
    pub fn generating_model_for(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<Arc<ServedModel>, ApiError> {
        let model = self.model_for(caller, name)?;
        if !model.info.capabilities.generation {
            return Err(ApiError::unsupported(
                "model",
                format!(
                    "model `{}` serves embeddings only; call /v1/embeddings",
                    model.id
                ),
            ));
        }
        Ok(model)
    }

    /// The model `name` names, if `caller` may use it; 404 or 403 otherwise.
    pub fn model_for(&self, caller: &Caller, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        let model = self
            .registry
            .resolve(name)
            .ok_or_else(|| ApiError::ModelNotFound(name.to_string()))?;
        self.tenancy.check_model(caller, &model, name)?;
        Ok(model)
    }

    /// The prompt tokens a conversation makes on `model` (its template and tokenizer), without
    /// running it; `param` names the conversation in errors.
    pub fn count_chat_prompt(
        &self,
        model: &ServedModel,
        prompt: &Prompt,
        param: &str,
    ) -> Result<usize, ApiError> {
        match prompt {
            Prompt::Chat {
                messages,
                tools,
                template_kwargs,
            } => prompt::chat_prompt(
                model,
                messages,
                tools.as_ref(),
                template_kwargs.as_ref(),
                model.context_length as usize,
                param,
            )
            .map(|ids| ids.len()),
            Prompt::Texts(value) => {
                let inputs =
                    prompt::text_inputs(value, param, model, true, model.context_length as usize)?;
                Ok(inputs.iter().map(|i| i.ids.len()).sum())
            }
        }
    }

    /// The whole way from a protocol's request to the engine's stream: prepares `req`
    /// ([`Self::prepare`], waiting for its place in the model's queue) and submits it. `record`
    /// (opened by the protocol, which knows its endpoint) learns the served model's id, and
    /// hears of a failure to start.
    pub(crate) async fn generate(
        &self,
        caller: &Caller,
        req: &GenerationRequest,
        id: &str,
        mut record: RequestRecord,
    ) -> Result<Started, ApiError> {
        let mut prepared = self
            .prepare(caller, req, id, record.endpoint, record.started, true)
            .await?;
        record.model.clone_from(&prepared.model.id);
        let (model, n, logprobs) = (
            Arc::clone(&prepared.model),
            prepared.n(),
            prepared.logprobs(),
        );
        let prompts = prepared.prompts();
        let prompt_tokens = prepared.prompt_tokens();
        let prompt_texts = std::mem::take(&mut prepared.prompt_texts);
        let stream = prepared.start().inspect_err(|e| record.failed(e))?;
        if let Some(route) = stream.route() {
            let route = route.to_string();
            caller.report(|r| r.route = Some(route));
        }
        Ok(Started {
            stream,
            record,
            model,
            n,
            logprobs,
            prompts,
            prompt_tokens,
            prompt_texts,
        })
    }

    /// Checks `req` against its model, templates and tokenizes it ([`plan`]) and admits it
    /// for `caller` as request `id` (which the engine also hears). With `wait` it waits for its
    /// place in the model's queue; without, the place may still be pending
    /// ([`Prepared::seated`]).
    pub async fn prepare(
        &self,
        caller: &Caller,
        req: &GenerationRequest,
        id: &str,
        endpoint: &'static str,
        started: Instant,
        wait: bool,
    ) -> Result<Prepared, ApiError> {
        let model = self.generating_model_for(caller, &req.model)?;
        // The gateway's own tools, offered beside the client's: the generation then runs in
        // rounds while the model calls them (a later round's request offers them already, so
        // it starts no loop of its own).
        let server_tools = self.server_tools(caller, req, &model, endpoint)?;
        let offered = (!server_tools.is_empty()).then(|| tool_loop::offer(req, &server_tools));
        let req = offered.as_ref().unwrap_or(req);
        let tool_loop = (!server_tools.is_empty()).then(|| {
            tool_loop::ToolLoop::new(
                self.clone(),
                caller.clone(),
                req.clone(),
                id.to_string(),
                endpoint,
                started,
                server_tools,
            )
        });
        let scope = crate::plugins::Scope {
            tenant: &caller.principal.tenant.name,
            model: [req.model.as_str(), model.id.as_str()],
            endpoint,
        };
        let guarded = if self.plugins.is_empty() {
            None
        } else {
            self.plugins.guard(scope, req).await?
        };
        let req = guarded.as_ref().unwrap_or(req);
        let tokenize = tracing::info_span!(
            target: crate::observability::traces::TARGET,
            "tokenize",
            prompt_tokens = tracing::field::Empty,
        );
        let mut plan = tokenize
            .in_scope(|| plan::plan(req, &model, &self.defaults, id, self.timing.retry_after))?;
        tokenize.record("prompt_tokens", plan.prompt_tokens() as i64);
        drop(tokenize);
        // The engine schedules fairly between tenants by these.
        let tenant = &caller.principal.tenant;
        plan.job.params.tenant = Some(tenant.name.clone());
        plan.job.params.tenant_weight = tenant.plan.weight;
        if caller.batch.is_some() {
            // Batch lines run in the gaps interactive requests leave.
            plan.priority = crate::pipeline::params::BATCH_PRIORITY;
            plan.job.params.priority = plan.priority;
        }
        let deadline = started + self.timing.request_timeout;
        let queue_wait =
            tracing::info_span!(target: crate::observability::traces::TARGET, "queue_wait");
        let admission = self
            .tenancy
            .admit(
                caller,
                &model,
                AdmitRequest {
                    prompt: plan.prompt_tokens(),
                    most_new: plan.most_new_tokens(),
                    priority: plan.priority,
                    deadline,
                    wait,
                    price: self.price(&req.model, &model.id),
                    record: record_context(caller, id, endpoint, &req.model, &model.id, started),
                },
            )
            .instrument(queue_wait);
        let admission = until_cut(&self.lifecycle, self.timing.retry_after, admission).await??;
        let transforms = if self.plugins.is_empty() {
            None
        } else {
            self.plugins.transforms(scope)
        };
        Ok(Prepared {
            model,
            prompt_texts: plan.prompt_texts,
            job: plan.job,
            admission,
            lifecycle: self.lifecycle.clone(),
            transforms,
            tool_loop,
        })
    }
}
