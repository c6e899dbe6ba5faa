//! `POST /v1/completions` (legacy): prompts in four forms, `n` choices each, `echo`, logprobs
//! in the legacy format.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Map, Value};

use super::deliver::{Delivered, deliver};
use super::extract::JsonBody;
use super::sse::{self, Render};
use super::{AppState, admit, new_id, unix_now, with_request_id};
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::common::{CompletionLogprobs, Usage};
use crate::openai::completions::{Completion, CompletionChoice, CompletionRequest};
use crate::pipeline::run::{self, GenEvent, Job, TokenLogprob};
use crate::pipeline::{params, prompt};
use crate::tenancy::Caller;

/// OpenAI's default `max_tokens` for legacy completions.
const LEGACY_DEFAULT_MAX_TOKENS: u32 = 16;

/// Log probabilities in the legacy format; `offsets` are the tokens' character offsets.
fn legacy_logprobs(tokens: &[TokenLogprob], offsets: &[u64]) -> CompletionLogprobs {
    CompletionLogprobs {
        tokens: tokens.iter().map(|t| t.token.clone()).collect(),
        token_logprobs: tokens.iter().map(|t| Some(t.logprob)).collect(),
        top_logprobs: tokens
            .iter()
            .map(|t| {
                Some(
                    t.top
                        .iter()
                        .map(|(tok, _, lp)| (tok.clone(), Value::from(f64::from(*lp))))
                        .collect::<Map<_, _>>(),
                )
            })
            .collect(),
        text_offset: offsets.to_vec(),
    }
}

/// `logprobs`: an integer 0..=20 (OpenAI allows 5; more is accepted here), or `true`/`false`.
fn requested_logprobs(value: Option<&Value>) -> Result<Option<u32>, ApiError> {
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(0)),
        Some(Value::Number(n)) => Ok(Some(params::integer("logprobs", n, 0, 20)? as u32)),
        Some(_) => Err(ApiError::invalid(
            "logprobs",
            "'logprobs' must be an integer from 0 to 20",
        )),
    }
}

/// Handles a legacy completion.
pub async fn completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model(&req.model)?;
    state.tenancy.check_model(&caller, &model, &req.model)?;
    let defaults = &state.defaults;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "'suffix' (insertion) is not supported",
        ));
    }
    let sampling = params::Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        n: req.n.as_ref(),
        seed: req.seed.as_ref(),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        stop: req.stop.as_ref(),
        logit_bias: req.logit_bias.as_ref(),
        extensions: req.extensions.clone().or(req.nvext.clone()),
    };
    let mut p = params::generation_params(&sampling, &model, defaults)?;
    if let Some(best_of) = &req.best_of {
        let best_of = params::integer("best_of", best_of, 1, i64::from(params::MAX_N))? as u32;
        if best_of != 1 && best_of != p.n {
            return Err(ApiError::unsupported(
                "best_of",
                "'best_of' other than 1 or n is not supported",
            ));
        }
    }
    let stop = params::stop_strings(req.stop.as_ref())?;
    let echo = req.echo.unwrap_or(false);
    let logprobs = match requested_logprobs(req.logprobs.as_ref())? {
        Some(top) => params::logprobs(true, top, "logprobs", &model)?,
        None => None,
    };
    if echo && logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "'echo' together with 'logprobs' is not supported",
        ));
    }
    p.logprobs = logprobs.is_some();
    p.top_logprobs = logprobs.unwrap_or(0);
    params::check_total_choices(prompt::input_count(&req.prompt), p.n)?;
    let inputs = prompt::text_inputs(
        &req.prompt,
        "prompt",
        &model,
        true,
        params::prompt_limit(&model, defaults),
    )?;
    let longest = inputs.iter().map(|i| i.ids.len()).max().unwrap_or(0);
    p.max_tokens = params::max_tokens(
        req.max_tokens.as_ref(),
        "max_tokens",
        LEGACY_DEFAULT_MAX_TOKENS,
        longest,
        &model,
        defaults,
        "prompt",
    )?;
    params::complete_params(&mut p, &model)?;
    let id = new_id("cmpl-");
    p.request_id = Some(id.clone());
    let n = p.n;
    let echoes: Vec<String> = if echo {
        inputs.iter().map(|i| i.text.clone()).collect()
    } else {
        Vec::new()
    };
    let prompts = inputs.len();
    let prompt_tokens: u64 = inputs.iter().map(|i| i.ids.len() as u64).sum();
    let admission = admit(
        &state,
        &caller,
        &model,
        &mut p,
        req.metadata.as_ref(),
        prompt_tokens,
        prompts as u64,
        started,
        true,
    )
    .await?;
    let job = Job {
        model: std::sync::Arc::clone(&model),
        prompts: inputs.into_iter().map(|i| i.ids).collect(),
        params: p,
        stop,
        logprobs: logprobs.is_some(),
        retry_after: state.server.retry_after,
        tools: None,
        reasoning: None,
        admission: Some(admission),
    };
    let record = RequestRecord::new(
        id.clone(),
        "completions",
        model.id.clone(),
        req.user.clone(),
        req.stream.unwrap_or(false),
        started,
    );
    let stream = run::start(job).inspect_err(|e| record.failed(e))?;
    let renderer = CompletionRenderer {
        id,
        created: unix_now(),
        model: req.model.clone(),
        fingerprint: model.fingerprint.clone(),
        n,
        echoes,
        include_usage: req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        logprobs: logprobs.is_some(),
        offsets: vec![0; prompts * n as usize],
    };
    let choices = prompts * n as usize;
    let (folded, record, renderer) =
        match deliver(stream, record, &state.server, choices, renderer).await? {
            Delivered::Streamed(response) => return Ok(response),
            Delivered::Folded {
                folded,
                record,
                renderer,
            } => (folded, record, renderer),
        };
    let choices = folded
        .choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let prefix = renderer
                .echoes
                .get(i / n as usize)
                .cloned()
                .unwrap_or_default();
            CompletionChoice {
                text: prefix + &c.text,
                index: i as u32,
                logprobs: logprobs.map(|_| legacy_logprobs(&c.logprobs, &c.text_offsets)),
                finish_reason: Some(c.finish.unwrap_or(run::Finished::Stop).as_str()),
            }
        })
        .collect();
    let t = folded.totals;
    let body = Completion {
        id: renderer.id,
        object: "text_completion",
        created: renderer.created,
        model: renderer.model,
        system_fingerprint: renderer.fingerprint,
        choices,
        usage: Some(Some(Usage::new(t.prompt, t.completion, t.cached))),
    };
    Ok(with_request_id(Json(body).into_response(), &record.id))
}

