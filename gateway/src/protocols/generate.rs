//! The node endpoint, `POST /generate`: SGLang's native token-level API, so the field's
//! routers (sgl-model-gateway, and others that speak it) can route to Turnpike nodes and
//! Turnpike's upstream engine plugin can route to Turnpike (or SGLang) nodes.
//!
//! In: `input_ids`, `sampling_params` (`max_new_tokens` (default 128), `min_new_tokens`,
//! `temperature`, `top_p`, `top_k` (-1 off), `min_p`, the three penalties, `stop_token_ids`,
//! `ignore_eos`, `n`, `json_schema` (a string), `regex`, `sampling_seed` (or `seed`), and
//! Turnpike's `lark`),
//! `stream`, `return_logprob`, `top_logprobs_num`, `rid`, and `model` (optional when the node
//! serves one model). Other keys (routers add some) are ignored; `text` prompts are refused: the
//! caller owns the text.
//!
//! Out: per choice `{"text": "", "output_ids", "meta_info": {"id", "finish_reason",
//! "prompt_tokens", "completion_tokens", "cached_tokens", "output_token_logprobs",
//! "output_top_logprobs"}, "index"}`; a non-streamed answer is that object (an array of them
//! for `n > 1`); streamed, one such chunk per token whose `output_ids` and log probabilities
//! are the new ones only, `finish_reason` set on each choice's last chunk, then `[DONE]`.
//! `finish_reason` is `{"type": "stop", "matched": id}` or `{"type": "length", "length": n}`.

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use turnpike_engine_api::{
    EngineEvent, Finish, FinishReason, GenerationParams, Grammar, Status, TokenEvent, Usage,
};

use super::render::{Chunk, Out};
use super::{Call, Reply};
use crate::error::ApiError;
use crate::generation::{TokenRequest, TokenRun};
use crate::ids::new_id;

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
    let run = call
        .generator
        .generate_tokens(call.caller, request, call.started)
        .await?;
    let id = req.rid.clone().unwrap_or_else(|| new_id("gen_"));
    let state = Answer::new(id.clone(), n, prompt_tokens);
    if req.stream {
        let events = futures_util::stream::unfold(
            (run, state, false),
            |(mut run, mut state, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let Some(event) = run.next().await else {
                        if state.ended {
                            return Some((Out::Done, (run, state, true)));
                        }
                        let error = ApiError::Internal {
                            detail: "engine stream ended without a final event".into(),
                        };
                        return Some((failed(&error), (run, state, true)));
                    };
                    match state.take(event) {
                        Step::Chunk(chunk) => {
                            return Some((Out::Chunk(Chunk::data(&chunk)), (run, state, false)));
                        }
                        Step::Nothing => continue,
                        Step::Done => return Some((Out::Done, (run, state, true))),
                        Step::Failed(e) => return Some((failed(&e), (run, state, true))),
                    }
                }
            },
        );
        return Ok(Reply::Events {
            id,
            events: Box::pin(events),
        });
    }
    let mut run: TokenRun = run;
    let mut state = state;
    while let Some(event) = run.next().await {
        match state.take(event) {
            Step::Chunk(_) | Step::Nothing => {}
            Step::Done => break,
            Step::Failed(e) => return Err(e),
        }
    }
    let mut outputs = state.whole();
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

fn failed(e: &ApiError) -> Out {
    Out::Failed {
        status: e.status(),
        error: e.detail(),
        chunks: None,
    }
}

/// What one engine event makes.
enum Step {
    Chunk(Value),
    Nothing,
    Done,
    Failed(ApiError),
}

/// One choice so far.
#[derive(Default)]
struct Choice {
    ids: Vec<u32>,
    logprobs: Vec<Value>,
    top: Vec<Value>,
    finish: Option<Finish>,
}

/// The answer as it forms.
struct Answer {
    id: String,
    prompt_tokens: u32,
    choices: Vec<Choice>,
    usage: Usage,
    /// The engine's FINAL has come.
    ended: bool,
}

impl Answer {
    fn new(id: String, n: u32, prompt_tokens: u32) -> Self {
        Self {
            id,
            prompt_tokens,
            choices: (0..n).map(|_| Choice::default()).collect(),
            usage: Usage::default(),
            ended: false,
        }
    }

    fn take(&mut self, event: EngineEvent) -> Step {
        match event {
            EngineEvent::Token(t) => self.token(&t),
            EngineEvent::ChoiceEnd { choice, finish } => {
                let Some(c) = self.choices.get_mut(choice as usize) else {
                    return Step::Nothing;
                };
                c.finish = Some(finish);
                Step::Chunk(self.chunk(choice, &[], &[], &[]))
            }
            EngineEvent::Final(fin) => {
                self.usage = fin.usage;
                self.ended = true;
                if fin.status != Status::Ok {
                    return Step::Failed(ApiError::from_engine(
                        turnpike_engine_api::EngineError::new(fin.status, fin.message),
                        std::time::Duration::from_secs(1),
                    ));
                }
                // The last open choice ends with the request.
                match self.choices.iter().position(|c| c.finish.is_none()) {
                    Some(open) => {
                        self.choices[open].finish = Some(fin.finish);
                        Step::Chunk(self.chunk(open as u32, &[], &[], &[]))
                    }
                    None => Step::Done,
                }
            }
        }
    }

    fn token(&mut self, t: &TokenEvent) -> Step {
        let Some(c) = self.choices.get_mut(t.choice as usize) else {
            return Step::Nothing;
        };
        c.ids.push(t.token_id);
        let lp = t.logprob.map(|l| json!([l, t.token_id, null]));
        let top: Vec<Value> = t
            .top_logprobs
            .iter()
            .map(|a| json!([a.logprob, a.token_id, null]))
            .collect();
        if let Some(lp) = &lp {
            c.logprobs.push(lp.clone());
            c.top.push(Value::Array(top.clone()));
        }
        let lps: Vec<Value> = lp.into_iter().collect();
        let tops = if lps.is_empty() {
            Vec::new()
        } else {
            vec![Value::Array(top)]
        };
        Step::Chunk(self.chunk(t.choice, &[t.token_id], &lps, &tops))
    }

    fn chunk(&self, choice: u32, ids: &[u32], logprobs: &[Value], top: &[Value]) -> Value {
        let c = &self.choices[choice as usize];
        json!({
            "text": "",
            "output_ids": ids,
            "index": choice,
            "meta_info": self.meta(c, logprobs, top),
        })
    }

    fn meta(&self, c: &Choice, logprobs: &[Value], top: &[Value]) -> Value {
        let finish = c.finish.map(|f| match (f.reason, f.stop_token) {
            (Some(FinishReason::Length), _) => json!({"type": "length", "length": c.ids.len()}),
            (_, Some(id)) => json!({"type": "stop", "matched": id}),
            _ => json!({"type": "stop", "matched": null}),
        });
        json!({
            "id": self.id,
            "finish_reason": finish,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c.ids.len(),
            "cached_tokens": self.usage.cached_prompt_tokens,
            "output_token_logprobs": logprobs,
            "output_top_logprobs": top,
        })
    }

    /// Every choice whole (a non-streamed answer).
    fn whole(&self) -> Vec<Value> {
        self.choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "text": "",
                    "output_ids": c.ids,
                    "index": i,
                    "meta_info": self.meta(c, &c.logprobs, &c.top),
                })
            })
            .collect()
    }
}
