//! The node endpoint, `POST /generate`: SGLang's native token-level API, so the field's
//! routers (sgl-model-gateway, and others that speak it) can route to Turnpike nodes and
//! Turnpike's upstream engine plugin can route to Turnpike (or SGLang) nodes.
//!
//! In: `input_ids`, `sampling_params` (`max_new_tokens` (default 128), `min_new_tokens`,
//! `temperature`, `top_p`, `top_k` (-1 off), `min_p`, the three penalties, `stop_token_ids`,
//! `ignore_eos`, `n`, `json_schema` (a string), `regex`, `sampling_seed` (or `seed`), and
//! Turnpike's `lark`, `num_assistant_tokens` and `assistant_confidence_threshold`),
//! `stream`, `return_logprob`, `top_logprobs_num`, `rid`, `model` (optional when the node
//! serves one model), and Turnpike's `resume` (`{"tokens", "choice"}`: the last `tokens` ids of
//! `input_ids` are that choice's output from a node that failed mid-stream). Other keys (routers add some) are ignored; `text` prompts are refused: the
//! caller owns the text.
//!
//! Out: per choice `{"text": "", "output_ids", "meta_info": {"id", "finish_reason",
//! "prompt_tokens", "completion_tokens", "cached_tokens", "output_token_logprobs",
//! "output_top_logprobs"}, "index"}`; a non-streamed answer is that object (an array of them
//! for `n > 1`); streamed, one such chunk per token whose `output_ids` and log probabilities
//! are the new ones only (all that were ready, so a fast engine sends few chunks),
//! `finish_reason` set on each choice's last chunk, then `[DONE]`.
//! `finish_reason` is `{"type": "stop", "matched": id}` or `{"type": "length", "length": n}`.

mod answer;

use futures_util::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use turnpike_engine_api::resume::Resume;
use turnpike_engine_api::{GenerationParams, Grammar};

use super::render::{Chunk, Out};
use super::{Call, Reply};
use crate::error::ApiError;
use crate::generation::{TokenRequest, TokenRun};
use crate::ids::new_id;
use answer::{Answer, Taken};

/// Engine events gathered into one streamed step at most: what a fast engine has ready travels
/// together, one chunk per choice.
const MAX_BATCH: usize = 256;

/// The request body.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GenerateRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input_ids: Option<Vec<u32>>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    return_logprob: bool,
    #[serde(default)]
    top_logprobs_num: u32,
    #[serde(default)]
    rid: Option<String>,
    /// Turnpike's resumption: the last `tokens` of `input_ids` are choice `choice`'s output,
    /// delivered by a node that failed (`turnpike_engine_api::resume`).
    #[serde(default)]
    resume: Option<Resume>,
}

/// `sampling_params`.
#[derive(Debug, Clone, Default, Deserialize)]
struct SamplingParams {
    max_new_tokens: Option<u32>,
    min_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    #[serde(default)]
    stop_token_ids: Vec<u32>,
    ignore_eos: Option<bool>,
    n: Option<u32>,
    json_schema: Option<String>,
    regex: Option<String>,
    lark: Option<String>,
    ebnf: Option<String>,
    #[serde(alias = "sampling_seed")]
    seed: Option<u64>,
    num_assistant_tokens: Option<u32>,
    assistant_confidence_threshold: Option<f32>,
}

