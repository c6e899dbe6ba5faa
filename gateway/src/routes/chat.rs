//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use turnpike_engine_api::Grammar;

use super::deliver::{Delivered, deliver};
use super::extract::JsonBody;
use super::sse::{self, Render};
use super::{AppState, admit, new_id, unix_now, with_request_id};
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::observability::requests::RequestRecord;
use crate::openai::chat::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChunkChoice, Delta, FunctionCall, FunctionCallDelta, ResponseFormat, ToolCall, ToolCallDelta,
};
use crate::openai::common::{ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, Usage};
use crate::pipeline::run::{self, GenEvent, Job, TokenLogprob, ToolSetup};
use crate::pipeline::{params, prompt};
use crate::tenancy::Caller;

/// Log probabilities in the chat format.
fn chat_logprobs(tokens: &[TokenLogprob]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|t| ChatTokenLogprob {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
            top_logprobs: t
                .top
                .iter()
                .map(|(token, bytes, logprob)| ChatTopLogprob {
                    token: token.clone(),
                    logprob: *logprob,
                    bytes: bytes.clone(),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: None,
    }
}

/// Whether and how to parse tool calls: only when tools are offered and `tool_choice` lets the
/// model choose. Forcing a call is refused, as is offering tools to a model whose tool-call
/// format is not configured (its calls would come back as text nobody parses).
fn tool_setup(
    req: &ChatCompletionRequest,
    model: &ServedModel,
) -> Result<Option<ToolSetup>, ApiError> {
    let names: Vec<String> = req
        .tools
        .iter()
        .flatten()
        .map(|t| t.function.name.clone())
        .collect();
    match req.tool_choice.as_ref() {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "tool_choice",
                format!(
                    "model `{}` cannot be made to call a tool; use 'auto' or 'none'",
                    model.id
                ),
            ));
        }
    }
    if names.is_empty() {
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
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    Ok(Some(ToolSetup {
        format,
        names,
        max_calls: if parallel { usize::MAX } else { 1 },
    }))
}

/// A chat request turned into a generation, admitted and ready to start.
pub(super) struct Prepared {
    /// What to run.
    pub job: Job,
    /// Choices.
    pub n: u32,
    /// Alternatives per token when log probabilities were asked for.
    pub logprobs: Option<u32>,
    /// The model.
    pub model: std::sync::Arc<ServedModel>,
}

