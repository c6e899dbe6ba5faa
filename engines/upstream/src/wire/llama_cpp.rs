//! llama.cpp's `llama-server`: `POST /completion` with the prompt as token ids, streamed, with
//! `return_tokens` so each chunk carries its token ids and `n_probs` for log probabilities.
//!
//! Every sampler is set explicitly (the server's defaults are top-k 40, top-p 0.95 and min-p
//! 0.05, which the gateway's request did not ask for), and the repetition penalty covers the whole
//! context as the other engines apply it. What the server cannot do is refused before sending:
//! more than one choice, `min_tokens`, and grammars other than JSON Schema. Stop token ids are
//! not part of its API; `run` ends the choice when one arrives and closes the connection, which
//! the server takes as its cancel.

use serde_json::{Value, json};
use turnpike_engine_api::plugin::Request;
use turnpike_engine_api::{Finish, Grammar};

use super::{Chunk, stopped, token_id, tokens};

pub(super) fn body(model: Option<&str>, req: &Request) -> Result<Value, String> {
    let p = &req.params;
    if p.n > 1 {
        return Err("llama-server answers one choice per request (n must be 1)".into());
    }
    if p.min_tokens > 0 {
        return Err("llama-server has no min_tokens".into());
    }
    let mut body = json!({
        "prompt": req.prompt,
        "n_predict": p.max_tokens,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "typical_p": 1.0,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repeat_penalty": p.repetition_penalty,
        // The whole sequence, as the other engines penalise (the server refuses -1).
        "repeat_last_n": req.prompt.len() + p.max_tokens as usize,
        "ignore_eos": p.ignore_eos,
        "n_probs": if p.logprobs { p.top_logprobs.max(1) } else { 0 },
        "return_tokens": true,
        "cache_prompt": true,
        "stream": true,
    });
    if let Some(seed) = p.seed {
        // The server's seed is 32 bits.
        body["seed"] = json!(seed as u32);
    }
    match &p.grammar {
        Some(Grammar::JsonSchema { schema }) => body["json_schema"] = schema.clone(),
        Some(Grammar::JsonObject) => body["json_schema"] = json!({"type": "object"}),
        Some(Grammar::Regex { .. }) => {
            return Err("llama-server constrains output by JSON Schema only, not by regex".into());
        }
        Some(Grammar::Lark { .. }) => {
            return Err(
                "llama-server constrains output by JSON Schema only, not by Lark grammar".into(),
            );
        }
        None => {}
    }
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    Ok(body)
}

pub(super) fn chunk(value: &Value) -> Result<Chunk, String> {
    let tokens = tokens(
        &value["tokens"],
        value["completion_probabilities"].as_array(),
        |entry| {
            let pair = |v: &Value| Some((token_id(&v["id"]).ok()?, v["logprob"].as_f64()? as f32));
            entry["top_logprobs"]
                .as_array()
                .map(|alts| alts.iter().filter_map(pair).collect())
                .unwrap_or_default()
        },
    )?;
    let finish = if value["stop"].as_bool() == Some(true) {
        match value["stop_type"].as_str() {
            Some("limit") => Some(Finish::length()),
            // `word` would be a stop string, which the gateway never sends.
            Some("eos" | "word") => Some(stopped()),
            other => return Err(format!("the server stopped the request ({other:?})")),
        }
    } else {
        None
    };
    Ok(Chunk {
        index: value["index"].as_u64().unwrap_or(0) as u32,
        tokens,
        finish,
        prompt_tokens: value["tokens_evaluated"].as_u64().unwrap_or(0) as u32,
        cached_tokens: value["timings"]["cache_n"].as_u64().unwrap_or(0) as u32,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnpike_engine_api::GenerationParams;

    #[test]
    fn a_request_sets_every_sampler_and_refuses_what_the_server_lacks() {
        let mut req = Request {
            id: 1,
            model: "m".into(),
            prompt: vec![1, 2, 3],
            trace_context: String::new(),
            params: GenerationParams {
                max_tokens: 5,
                logprobs: true,
                seed: Some(7),
                ..GenerationParams::default()
            },
        };
        let body = body(Some("m"), &req).unwrap();
        assert_eq!(body["prompt"], json!([1, 2, 3]));
        assert_eq!(
            (body["top_k"].clone(), body["min_p"].clone()),
            (json!(0), json!(0.0))
        );
        assert_eq!(
            (body["n_probs"].clone(), body["seed"].clone()),
            (json!(1), json!(7))
        );
        req.params.n = 2;
        assert!(super::body(None, &req).unwrap_err().contains("n must be 1"));
        req.params.n = 1;
        req.params.grammar = Some(Grammar::Regex {
            pattern: "a+".into(),
        });
        assert!(super::body(None, &req).unwrap_err().contains("regex"));
    }

    #[test]
    fn chunks_read_tokens_probabilities_and_the_end() {
        // As llama-server streams them (recorded from the server built by tools/llama-server.sh).
        let token = json!({"index": 0, "content": "to", "tokens": [1141], "stop": false,
            "tokens_evaluated": 5, "completion_probabilities": [{"id": 1141, "token": "to",
            "bytes": [116, 111], "logprob": -2.96, "top_logprobs": [{"id": 1141, "token": "to",
            "bytes": [116, 111], "logprob": -2.96}, {"id": 254, "token": "in", "bytes": [105, 110],
            "logprob": -2.99}]}]});
        let c = chunk(&token).unwrap();
        assert_eq!(c.tokens.len(), 1);
        assert_eq!(c.tokens[0].id, 1141);
        assert_eq!(c.tokens[0].top, vec![(1141, -2.96), (254, -2.99)]);
        assert_eq!(c.finish, None);
        let end = json!({"index": 0, "content": "", "tokens": [], "stop": true, "stop_type": "limit",
            "tokens_evaluated": 5, "timings": {"cache_n": 3, "prompt_n": 2}});
        let c = chunk(&end).unwrap();
        assert_eq!(
            (c.finish, c.prompt_tokens, c.cached_tokens),
            (Some(Finish::length()), 5, 3)
        );
        let eos = json!({"tokens": [], "stop": true, "stop_type": "eos"});
        assert_eq!(chunk(&eos).unwrap().finish, Some(stopped()));
    }
}