struct CompletionRenderer {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    n: u32,
    /// Prompt texts to repeat first, one per prompt (empty without `echo`).
    echoes: Vec<String>,
    include_usage: bool,
    logprobs: bool,
    /// Characters sent so far per choice (for `text_offset`).
    offsets: Vec<u64>,
}

impl CompletionRenderer {
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Bytes {
        let chunk = Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
        };
        sse::data(&chunk)
    }
}

impl Render for CompletionRenderer {
    fn opening(&mut self) -> Vec<Bytes> {
        let mut out = Vec::new();
        for (p, text) in self.echoes.clone().iter().enumerate() {
            for j in 0..self.n {
                let index = p as u32 * self.n + j;
                out.push(self.chunk(
                    vec![CompletionChoice {
                        text: text.clone(),
                        index,
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                ));
            }
        }
        out
    }

    fn event(&mut self, event: &GenEvent) -> Vec<Bytes> {
        match event {
            GenEvent::Text {
                choice,
                text,
                logprobs,
            } => {
                let base = self.offsets.get(*choice as usize).copied().unwrap_or(0);
                let offsets: Vec<u64> = std::iter::repeat_n(base, logprobs.len()).collect();
                if let Some(sent) = self.offsets.get_mut(*choice as usize) {
                    *sent += text.chars().count() as u64;
                }
                let logprobs = self.logprobs.then(|| legacy_logprobs(logprobs, &offsets));
                vec![self.chunk(
                    vec![CompletionChoice {
                        text: text.clone(),
                        index: *choice,
                        logprobs,
                        finish_reason: None,
                    }],
                    None,
                )]
            }
            GenEvent::Finish { choice, reason } => {
                let choice = CompletionChoice {
                    text: String::new(),
                    index: *choice,
                    logprobs: None,
                    finish_reason: Some(reason.as_str()),
                };
                vec![self.chunk(vec![choice], None)]
            }
            GenEvent::Usage(t) if self.include_usage => vec![self.chunk(
                Vec::new(),
                Some(Usage::new(t.prompt, t.completion, t.cached)),
            )],
            GenEvent::Usage(_)
            | GenEvent::Error(_)
            | GenEvent::ToolCall { .. }
            | GenEvent::Reasoning { .. } => Vec::new(),
        }
    }
}