/// Validates `req` once, builds its prompt and parameters, and admits it under `caller`'s
/// limits with the request id `id` (waiting for its place in the model's queue when `wait`).
/// Shared by chat and the Responses API, which translates its
/// requests into chat ones.
pub(super) async fn prepare(
    state: &AppState,
    caller: &Caller,
    req: &ChatCompletionRequest,
    id: &str,
    started: Instant,
    wait: bool,
) -> Result<Prepared, ApiError> {
    let model = state.model(&req.model)?;
    state.tenancy.check_model(caller, &model, &req.model)?;
    let defaults = &state.defaults;

    let messages = prompt::template_messages(&req.messages)?;
    let tools = match &req.tools {
        Some(tools) if !tools.is_empty() => Some(prompt::template_tools(tools)?),
        _ => None,
    };
    let tool_setup = tool_setup(req, &model)?;
    // With tool_choice "none" the model is not shown the tools, so it does not write calls.
    let tools =
        tools.filter(|_| !matches!(&req.tool_choice, Some(Value::String(s)) if s == "none"));
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
    let stop = params::stop_strings(req.stop.as_ref())?;
    let top = match &req.top_logprobs {
        Some(n) => params::integer("top_logprobs", n, 0, 20)? as u32,
        None => 0,
    };
    let wants_logprobs = req.logprobs.unwrap_or(false);
    if top > 0 && !wants_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "'top_logprobs' requires 'logprobs' to be true",
        ));
    }
    let logprobs = params::logprobs(wants_logprobs, top, "top_logprobs", &model)?;
    p.logprobs = logprobs.is_some();
    p.top_logprobs = logprobs.unwrap_or(0);
    p.grammar = match &req.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(params::grammar(
            Grammar::JsonObject,
            "response_format",
            &model,
        )?),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().unwrap_or_else(|| json!({}));
            prompt::check_schema(&schema, "response_format.json_schema.schema")?;
            Some(params::grammar(
                Grammar::JsonSchema { schema },
                "response_format",
                &model,
            )?)
        }
    };
    let ids = prompt::chat_prompt(
        &model,
        &messages,
        tools.as_ref(),
        req.chat_template_kwargs.as_ref(),
        params::prompt_limit(&model, defaults),
    )?;
    let (requested, requested_param) = match (&req.max_completion_tokens, &req.max_tokens) {
        (Some(n), _) => (Some(n), "max_completion_tokens"),
        (None, Some(n)) => (Some(n), "max_tokens"),
        (None, None) => (None, "max_tokens"),
    };
    p.max_tokens = params::max_tokens(
        requested,
        requested_param,
        defaults.max_output_tokens,
        ids.len(),
        &model,
        defaults,
        "messages",
    )?;
    params::complete_params(&mut p, &model)?;
    p.reasoning_effort = match req.reasoning_effort.as_deref() {
        None => None,
        Some(e @ ("none" | "minimal" | "low" | "medium" | "high" | "xhigh")) => Some(e.to_string()),
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!(
                    "'{other}' is not an effort; expected none, minimal, low, medium, high or xhigh"
                ),
            ));
        }
    };
    p.request_id = Some(id.to_string());
    let n = p.n;
    let prompt_tokens = ids.len() as u64;
    let admission = admit(
        state,
        caller,
        &model,
        &mut p,
        req.metadata.as_ref(),
        prompt_tokens,
        1,
        started,
        wait,
    )
    .await?;
    let job = Job {
        model: std::sync::Arc::clone(&model),
        prompts: vec![ids],
        params: p,
        stop,
        logprobs: logprobs.is_some(),
        retry_after: state.server.retry_after,
        tools: tool_setup,
        reasoning: model.reasoning.clone(),
        admission: Some(admission),
    };
    Ok(Prepared {
        job,
        n,
        logprobs,
        model,
    })
}

/// Handles a chat completion.
pub async fn chat(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    complete(&state, &caller, &req, Instant::now()).await
}

/// Runs `req` and answers as `POST /v1/chat/completions` does (one completion, or a stream).
pub(super) async fn complete(
    state: &AppState,
    caller: &Caller,
    req: &ChatCompletionRequest,
    started: Instant,
) -> Result<Response, ApiError> {
    let id = new_id("chatcmpl-");
    let Prepared {
        job,
        n,
        logprobs,
        model,
    } = prepare(state, caller, req, &id, started, true).await?;
    let record = RequestRecord::new(
        id.clone(),
        "chat",
        model.id.clone(),
        req.user.clone(),
        req.stream.unwrap_or(false),
        started,
    );
    let stream = run::start(job).inspect_err(|e| record.failed(e))?;
    let renderer = ChunkRenderer::new(id, req, &model, n, logprobs.is_some());
    let (folded, record, head) =
        match deliver(stream, record, &state.server, n as usize, renderer).await? {
            Delivered::Streamed(response) => return Ok(response),
            Delivered::Folded {
                folded,
                record,
                renderer,
            } => (folded, record, renderer.head),
        };
    let choices = folded
        .choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| ChatChoice {
            index: i as u32,
            message: AssistantMessage {
                role: "assistant",
                // OpenAI sends null content with tool calls and nothing else.
                content: (c.tool_calls.is_empty() || !c.text.trim().is_empty()).then_some(c.text),
                refusal: None,
                reasoning_content: (!c.reasoning.is_empty()).then(|| c.reasoning.clone()),
                tool_calls: (!c.tool_calls.is_empty()).then(|| {
                    c.tool_calls
                        .into_iter()
                        .map(|call| ToolCall {
                            id: call.id,
                            kind: "function".into(),
                            function: FunctionCall {
                                name: call.name,
                                arguments: call.arguments,
                            },
                        })
                        .collect()
                }),
            },
            logprobs: logprobs.map(|_| chat_logprobs(&c.logprobs)),
            finish_reason: Some(c.finish.unwrap_or(run::Finished::Stop).as_str()),
        })
        .collect();
    let t = folded.totals;
    let body = ChatCompletion {
        id: head.id,
        object: "chat.completion",
        created: head.created,
        model: head.model,
        system_fingerprint: head.fingerprint,
        choices,
        usage: Usage::new(t.prompt, t.completion, t.cached).with_reasoning(t.reasoning),
    };
    Ok(with_request_id(Json(body).into_response(), &record.id))
}

