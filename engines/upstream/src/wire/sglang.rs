//! SGLang's native `POST /generate`, which Turnpike nodes also serve: the body sent for a
//! request, and the streamed chunks read back. Chunks are read as SGLang writes them
//! (`output_ids` and log probabilities cumulative) or as Turnpike does (only the new ones): a
//! chunk's `completion_tokens` says which.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnpike_engine_api::plugin::Request;
use turnpike_engine_api::resume::Resume;
use turnpike_engine_api::{Finish, Grammar};

use super::{Chunk, Token, stopped};

// Both directions are typed rather than built and read as `serde_json::Value`: a front reads
// a chunk per token, and the maps and strings a `Value` allocates for each were a measurable
// share of its time per request (the fleet bench's profile).

/// The body of a streamed `/generate` request.
#[derive(Serialize)]
struct Body<'a> {
    input_ids: &'a [u32],
    sampling_params: Sampling<'a>,
    stream: bool,
    return_logprob: bool,
    top_logprobs_num: u32,
    rid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resume: Option<&'a Resume>,
}

#[derive(Serialize)]
struct Sampling<'a> {
    max_new_tokens: u32,
    min_new_tokens: u32,
    temperature: f32,
    top_p: f32,
    /// -1: none (0 in the engine's parameters).
    top_k: i64,
    min_p: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    repetition_penalty: f32,
    stop_token_ids: &'a [u32],
    ignore_eos: bool,
    n: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling_seed: Option<u64>,
    // Sent only to models declared `speculative` (the gateway sends neither otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    num_assistant_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    assistant_confidence_threshold: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    regex: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lark: Option<&'a str>,
}

