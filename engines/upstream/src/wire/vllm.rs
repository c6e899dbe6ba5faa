//! vLLM's tokens-in, tokens-out `POST /inference/v1/generate` (vLLM 0.11.2 on; from 0.30 the
//! server needs `--enable-scale-out` or `--tokens-only`). The body carries the prompt's
//! `token_ids` and vLLM's own `sampling_params`; each streamed event holds one choice with its
//! new `token_ids`, `finish_reason` and `stop_reason` (the stop token) on its last event, and
//! `stream_options.include_usage` adds a last event with the usage, cached prompt tokens
//! included when the server reports them. Log probabilities are read in both shapes vLLM has
//! sent: `token_id` numbers (0.32 on) and `"token_id:N"` strings (before).
//!
//! This protocol follows vLLM's published request and response models; no vLLM server runs on
//! this project's CI machines (no GPU, no CPU wheels), so its tests hold chunks written to those
//! models, not a live exchange.

use serde_json::{Value, json};
use turnpike_engine_api::plugin::Request;
use turnpike_engine_api::{Finish, Grammar};

use super::{Chunk, stopped, token_id, tokens};

pub(super) fn body(model: Option<&str>, req: &Request, rid: &str) -> Result<Value, String> {
    let p = &req.params;
    let mut sampling = json!({
        "n": p.n,
        "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repetition_penalty": p.repetition_penalty,
        "stop_token_ids": p.stop_token_ids,
        "ignore_eos": p.ignore_eos,
        "detokenize": false,
        "skip_special_tokens": false,
    });
    if p.logprobs {
        sampling["logprobs"] = json!(p.top_logprobs);
    }
    if let Some(seed) = p.seed {
        sampling["seed"] = json!(seed);
    }
    let constraint = match &p.grammar {
        Some(Grammar::JsonSchema { schema }) => Some(json!({"json": schema})),
        Some(Grammar::JsonObject) => Some(json!({"json_object": true})),
        Some(Grammar::Regex { pattern }) => Some(json!({"regex": pattern})),
        // Lark is what vLLM's `guidance` backend reads as a grammar.
        Some(Grammar::Lark { grammar }) => Some(json!({"grammar": grammar})),
        None => None,
    };
    if let Some(constraint) = constraint {
        sampling["structured_outputs"] = constraint;
    }
    let mut body = json!({
        "token_ids": req.prompt,
        "sampling_params": sampling,
        "request_id": rid,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    Ok(body)
}

pub(super) fn chunk(value: &Value) -> Result<Chunk, String> {
    let usage = &value["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as u32;
    let cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0) as u32;
    let Some(choice) = value["choices"].as_array().and_then(|c| c.first()) else {
        // The usage event.
        return Ok(Chunk {
            index: 0,
            tokens: Vec::new(),
            finish: None,
            prompt_tokens,
            cached_tokens,
        });
    };
    let tokens = tokens(
        &choice["token_ids"],
        choice["logprobs"]["content"].as_array(),
        top,
    )?;
    let finish = match choice["finish_reason"].as_str() {
        None => None,
        Some("length") => Some(Finish::length()),
        Some("abort") => return Err("the server aborted the request".into()),
        Some(_) => Some(match choice["stop_reason"].as_u64() {
            Some(id) => Finish::stop(token_id(&json!(id))?),
            None => stopped(),
        }),
    };
    Ok(Chunk {
        index: choice["index"].as_u64().unwrap_or(0) as u32,
        tokens,
        finish,
        prompt_tokens,
        cached_tokens,
    })
}

/// A token's alternatives, most likely first, each once (vLLM lists the sampled token first).
fn top(entry: &Value) -> Vec<(u32, f32)> {
    let mut alts: Vec<(u32, f32)> = entry["top_logprobs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|alt| Some((id_of(alt)?, alt["logprob"].as_f64()? as f32)))
        .collect();
    alts.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut seen = Vec::with_capacity(alts.len());
    alts.retain(|(id, _)| {
        let new = !seen.contains(id);
        seen.push(*id);
        new
    });
    alts
}

/// An alternative's token id: `token_id` (0.32 on) or a `"token_id:N"` string (before).
fn id_of(alt: &Value) -> Option<u32> {
    if let Some(id) = alt["token_id"].as_u64() {
        return u32::try_from(id).ok();
    }
    alt["token"]
        .as_str()?
        .strip_prefix("token_id:")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnpike_engine_api::GenerationParams;

    #[test]
    fn a_request_carries_vllm_sampling_params() {
        let req = Request {
            id: 1,
            model: "m".into(),
            prompt: vec![9, 8],
            trace_context: String::new(),
            params: GenerationParams {
                n: 2,
                logprobs: true,
                top_logprobs: 3,
                stop_token_ids: vec![5],
                grammar: Some(Grammar::Regex {
                    pattern: "a+".into(),
                }),
                ..GenerationParams::default()
            },
        };
        let b = body(Some("llama"), &req, "tp-1").unwrap();
        assert_eq!(b["token_ids"], json!([9, 8]));
        assert_eq!(b["model"], json!("llama"));
        let s = &b["sampling_params"];
        assert_eq!(
            (s["n"].clone(), s["logprobs"].clone()),
            (json!(2), json!(3))
        );
        assert_eq!(s["stop_token_ids"], json!([5]));
        assert_eq!(s["structured_outputs"], json!({"regex": "a+"}));
        assert_eq!(b["stream_options"]["include_usage"], json!(true));
    }

    #[test]
    fn both_logprob_shapes_and_the_usage_event_read() {
        let new = json!({"request_id": "generate-tokens-tp-1", "usage": null, "choices": [{"index": 1,
            "token_ids": [42], "finish_reason": null, "stop_reason": null, "logprobs": {"content": [
            {"token_id": 42, "logprob": -0.7, "rank": 2, "top_logprobs": [
            {"token_id": 42, "logprob": -0.7, "rank": 2}, {"token_id": 7, "logprob": -0.2, "rank": 1},
            {"token_id": 42, "logprob": -0.7, "rank": 2}]}]}}]});
        let c = chunk(&new).unwrap();
        assert_eq!(c.index, 1);
        assert_eq!(c.tokens[0].id, 42);
        assert_eq!(c.tokens[0].top, vec![(7, -0.2), (42, -0.7)]);
        let old = json!({"choices": [{"index": 0, "token_ids": [3, 4], "finish_reason": "stop",
            "stop_reason": 4, "logprobs": {"content": [
            {"token": "token_id:3", "logprob": -1.0, "top_logprobs": [{"token": "token_id:3", "logprob": -1.0}]},
            {"token": "token_id:4", "logprob": -2.0, "top_logprobs": []}]}}]});
        let c = chunk(&old).unwrap();
        assert_eq!(c.tokens[0].top, vec![(3, -1.0)]);
        assert_eq!(c.finish, Some(Finish::stop(4)));
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 8}}});
        let c = chunk(&usage).unwrap();
        assert_eq!(
            (c.tokens.len(), c.prompt_tokens, c.cached_tokens),
            (0, 9, 8)
        );
        let eos = json!({"choices": [{"index": 0, "token_ids": [], "finish_reason": "stop", "stop_reason": null}]});
        assert_eq!(chunk(&eos).unwrap().finish, Some(stopped()));
    }
}