/// What every chunk of a response repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

/// Renders a chat generation as `chat.completion.chunk` events.
pub(super) struct ChunkRenderer {
    head: Head,
    n: u32,
    include_usage: bool,
    logprobs: bool,
}

impl ChunkRenderer {
    /// The renderer of response `id` to `req`, with `n` choices.
    pub(super) fn new(
        id: String,
        req: &ChatCompletionRequest,
        model: &ServedModel,
        n: u32,
        logprobs: bool,
    ) -> Self {
        Self {
            head: Head {
                id,
                created: unix_now(),
                model: req.model.clone(),
                fingerprint: model.fingerprint.clone(),
            },
            n,
            include_usage: req
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            logprobs,
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Bytes {
        let chunk = ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            system_fingerprint: self.head.fingerprint.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
        };
        sse::data(&chunk)
    }

    /// A chunk carrying `delta` (and `logprobs`) for choice `index`, before its end.
    fn delta_chunk(&self, index: u32, delta: Delta, logprobs: Option<ChatLogprobs>) -> Bytes {
        let choice = ChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: None,
        };
        self.chunk(vec![choice], None)
    }
}

impl Render for ChunkRenderer {
    fn opening(&mut self) -> Vec<Bytes> {
        (0..self.n)
            .map(|index| {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    refusal: Some(None),
                    tool_calls: None,
                    reasoning_content: None,
                };
                self.delta_chunk(index, delta, None)
            })
            .collect()
    }

    fn event(&mut self, event: &GenEvent) -> Vec<Bytes> {
        match event {
            GenEvent::Text {
                choice,
                text,
                logprobs,
            } => {
                let delta = Delta {
                    content: Some(text.clone()),
                    ..Delta::default()
                };
                let logprobs = self.logprobs.then(|| chat_logprobs(logprobs));
                vec![self.delta_chunk(*choice, delta, logprobs)]
            }
            GenEvent::ToolCall {
                choice,
                index,
                id,
                name,
                arguments,
            } => {
                // As OpenAI streams a call: its name first, then its arguments.
                let pieces = [
                    ToolCallDelta {
                        index: *index,
                        id: Some(id.clone()),
                        kind: Some("function"),
                        function: FunctionCallDelta {
                            name: Some(name.clone()),
                            arguments: String::new(),
                        },
                    },
                    ToolCallDelta {
                        index: *index,
                        id: None,
                        kind: None,
                        function: FunctionCallDelta {
                            name: None,
                            arguments: arguments.clone(),
                        },
                    },
                ];
                pieces
                    .into_iter()
                    .map(|piece| {
                        let delta = Delta {
                            tool_calls: Some(vec![piece]),
                            ..Delta::default()
                        };
                        self.delta_chunk(*choice, delta, None)
                    })
                    .collect()
            }
            GenEvent::Reasoning { choice, text } => {
                let delta = Delta {
                    reasoning_content: Some(text.clone()),
                    ..Delta::default()
                };
                vec![self.delta_chunk(*choice, delta, None)]
            }
            GenEvent::Finish { choice, reason } => {
                let choice = ChunkChoice {
                    index: *choice,
                    delta: Delta::default(),
                    logprobs: None,
                    finish_reason: Some(reason.as_str()),
                };
                vec![self.chunk(vec![choice], None)]
            }
            GenEvent::Usage(t) if self.include_usage => {
                vec![self.chunk(
                    Vec::new(),
                    Some(Usage::new(t.prompt, t.completion, t.cached).with_reasoning(t.reasoning)),
                )]
            }
            GenEvent::Usage(_) | GenEvent::Error(_) => Vec::new(),
        }
    }
}