/// The body of a streamed `/generate` request; `model` is sent only when given (SGLang serves
/// one model and refuses unknown keys), and `resume` only to Turnpike nodes (`with_resume`).
pub(super) fn body(model: Option<&str>, req: &Request, rid: &str, with_resume: bool) -> Vec<u8> {
    let p = &req.params;
    let (mut json_schema, mut regex, mut lark) = (None, None, None);
    match &p.grammar {
        Some(Grammar::JsonSchema { schema }) => json_schema = Some(schema.to_string()),
        Some(Grammar::JsonObject) => json_schema = Some(r#"{"type":"object"}"#.to_string()),
        Some(Grammar::Regex { pattern }) => regex = Some(pattern.as_str()),
        Some(Grammar::Lark { grammar }) => lark = Some(grammar.as_str()),
        None => {}
    }
    let body = Body {
        input_ids: &req.prompt,
        sampling_params: Sampling {
            max_new_tokens: p.max_tokens,
            min_new_tokens: p.min_tokens,
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: if p.top_k == 0 { -1 } else { i64::from(p.top_k) },
            min_p: p.min_p,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty,
            stop_token_ids: &p.stop_token_ids,
            ignore_eos: p.ignore_eos,
            n: p.n,
            sampling_seed: p.seed,
            num_assistant_tokens: p.num_assistant_tokens,
            assistant_confidence_threshold: p.assistant_confidence_threshold,
            json_schema,
            regex,
            lark,
        },
        stream: true,
        return_logprob: p.logprobs,
        top_logprobs_num: p.top_logprobs,
        rid,
        model,
        resume: p.resume.as_ref().filter(|_| with_resume),
    };
    // Plain data of numbers and strings: serializing it cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// A streamed chunk as SGLang and Turnpike nodes write it.
#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    index: u32,
    output_ids: Option<Vec<u32>>,
    meta_info: Option<Meta>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
struct Meta {
    completion_tokens: Option<u64>,
    /// `[logprob, id, text]` per token; only with `return_logprob`.
    output_token_logprobs: Option<Vec<Value>>,
    /// Alternatives per token, each `[logprob, id, text]`.
    output_top_logprobs: Option<Vec<Value>>,
    finish_reason: Option<FinishReason>,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct FinishReason {
    #[serde(rename = "type")]
    kind: Option<String>,
    matched: Option<Value>,
}

/// Reads a chunk; `seen(index)` is how many tokens of that choice came before.
pub(super) fn chunk(payload: &[u8], seen: impl Fn(usize) -> usize) -> Result<Chunk, String> {
    let wire: WireChunk =
        serde_json::from_slice(payload).map_err(|e| format!("a chunk does not read: {e}"))?;
    if let Some(error) = wire.error {
        return Err(error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_string));
    }
    let ids = wire.output_ids.ok_or("a chunk has no output_ids")?;
    let meta = wire.meta_info.unwrap_or_default();
    let seen = seen(wire.index as usize);
    // Cumulative (SGLang) when the chunk holds every token so far.
    let skip = match meta.completion_tokens {
        Some(t) if t as usize == ids.len() && t as usize >= seen && seen > 0 => seen,
        _ => 0,
    };
    let pair = |v: &Value| -> Option<(u32, f32)> {
        Some((v.get(1)?.as_u64()? as u32, v.get(0)?.as_f64()? as f32))
    };
    let (logprobs, tops) = (&meta.output_token_logprobs, &meta.output_top_logprobs);
    let tokens = ids
        .iter()
        .enumerate()
        .skip(skip)
        .map(|(i, &id)| {
            let lp = logprobs
                .as_ref()
                .and_then(|l| l.get(i))
                .and_then(pair)
                .map(|(_, lp)| lp);
            let top = tops
                .as_ref()
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
    let finish = match meta.finish_reason {
        Some(FinishReason {
            kind: Some(kind),
            matched,
        }) => match kind.as_str() {
            "length" => Some(Finish::length()),
            "stop" => Some(match matched.as_ref().and_then(Value::as_u64) {
                Some(id) => Finish::stop(id as u32),
                None => stopped(),
            }),
            "abort" => return Err("the node aborted the request".into()),
            _ => None,
        },
        _ => None,
    };
    Ok(Chunk {
        index: wire.index,
        tokens,
        finish,
        prompt_tokens: meta.prompt_tokens.unwrap_or(0) as u32,
        cached_tokens: meta.cached_tokens.unwrap_or(0) as u32,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;
    use turnpike_engine_api::GenerationParams;

    fn sent(req: &Request) -> Value {
        serde_json::from_slice(&body(None, req, "r", true)).unwrap()
    }

    /// A request for prompt 1, 2, 3 with default parameters.
    fn request() -> Request {
        Request {
            id: 1,
            model: "m".into(),
            prompt: vec![1, 2, 3],
            trace_context: String::new(),
            params: GenerationParams::default(),
        }
    }

    fn read(chunk_json: &Value, seen: usize) -> Result<Chunk, String> {
        chunk(chunk_json.to_string().as_bytes(), |_| seen)
    }

    #[test]
    fn speculation_settings_are_sent_only_when_asked_for() {
        let mut req = request();
        let plain = sent(&req);
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
            sent(&req)["sampling_params"]["num_assistant_tokens"],
            json!(0)
        );
        req.params.num_assistant_tokens = None;
        req.params.assistant_confidence_threshold = Some(0.25);
        assert_eq!(
            sent(&req)["sampling_params"]["assistant_confidence_threshold"],
            json!(0.25)
        );
    }

    #[test]
    fn the_body_carries_the_prompt_sampling_and_grammar() {
        let mut req = request();
        req.params.max_tokens = 9;
        req.params.seed = Some(5);
        req.params.stop_token_ids = vec![4];
        req.params.grammar = Some(Grammar::JsonObject);
        let sent: Value =
            serde_json::from_slice(&body(Some("served"), &req, "tp-1", false)).unwrap();
        assert_eq!(sent["input_ids"], json!([1, 2, 3]));
        assert_eq!(
            (sent["stream"].clone(), sent["rid"].clone()),
            (json!(true), json!("tp-1"))
        );
        assert_eq!(sent["model"], json!("served"));
        let sampling = &sent["sampling_params"];
        assert_eq!(sampling["max_new_tokens"], json!(9));
        assert_eq!(sampling["top_k"], json!(-1), "0 (none) is SGLang's -1");
        assert_eq!(sampling["sampling_seed"], json!(5));
        assert_eq!(sampling["stop_token_ids"], json!([4]));
        let schema: Value =
            serde_json::from_str(sampling["json_schema"].as_str().unwrap()).unwrap();
        assert_eq!(schema, json!({"type": "object"}));
        assert!(sampling.get("regex").is_none() && sent.get("resume").is_none());
    }

    #[test]
    fn a_chunk_with_null_meta_reads_and_a_bad_one_says_why() {
        let c = read(&json!({"output_ids": [3], "meta_info": null}), 0).unwrap();
        assert_eq!((c.index, c.tokens.len(), c.finish), (0, 1, None));
        let c = read(
            &json!({"output_ids": [3], "meta_info": {"finish_reason": {"type": "length", "length": 1}}}),
            0,
        );
        assert_eq!(c.unwrap().finish, Some(Finish::length()));
        assert!(
            read(&json!({"meta_info": {}}), 0)
                .unwrap_err()
                .contains("no output_ids")
        );
        assert!(
            chunk(b"not json", |_| 0)
                .unwrap_err()
                .contains("does not read")
        );
        let aborted = json!({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}});
        assert!(read(&aborted, 0).unwrap_err().contains("aborted"));
    }

    #[test]
    fn incremental_and_cumulative_chunks_read_the_same() {
        let turnpike = json!({"output_ids": [7], "index": 1, "meta_info": {"completion_tokens": 3,
            "output_token_logprobs": [[-0.5, 7, null]], "output_top_logprobs": [[[-0.5, 7, null], [-1.0, 8, null]]],
            "finish_reason": null, "prompt_tokens": 4, "cached_tokens": 0}});
        let c = read(&turnpike, 2).unwrap();
        assert_eq!(c.index, 1);
        let token = |id, logprob, top| Token { id, logprob, top };
        assert_eq!(
            c.tokens,
            vec![token(7, Some(-0.5), vec![(7, -0.5), (8, -1.0)])]
        );
        let sglang = json!({"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 7}, "prompt_tokens": 4, "cached_tokens": 2}});
        let c = read(&sglang, 2).unwrap();
        assert_eq!(c.tokens, vec![token(7, None, vec![])]);
        assert_eq!(c.finish, Some(Finish::stop(7)));
        assert_eq!((c.prompt_tokens, c.cached_tokens), (4, 2));
        assert!(
            read(&json!({"error": {"message": "boom"}}), 0)
                .unwrap_err()
                .contains("boom")
        );
    }
}
