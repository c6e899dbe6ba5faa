//! Chat completions: the wire request translated into the facade's generation request, and
//! the generation rendered back as `chat.completion.chunk` events or one `chat.completion`.

use serde_json::json;

use super::deliver::{Delivered, deliver};
use super::messages;
use super::numbers::{self, count};
use super::render::{Chunk, Render};
use super::wire_sampling;
use super::{Call, Reply};
use crate::clock::unix_now;
use crate::engine_host::ServedModel;
use crate::error::ApiError;
use crate::generation::{Finished, GenEvent, TokenLogprob};
use crate::generation::{
    GenerationRequest, MAX_N, MAX_TOP_LOGPROBS, OutputFormat, ParamNames, Prompt, Sampling, Started,
};
use crate::ids::new_id;
use crate::openai::chat::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChunkChoice, Delta, FunctionCall, FunctionCallDelta, ResponseFormat, ToolCall, ToolCallDelta,
};
use crate::openai::common::{ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, Usage};

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

/// The chat request as the facade's generation request (chat's own parameter names).
pub(crate) fn generation_request(
    req: &ChatCompletionRequest,
) -> Result<GenerationRequest, ApiError> {
    let messages = messages::template_messages(&req.messages)?;
    let offered = req.tools.as_deref().unwrap_or_default();
    let tools = match offered {
        [] => None,
        tools => Some(messages::template_tools(tools)?),
    };
    let (max_tokens, max_tokens_name) = match (&req.max_completion_tokens, &req.max_tokens) {
        (Some(n), _) => (Some(n.clone()), "max_completion_tokens"),
        (None, Some(n)) => (Some(n.clone()), "max_tokens"),
        (None, None) => (None, "max_tokens"),
    };
    let extensions = wire_sampling::extensions(&req.extensions, req.nvext.as_ref())?;
    let best_of = extensions.best_of;
    let n = count("n", req.n.as_ref(), 1, MAX_N)?;
    wire_sampling::refuse_streamed_beams(best_of, n, req.stream.unwrap_or(false))?;
    Ok(GenerationRequest {
        model: req.model.clone(),
        prompt: Prompt::Chat {
            messages,
            tools,
            template_kwargs: req.chat_template_kwargs.clone(),
        },
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
            extensions,
        },
        max_tokens: count(max_tokens_name, max_tokens.as_ref(), 1, u32::MAX)?,
        default_max_tokens: None,
        logprobs: req.logprobs.unwrap_or(false),
        top_logprobs: count(
            "top_logprobs",
            req.top_logprobs.as_ref(),
            0,
            MAX_TOP_LOGPROBS,
        )?,
        tools: messages::tools(
            offered,
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            false,
        ),
        output: match &req.response_format {
            None | Some(ResponseFormat::Text) => OutputFormat::Text,
            Some(ResponseFormat::JsonObject) => OutputFormat::JsonObject,
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                OutputFormat::JsonSchema(json_schema.schema.clone().unwrap_or_else(|| json!({})))
            }
        },
        reasoning_effort: req.reasoning_effort.clone(),
        metadata: req.metadata.clone(),
        names: ParamNames::CHAT.with_max_tokens(max_tokens_name),
    })
}

/// Runs `req` and answers as `POST /v1/chat/completions` does: one completion, or a stream.
pub(crate) async fn complete(
    call: Call<'_>,
    req: &ChatCompletionRequest,
) -> Result<Reply, ApiError> {
    let id = new_id("chatcmpl-");
    let generation = generation_request(req)?;
    let streamed = req.stream.unwrap_or(false);
    let record = call.record(&id, "chat", &req.model, req.user.clone(), streamed);
    let Started {
        stream,
        record,
        model,
        n,
        logprobs,
        ..
    } = call
        .generator
        .generate(call.caller, &generation, &id, record)
        .await?;
    let renderer = ChunkRenderer::new(id.clone(), req, &model, n, logprobs.is_some());
    let (folded, head) = match deliver(stream, record, call.streams, n as usize, renderer).await? {
        Delivered::Streamed(events) => return Ok(Reply::Events { id, events }),
        Delivered::Folded {
            folded, renderer, ..
        } => (folded, renderer.head),
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
            finish_reason: Some(c.finish.unwrap_or(Finished::Stop).as_str()),
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
        usage: Usage::new(t.prompt, t.completion, t.cached)
            .with_reasoning(t.reasoning)
            .with_cost(t.cost.map(|c| c.0)),
    };
    Ok(Reply::json(Some(id), &body))
}

/// What every chunk of a response repeats.
#[derive(Debug)]
struct Head {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

/// Renders a chat generation as `chat.completion.chunk` events.
#[derive(Debug)]
pub(crate) struct ChunkRenderer {
    head: Head,
    n: u32,
    include_usage: bool,
    logprobs: bool,
}

impl ChunkRenderer {
    /// The renderer of response `id` to `req`, with `n` choices.
    pub(crate) fn new(
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

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Chunk {
        let chunk = ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            system_fingerprint: self.head.fingerprint.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
        };
        Chunk::data(&chunk)
    }

    /// A chunk carrying `delta` (and `logprobs`) for choice `index`, before its end.
    fn delta_chunk(&self, index: u32, delta: Delta, logprobs: Option<ChatLogprobs>) -> Chunk {
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
    fn opening(&mut self) -> Vec<Chunk> {
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

    fn event(&mut self, event: &GenEvent) -> Vec<Chunk> {
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
                vec![
                    self.chunk(
                        Vec::new(),
                        Some(
                            Usage::new(t.prompt, t.completion, t.cached)
                                .with_reasoning(t.reasoning)
                                .with_cost(t.cost.map(|c| c.0)),
                        ),
                    ),
                ]
            }
            // The gateway's own tool rounds are not the client's: chat shows their answer only.
            GenEvent::Usage(_) | GenEvent::Error(_) | GenEvent::ServerTool(_) => Vec::new(),
        }
    }
}
