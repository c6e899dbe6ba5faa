//! A bounded, structure-aware fuzz run over the JSON body of every POST endpoint, in-process.
//!
//! Valid bodies of each endpoint are mutated (a value anywhere replaced by one of another type
//! or out of range, keys dropped or added, deep nesting, long and odd strings, and raw byte
//! damage to the text) and sent through the whole router. The property: never a panic, never
//! a 5xx, and every refusal is an OpenAI error body with its four keys; a success is JSON or a
//! stream of JSON events. `TURNPIKE_FUZZ_CASES` (per seed body, default 150) and
//! `TURNPIKE_FUZZ_SEED` choose the run; a failure prints the body that caused it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{Map, Value, json};
use support::*;

/// A small deterministic generator (xorshift), so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<(&'static str, Value)> {
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"}
    ]);
    let tool = json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}});
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": messages, "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "n": 1, "stop": ["\n"], "seed": 3, "logprobs": true, "top_logprobs": 2, "user": "u", "metadata": {"priority": "1"}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "stream": true, "stream_options": {"include_usage": true}, "tools": [tool], "tool_choice": "none", "response_format": {"type": "text"}, "max_completion_tokens": 4, "presence_penalty": 0.1, "frequency_penalty": 0.1}),
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": ["Once", "upon"], "max_tokens": 4, "echo": false, "logprobs": 1, "stream": false, "suffix": null, "best_of": 1}),
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": [[1, 2, 3]], "max_tokens": 2, "stream": true}),
        ),
        (
            "/v1/embeddings",
            json!({"model": "fake", "input": ["a", "b"], "encoding_format": "float", "dimensions": 8}),
        ),
        (
            "/v1/responses",
            json!({"model": "fake", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 16, "store": false, "temperature": 0.3, "text": {"format": {"type": "text"}}, "truncation": "disabled"}),
        ),
        (
            "/v1/responses",
            json!({"model": "fake", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "x"}], "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "none", "stream": true, "store": false}),
        ),
        (
            "/v1/responses/input_tokens",
            json!({"model": "fake", "input": "count these", "instructions": "x"}),
        ),
        (
            "/v1/responses/compact",
            json!({"model": "fake", "input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}),
        ),
    ]
}

fn odd_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(u64::MAX),
        5 => json!(i64::MIN),
        6 => json!(1e308),
        7 => json!(-0.5),
        8 => json!(""),
        9 => json!("\u{0}\u{feff}🙂<|eot_id|>\\u0000"),
        10 => json!("x".repeat(rng.below(5000))),
        11 => json!([]),
        12 => json!({}),
        13 if depth < 40 => json!([odd_value(rng, depth + 1)]),
        14 if depth < 40 => json!({"type": odd_value(rng, depth + 1)}),
        _ => json!(rng.next() as f64 / 7.0),
    }
}

/// A random place in `value` (the root is a place too).
fn place<'a>(value: &'a mut Value, rng: &mut Rng) -> &'a mut Value {
    let descend = rng.below(3) != 0;
    let len = match &*value {
        Value::Object(map) => map.len(),
        Value::Array(list) => list.len(),
        _ => 0,
    };
    if !descend || len == 0 {
        return value;
    }
    let i = rng.below(len);
    match value {
        Value::Object(map) => {
            let key = map.keys().nth(i).cloned().unwrap_or_default();
            place(map.get_mut(&key).unwrap(), rng)
        }
        Value::Array(list) => place(&mut list[i], rng),
        other => other,
    }
}

fn mutate(seed: &Value, rng: &mut Rng) -> Vec<u8> {
    let mut value = seed.clone();
    for _ in 0..1 + rng.below(3) {
        let at = place(&mut value, rng);
        match (rng.below(5), at) {
            (0, Value::Object(map)) if !map.is_empty() => {
                let key = map
                    .keys()
                    .nth(rng.below(map.len()))
                    .cloned()
                    .unwrap_or_default();
                map.remove(&key);
            }
            (1, Value::Object(map)) => {
                let names = [
                    "n", "stream", "tools", "input", "messages", "model", "zzz", "logprobs",
                ];
                map.insert(names[rng.below(names.len())].into(), odd_value(rng, 0));
            }
            (2, Value::Array(list)) if !list.is_empty() => {
                let copy = list[rng.below(list.len())].clone();
                list.extend(std::iter::repeat_n(copy, 1 + rng.below(64)));
            }
            (_, at) => *at = odd_value(rng, 0),
        }
    }
    let mut bytes = serde_json::to_vec(&value).unwrap();
    if rng.below(6) == 0 && !bytes.is_empty() {
        // Raw damage: the parser must refuse it cleanly.
        let i = rng.below(bytes.len());
        match rng.below(3) {
            0 => bytes.truncate(i),
            1 => bytes[i] = (rng.next() & 0xff) as u8,
            _ => bytes.insert(i, b"{[\"\\\x00"[rng.below(5)]),
        }
    }
    bytes
}

fn check(path: &str, body: &[u8], reply: &Reply) {
    let shown = String::from_utf8_lossy(&body[..body.len().min(600)]);
    assert!(
        !reply.status.is_server_error(),
        "{path} answered {} to {shown}\n{}",
        reply.status,
        reply.body
    );
    if !reply.status.is_success() {
        let parsed: Value = serde_json::from_str(&reply.body)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}) for {shown}: {}", reply.body));
        let error = parsed.get("error").and_then(Value::as_object);
        let keys = ["message", "type", "param", "code"];
        assert!(
            error.is_some_and(|e: &Map<String, Value>| keys.iter().all(|k| e.contains_key(*k))),
            "{path}: not an OpenAI error for {shown}: {}",
            reply.body
        );
        return;
    }
    let streamed = reply
        .headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if streamed {
        reply.events();
    } else {
        reply.json();
    }
}

#[tokio::test]
async fn mutated_bodies_never_crash_or_500() {
    let cases: usize = std::env::var("TURNPIKE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let seed: u64 = std::env::var("TURNPIKE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_1234_abcd);
    let (_, app) = app(Box::new(|_| Ok(say("ok fine"))));
    let mut rng = Rng(seed | 1);
    for (path, body) in seeds() {
        let valid = serde_json::to_vec(&body).unwrap();
        let reply = post(&app, path, std::str::from_utf8(&valid).unwrap()).await;
        assert!(
            reply.status.is_success(),
            "{path}: the seed body fails: {}",
            reply.body
        );
        for _ in 0..cases {
            let mutated = mutate(&body, &mut rng);
            let request = axum::http::Request::post(path)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(mutated.clone()))
                .unwrap();
            let reply = send(&app, request).await;
            check(path, &mutated, &reply);
        }
    }
}
