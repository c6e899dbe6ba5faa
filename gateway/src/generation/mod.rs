//! The facade between the protocols and the engine (what TGI calls `Infer`): one
//! [`GenerationRequest`] in, one stream of generation events out.
//!
//! Every protocol (chat, legacy completions, Responses, their WebSocket turns) translates its
//! wire request into a [`GenerationRequest`] and hands it to [`Generator::prepare`], which does,
//! in this order and nowhere else: model lookup and the caller's scope, parameter checks
//! against the model, templating and tokenization within the prompt budget, and admission under
//! the tenant's limits (tokens, concurrency, the model's queue: the second of the two limit
//! phases; request rates were counted at the edge). [`Prepared::start`] submits to the engine
//! and returns a [`Generation`], the stream every response is rendered or folded from.
//! Dropping it cancels the engine work and settles the tenant's tokens.
//!
//! Errors name the caller's own parameters ([`ParamNames`]), so a Responses request hears about
//! `input` and `max_output_tokens`, never chat's names.

mod embed;
pub mod record;
pub mod request;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use turnpike_engine_api::{GenerationParams, Grammar};

pub use embed::{Embedded, EmbeddingRequest};
pub use request::{
    GenerationRequest, OutputFormat, ParamNames, Prompt, Sampling, ToolChoice, Tools,
};
pub use stream::Generation;

use crate::engine_host::{Defaults, ModelRegistry, ServedModel};
use crate::error::ApiError;
use crate::pipeline::run::{Job, ToolSetup};
use crate::pipeline::{params, prompt};
use crate::tenancy::{Admission, Caller, Tenancy};

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
}

/// A generation checked, tokenized and admitted: ready to start.
#[derive(Debug)]
pub struct Prepared {
    /// The model.
    pub model: Arc<ServedModel>,
    /// Choices per prompt.
    pub n: u32,
    /// Alternatives per token, when log probabilities were asked for.
    pub logprobs: Option<u32>,
    /// Each prompt's text (legacy prompts only; for `echo`).
    pub prompt_texts: Vec<String>,
    job: Job,
    admission: Admission,
}

impl Prepared {
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
        self.admission.seated(deadline).await
    }

    /// Submits to the engine; a refusal is an error before any response is sent.
    pub fn start(self) -> Result<Generation, ApiError> {
        let stream = crate::pipeline::run::start(self.job)?;
        Ok(Generation::new(stream, self.admission))
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
        }
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

    /// The model `name` names, if `caller` may use it; 404 or 403 otherwise.
    pub fn model_for(&self, caller: &Caller, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        let model = self
            .registry
            .get(name)
            .cloned()
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

    /// Checks `req` against its model, tokenizes it and admits it for `caller` as request
    /// `id` (which the engine also hears). With `wait` it waits for its place in the model's
    /// queue; without, the place may still be pending ([`Prepared::seated`]).
    pub async fn prepare(
        &self,
        caller: &Caller,
        req: &GenerationRequest,
        id: &str,
        started: Instant,
        wait: bool,
    ) -> Result<Prepared, ApiError> {
        let model = self.model_for(caller, &req.model)?;
        let names = req.names;
        let defaults = &*self.defaults;
        let tools = tool_setup(&req.tools, names, &model)?;
        let mut p = params::generation_params(&req.sampling, &model, defaults)?;
        let stop = params::stop_strings(req.sampling.stop.as_ref())?;
        let logprobs = match req.logprobs {
            Some(top) => params::logprobs(true, top, names.top_logprobs, &model)?,
            None => None,
        };
        p.logprobs = logprobs.is_some();
        p.top_logprobs = logprobs.unwrap_or(0);
        p.grammar = grammar(&req.output, names, &model)?;
        let budget = params::prompt_limit(&model, defaults);
        let (prompts, prompt_texts, reasoning) = match &req.prompt {
            Prompt::Chat {
                messages,
                tools: shown,
                template_kwargs,
            } => {
                // With tool_choice "none" the model is not shown the tools.
                let shown = shown
                    .as_ref()
                    .filter(|_| req.tools.choice != ToolChoice::None);
                let ids = prompt::chat_prompt(
                    &model,
                    messages,
                    shown,
                    template_kwargs.as_ref(),
                    budget,
                    names.prompt,
                )?;
                (vec![ids], Vec::new(), model.reasoning.clone())
            }
            Prompt::Texts(value) => {
                params::check_total_choices(prompt::input_count(value), p.n)?;
                let inputs = prompt::text_inputs(value, names.prompt, &model, true, budget)?;
                let (ids, texts) = inputs.into_iter().map(|i| (i.ids, i.text)).unzip();
                (ids, texts, None)
            }
        };
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        p.max_tokens = params::max_tokens(
            req.max_tokens.as_ref(),
            names.max_tokens,
            req.default_max_tokens.unwrap_or(defaults.max_output_tokens),
            longest,
            &model,
            defaults,
            names.prompt,
        )?;
        params::complete_params(&mut p, &model)?;
        p.reasoning_effort = reasoning_effort(req.reasoning_effort.as_deref(), names)?;
        p.request_id = Some(id.to_string());
        let prompt_tokens: u64 = prompts.iter().map(|p| p.len() as u64).sum();
        let admission = self
            .admit(
                caller,
                &model,
                &mut p,
                req,
                prompt_tokens,
                prompts.len(),
                started,
                wait,
            )
            .await?;
        let n = p.n;
        let job = Job {
            model: Arc::clone(&model),
            prompts,
            params: p,
            stop,
            logprobs: logprobs.is_some(),
            retry_after: self.timing.retry_after,
            tools,
            reasoning,
        };
        Ok(Prepared {
            n,
            model,
            logprobs,
            prompt_texts,
            job,
            admission,
        })
    }

    /// Admits a generation for `caller`: the request's priority and the tenant's name and
    /// weight go to the engine in `p`; the tokens reserved are the prompt's plus the most the
    /// request may generate (`max_tokens` for each of `n` choices of each prompt).
    #[allow(clippy::too_many_arguments)]
    async fn admit(
        &self,
        caller: &Caller,
        model: &ServedModel,
        p: &mut GenerationParams,
        req: &GenerationRequest,
        prompt_tokens: u64,
        prompts: usize,
        started: Instant,
        wait: bool,
    ) -> Result<Admission, ApiError> {
        let priority = params::priority(req.metadata.as_ref())?;
        let tenant = &caller.principal.tenant;
        p.priority = priority;
        p.tenant = Some(tenant.name.clone());
        p.tenant_weight = tenant.plan.weight;
        let most_new = u64::from(p.max_tokens) * u64::from(p.n) * prompts as u64;
        self.tenancy
            .admit(
                caller,
                model,
                prompt_tokens,
                most_new,
                priority,
                started + self.timing.request_timeout,
                wait,
            )
            .await
    }
}