/// The engine parameters and the model a request asks for.
fn translate(req: &GenerateRequest, only_model: Option<&str>) -> Result<TokenRequest, ApiError> {
    if req.text.is_some() && req.input_ids.is_none() {
        return Err(ApiError::unsupported(
            "text",
            "this endpoint is token-level: send input_ids",
        ));
    }
    let prompt = req
        .input_ids
        .clone()
        .ok_or_else(|| ApiError::MissingParam("input_ids".into()))?;
    let model = match (&req.model, only_model) {
        (Some(m), _) => m.clone(),
        (None, Some(m)) => m.to_string(),
        (None, None) => return Err(ApiError::MissingParam("model".into())),
    };
    let s = &req.sampling_params;
    let grammar = match (&s.json_schema, &s.regex, &s.lark, &s.ebnf) {
        (Some(schema), None, None, None) => Some(Grammar::JsonSchema {
            schema: serde_json::from_str(schema).map_err(|e| {
                ApiError::invalid(
                    "sampling_params.json_schema",
                    format!("not a JSON Schema: {e}"),
                )
            })?,
        }),
        (None, Some(pattern), None, None) => Some(Grammar::Regex {
            pattern: pattern.clone(),
        }),
        (None, None, Some(lark), None) => Some(Grammar::Lark {
            grammar: lark.clone(),
        }),
        (None, None, None, None) => None,
        (.., Some(_)) => {
            return Err(ApiError::unsupported(
                "sampling_params.ebnf",
                "EBNF grammars are not supported; send `lark`, `regex` or `json_schema`",
            ));
        }
        _ => {
            return Err(ApiError::invalid(
                "sampling_params",
                "at most one of json_schema, regex and lark",
            ));
        }
    };
    let logprobs = req.return_logprob || req.top_logprobs_num > 0;
    let defaults = GenerationParams::default();
    let params = GenerationParams {
        request_id: req.rid.clone(),
        max_tokens: s.max_new_tokens.unwrap_or(128),
        min_tokens: s.min_new_tokens.unwrap_or(0),
        n: s.n.unwrap_or(1),
        temperature: s.temperature.unwrap_or(1.0),
        top_p: s.top_p.unwrap_or(1.0),
        top_k: s.top_k.filter(|&k| k > 0).map_or(0, |k| k as u32),
        min_p: s.min_p.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        seed: s.seed,
        stop_token_ids: s.stop_token_ids.clone(),
        ignore_eos: s.ignore_eos.unwrap_or(false),
        logprobs,
        top_logprobs: req.top_logprobs_num,
        grammar,
        num_assistant_tokens: s.num_assistant_tokens,
        assistant_confidence_threshold: s.assistant_confidence_threshold,
        resume: req.resume,
        ..defaults
    };
    Ok(TokenRequest {
        model,
        prompt,
        params,
        param: "input_ids",
    })
}

/// Runs a `/generate` request.
pub(crate) async fn generate(call: Call<'_>, req: &GenerateRequest) -> Result<Reply, ApiError> {
    let served: Vec<&str> = call
        .generator
        .registry()
        .listing()
        .map(|(id, _)| id)
        .collect();
    let only = match served.as_slice() {
        [one] => Some(*one),
        _ => None,
    };
    let request = translate(req, only)?;
    let n = request.params.n;
    let prompt_tokens = request.prompt.len() as u32;
    let mut run = call
        .generator
        .generate_tokens(call.caller, request, call.started)
        .await?;
    let id = req.rid.clone().unwrap_or_else(|| new_id("gen_"));
    let mut answer = Answer::new(id.clone(), n, prompt_tokens);
    if req.stream {
        let events = futures_util::stream::unfold(
            (run, answer, false),
            |(mut run, mut answer, done)| async move {
                if done {
                    return None;
                }
                let (outs, ended) = step(&mut run, &mut answer).await;
                Some((outs, (run, answer, ended)))
            },
        )
        .flat_map(futures_util::stream::iter);
        return Ok(Reply::Events {
            id,
            events: Box::pin(events),
        });
    }
    while let Some(event) = run.next().await {
        match answer.take(event) {
            Taken::Going => {}
            Taken::Ended => break,
            Taken::Failed(e) => return Err(e),
        }
    }
    let mut outputs = answer.whole();
    let body = if outputs.len() == 1 {
        outputs.remove(0)
    } else {
        Value::Array(outputs)
    };
    Ok(Reply::Json {
        id: Some(id),
        body: serde_json::to_vec(&body).unwrap_or_default().into(),
    })
}

/// One streamed step: the next event and every one ready after it, as chunks; whether the
/// answer has ended.
async fn step(run: &mut TokenRun, answer: &mut Answer) -> (Vec<Out>, bool) {
    let mut next = run.next().await;
    let mut taken = 0;
    loop {
        let Some(event) = next else {
            let mut outs = chunks(answer);
            if answer.ended() {
                outs.push(Out::Done);
            } else {
                outs.push(failed(&ApiError::Internal {
                    detail: "engine stream ended without a final event".into(),
                }));
            }
            return (outs, true);
        };
        match answer.take(event) {
            Taken::Going => {}
            Taken::Ended => {
                let mut outs = chunks(answer);
                outs.push(Out::Done);
                return (outs, true);
            }
            Taken::Failed(e) => {
                let mut outs = chunks(answer);
                outs.push(failed(&e));
                return (outs, true);
            }
        }
        taken += 1;
        next = match run.next().now_or_never() {
            Some(event) if taken < MAX_BATCH => event,
            _ => return (chunks(answer), false),
        };
    }
}

fn chunks(answer: &mut Answer) -> Vec<Out> {
    answer
        .flush()
        .iter()
        .map(|v| Out::Chunk(Chunk::data(v)))
        .collect()
}

fn failed(e: &ApiError) -> Out {
    Out::Failed {
        status: e.status(),
        error: e.detail(),
        chunks: None,
    }
}
