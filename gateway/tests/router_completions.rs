//! `/v1/completions`, `/v1/embeddings`, `/v1/models` and the probes, in-process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use base64::Engine as _;
use serde_json::{Value, json};
use support::*;
use turnpike_engine_api::{FinalEvent, Finish, TopLogprob, Usage};

fn complete(body: Value) -> String {
    let mut b = json!({"model": "fake"});
    if let (Some(base), Some(extra)) = (b.as_object_mut(), body.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    b.to_string()
}

#[tokio::test]
async fn every_prompt_form_becomes_engine_requests() {
    let (seen, app) = app(Box::new(|_| Ok(say(" done"))));
    let text_ids = {
        let t = support::tokenizer();
        t.encode("Once upon a time", true).unwrap()
    };
    let forms = [
        (json!("Once upon a time"), 1),
        (json!(["Once upon a time", "Twice"]), 2),
        (json!(text_ids.clone()), 1),
        (json!([text_ids.clone(), [5, 6, 7]]), 2),
    ];
    for (prompt, prompts) in forms {
        seen.requests.lock().unwrap().clear();
        let reply = post(
            &app,
            "/v1/completions",
            &complete(json!({"prompt": prompt, "max_tokens": 4})),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let body = reply.json();
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"].as_array().unwrap().len(), prompts);
        assert!(
            body["choices"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["text"] == " done")
        );
        assert_eq!(seen.requests.lock().unwrap().len(), prompts);
    }
    // A text prompt gets the tokenizer's beginning-of-text token; token ids are taken as given.
    seen.requests.lock().unwrap().clear();
    post(
        &app,
        "/v1/completions",
        &complete(json!({"prompt": "Once upon a time"})),
    )
    .await;
    assert_eq!(seen.requests.lock().unwrap()[0].prompt, text_ids);
    assert_eq!(
        seen.requests.lock().unwrap()[0].params.max_tokens,
        16,
        "the legacy default"
    );
    // Counts are checked before anything is tokenized or sent.
    seen.requests.lock().unwrap().clear();
    let many = complete(json!({"prompt": vec!["x"; 300], "n": 8}));
    let e = error_of(&post(&app, "/v1/completions", &many).await, 400);
    assert_eq!(e["param"], "n", "{e}");
    let too_many = complete(json!({"prompt": vec!["x"; 2049]}));
    let e = error_of(&post(&app, "/v1/completions", &too_many).await, 400);
    assert_eq!(e["param"], "prompt", "{e}");
    assert!(seen.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn echo_n_and_indexes() {
    let (_, app) = app(Box::new(|req| {
        let n = req.params.n;
        let mut steps = Vec::new();
        for c in 0..n {
            for id in ids(" more") {
                steps.push(Step::Token {
                    choice: c,
                    id,
                    logprob: None,
                    top: vec![],
                });
            }
        }
        steps.push(Step::Final(FinalEvent::ok(
            Finish::length(),
            Usage {
                completion_tokens: n,
                ..Usage::default()
            },
        )));
        Ok(steps)
    }));
    let body = post(
        &app,
        "/v1/completions",
        &complete(json!({"prompt": ["A", "B"], "n": 2, "echo": true})),
    )
    .await
    .json();
    let texts: Vec<(u64, &str)> = body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        texts,
        [(0, "A more"), (1, "A more"), (2, "B more"), (3, "B more")]
    );

    let reply = post(
        &app,
        "/v1/completions",
        &complete(json!({"prompt": "A", "n": 2, "echo": true, "stream": true})),
    )
    .await;
    let (events, done) = reply.events();
    assert!(done);
    for index in 0..2 {
        let text: String = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == index)
            .filter_map(|e| e["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "A more");
    }
}

#[tokio::test]
async fn legacy_logprobs_have_tokens_and_offsets() {
    let (_, app) = app(Box::new(|_| {
        let words = ids(" big dog");
        let mut steps: Vec<Step> = words
            .iter()
            .map(|&id| Step::Token {
                choice: 0,
                id,
                logprob: Some(-1.5),
                top: vec![TopLogprob {
                    token_id: id,
                    logprob: -1.5,
                }],
            })
            .collect();
        steps.push(Step::Final(FinalEvent::ok(
            Finish::length(),
            Usage::default(),
        )));
        Ok(steps)
    }));
    let body = post(
        &app,
        "/v1/completions",
        &complete(json!({"prompt": "A", "logprobs": 1})),
    )
    .await
    .json();
    let lp = &body["choices"][0]["logprobs"];
    let tokens: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, " big dog");
    assert_eq!(lp["token_logprobs"][0], -1.5);
    assert!(lp["top_logprobs"][0].is_object());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    let (events, _) = post(
        &app,
        "/v1/completions",
        &complete(json!({"prompt": "A", "logprobs": 1, "stream": true})),
    )
    .await
    .events();
    let streamed: usize = events
        .iter()
        .filter_map(|e| {
            e["choices"][0]["logprobs"]["tokens"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    assert_eq!(streamed, ids(" big dog").len());
}

#[tokio::test]
async fn embeddings_as_floats_or_base64() {
    let (_, app) = app(Box::new(|_| Ok(say("x"))));
    let floats = post(
        &app,
        "/v1/embeddings",
        &json!({"model": "fake", "input": ["hi", "there you"], "encoding_format": "float"})
            .to_string(),
    )
    .await
    .json();
    assert_eq!(floats["object"], "list");
    assert_eq!(floats["data"].as_array().unwrap().len(), 2);
    assert_eq!(floats["data"][1]["index"], 1);
    let first: Vec<f32> = serde_json::from_value(floats["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(first.len(), 4);
    assert!(floats["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let default = post(
        &app,
        "/v1/embeddings",
        &json!({"model": "fake", "input": "hi"}).to_string(),
    )
    .await
    .json();
    assert!(
        default["data"][0]["embedding"].is_array(),
        "float is the default encoding: {default}"
    );
    let b64 = post(
        &app,
        "/v1/embeddings",
        &json!({"model": "fake", "input": "hi", "dimensions": 6, "encoding_format": "base64"})
            .to_string(),
    )
    .await
    .json();
    let encoded = b64["data"][0]["embedding"]
        .as_str()
        .expect("a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values.len(), 6);
    let floats6 = post(
        &app,
        "/v1/embeddings",
        &json!({"model": "fake", "input": "hi", "dimensions": 6}).to_string(),
    )
    .await
    .json();
    let expected: Vec<f32> =
        serde_json::from_value(floats6["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(
        values, expected,
        "base64 carries the same little-endian float32 values"
    );
}

#[tokio::test]
async fn models_probes_and_metrics() {
    let (_, app) = app(Box::new(|_| Ok(say("ok"))));
    let list = get(&app, "/v1/models").await.json();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["fake", "fake-alias"]);
    assert_eq!(list["data"][0]["owned_by"], "tests");
    assert_eq!(
        get(&app, "/v1/models/fake-alias").await.json()["id"],
        "fake-alias"
    );
    assert_eq!(
        error_of(&get(&app, "/v1/models/nope").await, 404)["code"],
        "model_not_found"
    );
    let (_, backend) = fake(Box::new(|_| Ok(say("ok"))));
    let slashed = app_with_model(backend, server(10_000, 10_000), |m| {
        m.aliases.push("org/fake-7b".into());
    });
    for path in ["/v1/models/org/fake-7b", "/v1/models/org%2Ffake-7b"] {
        let reply = get(&slashed, path).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        assert_eq!(reply.json()["id"], "org/fake-7b");
    }
    let bad = error_of(&get(&app, "/v1/models/%FF%FE").await, 400);
    assert_eq!(bad["param"], "model");
    assert_eq!(get(&app, "/health").await.status, 200);
    assert_eq!(get(&app, "/ready").await.json()["status"], "ready");
    post(
        &app,
        "/v1/chat/completions",
        &json!({"model": "fake", "messages": [{"role": "user", "content": "x"}]}).to_string(),
    )
    .await;
    let metrics = get(&app, "/metrics").await;
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    for name in [
        "turnpike_http_requests_total",
        "turnpike_tokens_total",
        "turnpike_http_request_duration_seconds",
    ] {
        assert!(
            metrics.body.contains(name),
            "{name} missing from:\n{}",
            metrics.body
        );
    }
}