/// Whether and how to parse tool calls: only when tools are offered and the model may choose.
/// Forcing a call is refused, as is offering tools to a model whose tool-call format is not
/// configured (its calls would come back as text nobody parses).
fn tool_setup(
    tools: &Tools,
    names: ParamNames,
    model: &ServedModel,
) -> Result<Option<ToolSetup>, ApiError> {
    match tools.choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Forced => {
            return Err(ApiError::unsupported(
                names.tool_choice,
                format!(
                    "model `{}` cannot be made to call a tool; use 'auto' or 'none'",
                    model.id
                ),
            ));
        }
        ToolChoice::Auto => {}
    }
    if tools.names.is_empty() {
        return Ok(None);
    }
    let Some(format) = model.tool_call_parser else {
        return Err(ApiError::unsupported(
            "tools",
            format!(
                "model `{}` has no tool-call format configured (`tool_call_parser`), so its tool calls cannot be returned",
                model.id
            ),
        ));
    };
    Ok(Some(ToolSetup {
        format,
        names: tools.names.clone(),
        max_calls: if tools.parallel { usize::MAX } else { 1 },
    }))
}

/// The grammar an output format needs, if the model can enforce it.
fn grammar(
    output: &OutputFormat,
    names: ParamNames,
    model: &ServedModel,
) -> Result<Option<Grammar>, ApiError> {
    let grammar = match output {
        OutputFormat::Text => return Ok(None),
        OutputFormat::JsonObject => Grammar::JsonObject,
        OutputFormat::JsonSchema(schema) => {
            prompt::check_schema(schema, names.schema)?;
            Grammar::JsonSchema {
                schema: schema.clone(),
            }
        }
    };
    params::grammar(grammar, names.output, model).map(Some)
}

/// A reasoning effort, one of OpenAI's words.
fn reasoning_effort(effort: Option<&str>, names: ParamNames) -> Result<Option<String>, ApiError> {
    match effort {
        None => Ok(None),
        Some(e @ ("none" | "minimal" | "low" | "medium" | "high" | "xhigh")) => {
            Ok(Some(e.to_string()))
        }
        Some(other) => Err(ApiError::invalid(
            names.reasoning_effort,
            format!(
                "'{other}' is not an effort; expected none, minimal, low, medium, high or xhigh"
            ),
        )),
    }
}
