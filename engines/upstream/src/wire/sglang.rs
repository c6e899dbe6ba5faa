//! SGLang's native `POST /generate`, which Turnpike nodes also serve: the body sent for a
//! request, and the streamed chunks read back. Chunks are read as SGLang writes them
//! (`output_ids` and log probabilities cumulative) or as Turnpike does (only the new ones): a
//! chunk's `completion_tokens` says which.

use serde_json::{Value, json};
use turnpike_engine_api::plugin::Request;
use turnpike_engine_api::{Finish, Grammar};

use super::{Chunk, Token, stopped};

/// The body of a streamed `/generate` request; `model` is sent only when given (SGLang serves
/// one model and refuses unknown keys).
pub(super) fn body(model: Option<&str>, req: &Request, rid: &str) -> Value {
    let p = &req.params;
    let mut sampling = json!({
        "max_new_tokens": p.max_tokens,
        "min_new_tokens": p.min_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": if p.top_k == 0 { -1 } else { i64::from(p.top_k) },
        "min_p": p.min_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repetition_penalty": p.repetition_penalty,
        "stop_token_ids": p.stop_token_ids,
        "ignore_eos": p.ignore_eos,
        "n": p.n,
    });
    if let Some(seed) = p.seed {
        sampling["sampling_seed"] = json!(seed);
    }
    // Sent only to models declared `speculative` (the gateway sends neither otherwise).
    if let Some(k) = p.num_assistant_tokens {
        sampling["num_assistant_tokens"] = json!(k);
    }
    if let Some(threshold) = p.assistant_confidence_threshold {
        sampling["assistant_confidence_threshold"] = json!(threshold);
    }
    match &p.grammar {
        Some(Grammar::JsonSchema { schema }) => sampling["json_schema"] = json!(schema.to_string()),
        Some(Grammar::JsonObject) => {
            sampling["json_schema"] = json!(json!({"type": "object"}).to_string());
        }
        Some(Grammar::Regex { pattern }) => sampling["regex"] = json!(pattern),
        Some(Grammar::Lark { grammar }) => sampling["lark"] = json!(grammar),
        None => {}
    }
    let mut body = json!({
        "input_ids": req.prompt,
        "sampling_params": sampling,
        "stream": true,
        "return_logprob": p.logprobs,
        "top_logprobs_num": p.top_logprobs,
        "rid": rid,
    });
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    body
}

/// Reads a chunk; `seen` is how many tokens of its choice came before.
pub(super) fn chunk(value: &Value, seen: usize) -> Result<Chunk, String> {
    if let Some(error) = value.get("error") {
        return Err(error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_string));
    }
    let meta = &value["meta_info"];
    let ids: Vec<u32> = value["output_ids"]
        .as_array()
        .ok_or("a chunk has no output_ids")?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|v| v as u32)
                .ok_or("a token id is not an integer")
        })
        .collect::<Result<_, _>>()?;
    let total = meta["completion_tokens"].as_u64().map(|t| t as usize);
    // Cumulative (SGLang) when the chunk holds every token so far.
    let skip = match total {
        Some(t) if t == ids.len() && t >= seen && seen > 0 => seen,
        _ => 0,
    };
    let pair = |v: &Value| -> Option<(u32, f32)> {
        Some((v.get(1)?.as_u64()? as u32, v.get(0)?.as_f64()? as f32))
    };
    let logprobs = meta["output_token_logprobs"].as_array();
    let tops = meta["output_top_logprobs"].as_array();
    let tokens = ids
        .iter()
        .enumerate()
        .skip(skip)
        .map(|(i, &id)| {
            let lp = logprobs
                .and_then(|l| l.get(i))
                .and_then(pair)
                .map(|(_, lp)| lp);
            let top = tops
                .and_then(|t| t.get(i))
                .and_then(Value::as_array)
                .map(|alts| alts.iter().filter_map(pair).collect())
                .unwrap_or_default();
            Token {
                id,
                logprob: lp,
                top,
            }
        })
        .collect();
    let finish = match meta["finish_reason"].get("type").and_then(Value::as_str) {
        Some("length") => Some(Finish::length()),
        Some("stop") => Some(match meta["finish_reason"]["matched"].as_u64() {
            Some(id) => Finish::stop(id as u32),
            None => stopped(),
        }),
        Some("abort") => return Err("the node aborted the request".into()),
        _ => None,
    };
    Ok(Chunk {
        index: value["index"].as_u64().unwrap_or(0) as u32,
        tokens,
        finish,
        prompt_tokens: meta["prompt_tokens"].as_u64().unwrap_or(0) as u32,
        cached_tokens: meta["cached_tokens"].as_u64().unwrap_or(0) as u32,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnpike_engine_api::GenerationParams;

    #[test]
    fn speculation_settings_are_sent_only_when_asked_for() {
        let mut req = Request {
            id: 1,
            model: "m".into(),
            prompt: vec![1, 2, 3],
            trace_context: String::new(),
            params: GenerationParams::default(),
        };
        let plain = body(None, &req, "r");
        assert!(
            plain["sampling_params"]
                .get("num_assistant_tokens")
                .is_none()
        );
        assert!(
            plain["sampling_params"]
                .get("assistant_confidence_threshold")
                .is_none()
        );
        req.params.num_assistant_tokens = Some(0);
        assert_eq!(
            body(None, &req, "r")["sampling_params"]["num_assistant_tokens"],
            json!(0)
        );
        req.params.num_assistant_tokens = None;
        req.params.assistant_confidence_threshold = Some(0.25);
        assert_eq!(
            body(None, &req, "r")["sampling_params"]["assistant_confidence_threshold"],
            json!(0.25)
        );
    }

    #[test]
    fn incremental_and_cumulative_chunks_read_the_same() {
        let turnpike = json!({"output_ids": [7], "index": 1, "meta_info": {"completion_tokens": 3,
            "output_token_logprobs": [[-0.5, 7, null]], "output_top_logprobs": [[[-0.5, 7, null], [-1.0, 8, null]]],
            "finish_reason": null, "prompt_tokens": 4, "cached_tokens": 0}});
        let c = chunk(&turnpike, 2).unwrap();
        assert_eq!(c.index, 1);
        let token = |id, logprob, top| Token { id, logprob, top };
        assert_eq!(
            c.tokens,
            vec![token(7, Some(-0.5), vec![(7, -0.5), (8, -1.0)])]
        );
        let sglang = json!({"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 7}, "prompt_tokens": 4, "cached_tokens": 2}});
        let c = chunk(&sglang, 2).unwrap();
        assert_eq!(c.tokens, vec![token(7, None, vec![])]);
        assert_eq!(c.finish, Some(Finish::stop(7)));
        assert_eq!((c.prompt_tokens, c.cached_tokens), (4, 2));
        assert!(
            chunk(&json!({"error": {"message": "boom"}}), 0)
                .unwrap_err()
                .contains("boom")
        );
    }
}
