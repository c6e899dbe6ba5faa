//! Legacy completions (`POST /v1/completions`): prompts in four forms, `n` choices each, `echo`, logprobs
//! in the legacy format.

use serde_json::{Map, Value};

use super::deliver::{Delivered, deliver};
use super::numbers::{self, count};
use super::render::{Chunk, Render};
use super::wire_sampling;
use super::{Call, Reply};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::generation::{Finished, GenEvent, TokenLogprob};
use crate::generation::{
    GenerationRequest, MAX_N, MAX_TOP_LOGPROBS, OutputFormat, ParamNames, Prompt, Sampling,
    Started, Tools,
};
use crate::ids::new_id;
use crate::openai::common::{CompletionLogprobs, Usage};
use crate::openai::completions::{Completion, CompletionChoice, CompletionRequest};

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
/// `Some` when log probabilities are wanted, with the alternatives asked for (checked by the
/// facade, as `logprobs`).
fn requested_logprobs(value: Option<&Value>) -> Result<Option<Option<u32>>, ApiError> {
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(None)),
        Some(Value::Number(n)) => Ok(Some(count("logprobs", Some(n), 0, MAX_TOP_LOGPROBS)?)),
        Some(_) => Err(ApiError::invalid(
            "logprobs",
            "'logprobs' must be an integer from 0 to 20",
        )),
    }
}

/// The legacy request as the facade's generation request, and whether to echo the prompts.
pub(crate) fn generation_request(
    req: &CompletionRequest,
) -> Result<(GenerationRequest, bool), ApiError> {
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "'suffix' (insertion) is not supported",
        ));
    }
    let best_of = count("best_of", req.best_of.as_ref(), 1, MAX_N)?;
    let n = count("n", req.n.as_ref(), 1, MAX_N)?;
    wire_sampling::refuse_streamed_beams(best_of, n, req.stream.unwrap_or(false))?;
    let echo = req.echo.unwrap_or(false);
    let logprobs = requested_logprobs(req.logprobs.as_ref())?;
    if echo && logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "'echo' together with 'logprobs' is not supported",
        ));
    }
    let generation = GenerationRequest {
        model: req.model.clone(),
        prompt: Prompt::Texts(req.prompt.clone()),
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            n,
            seed: numbers::seed(req.seed.as_ref())?,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            stop: wire_sampling::stops(req.stop.as_ref()),
            logit_bias: req.logit_bias.clone(),
            best_of,
            extensions: wire_sampling::extensions(&req.extensions, req.nvext.as_ref())?,
        },
        max_tokens: count("max_tokens", req.max_tokens.as_ref(), 1, u32::MAX)?,
        default_max_tokens: Some(LEGACY_DEFAULT_MAX_TOKENS),
        logprobs: logprobs.is_some(),
        top_logprobs: logprobs.flatten(),
        tools: Tools::default(),
        output: OutputFormat::Text,
        reasoning_effort: None,
        metadata: req.metadata.clone(),
        names: ParamNames {
            prompt: "prompt",
            top_logprobs: "logprobs",
            ..ParamNames::CHAT
        },
    };
    Ok((generation, echo))
}

/// Runs a legacy completion: its choices, or a stream of them.
pub(crate) async fn complete(call: Call<'_>, req: &CompletionRequest) -> Result<Reply, ApiError> {
    let (generation, echo) = generation_request(req)?;
    let id = new_id("cmpl-");
    let streamed = req.stream.unwrap_or(false);
    let record = call.record(&id, "completions", &req.model, req.user.clone(), streamed);
    let Started {
        stream,
        record,
        model,
        n,
        logprobs,
        prompts,
        prompt_texts,
        ..
    } = call
        .generator
        .generate(call.caller, &generation, &id, record)
        .await?;
    let echoes = if echo { prompt_texts } else { Vec::new() };
    let renderer = CompletionRenderer {
        id: id.clone(),
        created: unix_now(),
        model: req.model.clone(),
        fingerprint: model.fingerprint.clone(),
        n,
        echoes,
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        logprobs: logprobs.is_some(),
        offsets: vec![0; prompts * n as usize],
    };
    let choices = prompts * n as usize;
    let (folded, renderer) = match deliver(stream, record, call.streams, choices, renderer).await? {
        Delivered::Streamed(events) => return Ok(Reply::Events { id, events }),
        Delivered::Folded {
            folded, renderer, ..
        } => (folded, renderer),
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
                finish_reason: Some(c.finish.unwrap_or(Finished::Stop).as_str()),
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
        usage: Some(Some(
            Usage::new(t.prompt, t.completion, t.cached).with_cost(t.cost.map(|c| c.0)),
        )),
    };
    Ok(Reply::json(Some(id), &body))
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
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Chunk {
        let chunk = Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
        };
        Chunk::data(&chunk)
    }
}

impl Render for CompletionRenderer {
    fn opening(&mut self) -> Vec<Chunk> {
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

    fn event(&mut self, event: &GenEvent) -> Vec<Chunk> {
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
                Some(Usage::new(t.prompt, t.completion, t.cached).with_cost(t.cost.map(|c| c.0))),
            )],
            GenEvent::Usage(_)
            | GenEvent::Error(_)
            | GenEvent::ServerTool(_)
            | GenEvent::ToolCall { .. }
            | GenEvent::Reasoning { .. } => Vec::new(),
        }
    }
}
