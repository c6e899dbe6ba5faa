//! The simulator engine's behaviour, through the real plugin library.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use serde_json::json;
use turnpike_engine_api::host::{EngineHandle, EngineRequest, EventStream, Plugin};
use turnpike_engine_api::{
    EngineEvent, FinalEvent, FinishReason, GenerationParams, Grammar, Status, TokenEvent,
};
use turnpike_tests::{PATIENCE, sim_plugin};

fn sim(config: serde_json::Value) -> EngineHandle {
    Plugin::load(sim_plugin())
        .expect("loads")
        .create(&config.to_string())
        .expect("creates")
}

fn params(max_tokens: u32) -> GenerationParams {
    GenerationParams {
        max_tokens,
        ..GenerationParams::default()
    }
}

async fn drain(mut stream: EventStream) -> (Vec<TokenEvent>, FinalEvent) {
    tokio::time::timeout(PATIENCE, async {
        let mut tokens = Vec::new();
        while let Some(event) = stream.recv().await {
            match event {
                EngineEvent::Token(t) => tokens.push(t),
                EngineEvent::ChoiceEnd { .. } => {}
                EngineEvent::Final(fin) => return (tokens, fin),
            }
        }
        panic!("no final event")
    })
    .await
    .expect("in time")
}

async fn run(
    engine: &EngineHandle,
    model: &str,
    prompt: &[u32],
    p: GenerationParams,
) -> (Vec<u32>, FinalEvent) {
    let request = EngineRequest {
        trace_context: None,
        model: model.into(),
        prompt: prompt.to_vec(),
        params: p,
    };
    let (tokens, fin) = drain(engine.submit(&request).expect("accepted")).await;
    (tokens.into_iter().map(|t| t.token_id).collect(), fin)
}

#[tokio::test]
async fn output_is_a_function_of_the_seed() {
    let engine = sim(json!({}));
    let seeded = |seed| GenerationParams {
        seed: Some(seed),
        ignore_eos: true,
        ..params(12)
    };
    let (a, _) = run(&engine, "sim", &[1, 2], seeded(42)).await;
    let (b, _) = run(&engine, "sim", &[1, 2], seeded(42)).await;
    let (c, _) = run(&engine, "sim", &[1, 2], seeded(43)).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Without a request seed, the engine's seed and the request's order decide.
    let first = |seed| async move {
        let engine = sim(json!({"seed": seed}));
        run(
            &engine,
            "sim",
            &[1],
            GenerationParams {
                ignore_eos: true,
                ..params(8)
            },
        )
        .await
        .0
    };
    assert_eq!(first(7).await, first(7).await);
    assert_ne!(first(7).await, first(8).await);
}

#[tokio::test]
async fn echo_repeats_the_prompt_then_stops_with_end_of_sequence() {
    let engine =
        sim(json!({"models": [{"id": "e", "output": {"mode": "echo"}, "eos_token_id": 2}]}));
    let (tokens, fin) = run(&engine, "e", &[10, 11, 12], params(10)).await;
    assert_eq!(tokens, [10, 11, 12]);
    assert_eq!(fin.finish.reason, Some(FinishReason::Stop));
    assert_eq!(fin.finish.stop_token, Some(2));
    assert_eq!(
        fin.usage.completion_tokens, 4,
        "the end-of-sequence token counts"
    );
}

#[tokio::test]
async fn a_script_plays_then_stops() {
    let engine =
        sim(json!({"models": [{"id": "s", "output": {"mode": "script", "tokens": [7, 8, 9]}}]}));
    let (tokens, fin) = run(&engine, "s", &[1], params(10)).await;
    assert_eq!(tokens, [7, 8, 9]);
    assert_eq!(fin.finish.reason, Some(FinishReason::Stop));
}

#[tokio::test]
async fn stop_tokens_min_tokens_and_ignore_eos() {
    let engine = sim(json!({"models": [{"id": "e", "output": {"mode": "echo"}}]}));
    let stop = GenerationParams {
        stop_token_ids: vec![12],
        ..params(10)
    };
    let (tokens, fin) = run(&engine, "e", &[10, 11, 12, 13], stop).await;
    assert_eq!(tokens, [10, 11]);
    assert_eq!(fin.finish.stop_token, Some(12));

    let held = GenerationParams {
        min_tokens: 5,
        ..params(5)
    };
    let (tokens, fin) = run(&engine, "e", &[10, 11], held).await;
    assert_eq!(tokens, [10, 11, 10, 11, 10]);
    assert_eq!(fin.finish.reason, Some(FinishReason::Length));

    let endless = GenerationParams {
        ignore_eos: true,
        ..params(7)
    };
    let (tokens, fin) = run(&engine, "e", &[10, 11], endless).await;
    assert_eq!(tokens.len(), 7);
    assert_eq!(
        (fin.finish.reason, fin.usage.completion_tokens),
        (Some(FinishReason::Length), 7)
    );
}

#[tokio::test]
async fn generation_stops_at_the_context_window() {
    let engine = sim(json!({"models": [{"id": "tiny", "max_context": 10}]}));
    let p = GenerationParams {
        ignore_eos: true,
        ..params(100)
    };
    let (tokens, fin) = run(&engine, "tiny", &[1, 2, 3, 4], p).await;
    assert_eq!(tokens.len(), 6);
    assert_eq!(fin.finish.reason, Some(FinishReason::Length));
}

#[tokio::test]
async fn logprobs_are_well_formed() {
    let engine = sim(json!({}));
    let p = GenerationParams {
        logprobs: true,
        top_logprobs: 5,
        ignore_eos: true,
        ..params(20)
    };
    let request = EngineRequest {
        trace_context: None,
        model: "sim".into(),
        prompt: vec![1],
        params: p,
    };
    let (tokens, _) = drain(engine.submit(&request).expect("accepted")).await;
    assert_eq!(tokens.len(), 20);
    for t in tokens {
        let lp = t.logprob.expect("logprob");
        assert!(lp <= 0.0 && lp.is_finite());
        assert_eq!(t.top_logprobs.len(), 5);
        assert_eq!(t.top_logprobs[0].token_id, t.token_id);
        assert_eq!(t.top_logprobs[0].logprob, lp);
        assert!(
            t.top_logprobs
                .windows(2)
                .all(|w| w[0].logprob > w[1].logprob)
        );
        let mut ids: Vec<u32> = t.top_logprobs.iter().map(|a| a.token_id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 5);
        let mass: f32 = t.top_logprobs.iter().map(|a| a.logprob.exp()).sum();
        assert!(mass <= 1.0 + 1e-5, "probabilities sum to {mass}");
    }
}

#[tokio::test]
async fn injected_faults() {
    let engine = sim(json!({"models": [
        {"id": "refuse", "errors": {"refuse_rate": 1.0}},
        {"id": "overload", "errors": {"overload_rate": 1.0}},
        {"id": "fail", "errors": {"fail_midstream_rate": 1.0, "fail_after_tokens": 3}}
    ]}));
    let request = |model: &str| EngineRequest {
        trace_context: None,
        model: model.into(),
        prompt: vec![1],
        params: params(10),
    };
    let refused = engine.submit(&request("refuse")).expect_err("refused");
    assert_eq!(refused.status, Status::Internal);
    let overloaded = engine.submit(&request("overload")).expect_err("overloaded");
    assert_eq!(overloaded.status, Status::Overloaded);
    let (tokens, fin) = drain(engine.submit(&request("fail")).expect("accepted")).await;
    assert_eq!(tokens.len(), 3);
    assert_eq!(fin.status, Status::Internal);
    assert_eq!(fin.message, "simulated engine failure mid-stream");
    let stats = engine.stats().expect("stats");
    assert_eq!(
        (stats.failed, stats.extra["refused"].as_u64()),
        (1, Some(2))
    );
}

#[tokio::test]
async fn fault_rates_are_deterministic_per_seed() {
    let outcome = |seed: u64| {
        let engine = sim(json!({"seed": seed, "errors": {"refuse_rate": 0.5}}));
        (0..200)
            .map(|_| {
                engine
                    .submit(&EngineRequest {
                        trace_context: None,
                        model: "sim".into(),
                        prompt: vec![1],
                        params: params(1),
                    })
                    .is_ok()
            })
            .collect::<Vec<bool>>()
    };
    let a = outcome(11);
    assert_eq!(a, outcome(11));
    let accepted = a.iter().filter(|ok| **ok).count();
    assert!(
        (60..=140).contains(&accepted),
        "{accepted} of 200 accepted at a 50% refusal rate"
    );
}

#[tokio::test]
async fn no_token_comes_before_the_latency_profile_allows() {
    let engine =
        sim(json!({"models": [{"id": "timed", "latency": {"ttft_ms": 80, "itl_ms": 10}}]}));
    let start = Instant::now();
    let request = EngineRequest {
        trace_context: None,
        model: "timed".into(),
        prompt: vec![1],
        params: GenerationParams {
            ignore_eos: true,
            ..params(5)
        },
    };
    let mut stream = engine.submit(&request).expect("accepted");
    let first = tokio::time::timeout(PATIENCE, stream.recv())
        .await
        .expect("in time");
    assert!(matches!(first, Some(EngineEvent::Token(_))));
    assert!(
        start.elapsed() >= Duration::from_millis(80),
        "first token after {:?}",
        start.elapsed()
    );
    let _ = drain(stream).await;
    assert!(
        start.elapsed() >= Duration::from_millis(120),
        "five tokens after {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn the_queue_is_bounded_and_served_by_priority() {
    let engine = sim(json!({
        "max_running": 1,
        "max_queued": 2,
        "models": [{"id": "m", "latency": {"ttft_ms": 100, "itl_ms": 5}}]
    }));
    let request = |priority: i32, max_tokens: u32| EngineRequest {
        trace_context: None,
        model: "m".into(),
        prompt: vec![1],
        params: GenerationParams {
            priority,
            ignore_eos: true,
            ..params(max_tokens)
        },
    };
    let running = engine.submit(&request(0, 100_000)).expect("runs");
    // Wait until it has left the queue.
    let deadline = Instant::now() + PATIENCE;
    while engine.stats().expect("stats").running != 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut low = engine.submit(&request(0, 3)).expect("queued");
    let high = engine.submit(&request(5, 3)).expect("queued");
    let full = engine.submit(&request(9, 3)).expect_err("queue full");
    assert_eq!(full.status, Status::Overloaded);
    let stats = engine.stats().expect("stats");
    assert_eq!((stats.running, stats.queued), (1, 2));

    drop(running); // cancels it: the high-priority request is admitted next, the low one waits
    let mut high = high;
    let first = tokio::time::timeout(PATIENCE, high.recv())
        .await
        .expect("in time");
    assert!(matches!(first, Some(EngineEvent::Token(_))));
    assert!(
        low.recv().now_or_never().is_none(),
        "the low-priority request started first"
    );
    let (_, fin) = drain(high).await;
    assert_eq!(fin.status, Status::Ok);
    let (tokens, fin) = drain(low).await;
    assert_eq!((tokens.len(), fin.status), (3, Status::Ok));
    let stats = engine.stats().expect("stats");
    assert_eq!(
        (
            stats.completed,
            stats.cancelled,
            stats.queued,
            stats.running
        ),
        (2, 1, 0, 0)
    );
}

#[tokio::test]
async fn with_no_queue_only_running_requests_are_accepted() {
    let engine = sim(
        json!({"max_running": 2, "max_queued": 0, "models": [{"id": "m", "latency": {"itl_ms": 5}}]}),
    );
    let long = || EngineRequest {
        trace_context: None,
        model: "m".into(),
        prompt: vec![1],
        params: GenerationParams {
            ignore_eos: true,
            ..params(10_000)
        },
    };
    let a = engine.submit(&long()).expect("runs");
    let b = engine.submit(&long()).expect("runs");
    assert_eq!(
        engine.submit(&long()).expect_err("no room").status,
        Status::Overloaded
    );
    drop(a);
    let deadline = Instant::now() + PATIENCE;
    while engine.stats().expect("stats").cancelled != 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let c = engine.submit(&long()).expect("room again");
    drop((b, c));
}

#[tokio::test]
async fn requests_the_model_cannot_serve_are_refused() {
    let engine =
        sim(json!({"models": [{"id": "m", "vocab_size": 100, "max_context": 8, "max_n": 2}]}));
    let submit = |prompt: Vec<u32>, p: GenerationParams| {
        engine
            .submit(&EngineRequest {
                trace_context: None,
                model: "m".into(),
                prompt,
                params: p,
            })
            .map(drop)
            .expect_err("refused")
    };
    let long = submit(vec![1; 8], params(1));
    assert_eq!(long.status, Status::InvalidRequest);
    assert!(long.message.contains("context of 8"), "{long}");
    let foreign = submit(vec![100], params(1));
    assert!(
        foreign.message.contains("outside the vocabulary"),
        "{foreign}"
    );
    let many = submit(vec![1], GenerationParams { n: 3, ..params(1) });
    assert_eq!(many.status, Status::Unsupported);
    let grammar = submit(
        vec![1],
        GenerationParams {
            grammar: Some(Grammar::JsonObject),
            ..params(1)
        },
    );
    assert_eq!(grammar.status, Status::Unsupported);
}

#[tokio::test]
async fn a_tokenizer_makes_random_output_word_like() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokenizer.json");
    let tokenizer = json!({
        "model": {"type": "BPE", "vocab": {"Ġhello": 0, "Ġworld": 1, "!": 2, "<unk>": 3, "Ġcat": 4, "12": 5}},
        "added_tokens": [{"id": 6, "content": "</s>", "special": true}]
    });
    std::fs::write(&path, tokenizer.to_string()).expect("write");
    let engine = sim(json!({"models": [{"id": "words", "tokenizer": path.to_string_lossy()}]}));
    let info = engine.models().expect("models").remove(0);
    assert_eq!(
        (info.vocab_size, info.eos_token_ids.as_slice()),
        (7, &[6][..])
    );
    assert_eq!(
        info.tokenizer.as_deref(),
        Some(path.to_string_lossy().as_ref())
    );
    let (tokens, _) = run(
        &engine,
        "words",
        &[0],
        GenerationParams {
            ignore_eos: true,
            ..params(50)
        },
    )
    .await;
    assert!(tokens.iter().all(|t| [0, 1, 4].contains(t)), "{tokens:?}");
}

/// A simulator model over a small JSON-ish vocabulary; the pieces by id.
fn json_words(dir: &std::path::Path) -> (EngineHandle, Vec<&'static str>) {
    let pieces = vec![
        "{", "}", "\"", ":", ",", "a", "b", "0", "1", "yes", "no", "Ġ", "[", "]",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = pieces
        .iter()
        .enumerate()
        .map(|(id, piece)| (piece.to_string(), json!(id)))
        .collect();
    let eos = pieces.len();
    let tokenizer = json!({
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "added_tokens": [{"id": eos, "content": "</s>", "special": true}]
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).expect("write");
    let engine = sim(
        json!({"models": [{"id": "json", "tokenizer": path.to_string_lossy(),
                                        "output": {"mode": "random", "length": [3, 30]}}]}),
    );
    (engine, pieces)
}

#[tokio::test]
async fn a_grammar_shapes_random_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, pieces) = json_words(dir.path());
    assert!(engine.models().expect("models")[0].capabilities.grammar);
    let text = |tokens: &[u32]| -> String {
        tokens
            .iter()
            .filter_map(|&t| pieces.get(t as usize).copied())
            .collect::<String>()
            .replace('Ġ', " ")
    };
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 2}},
        "required": ["a", "b"], "additionalProperties": false});
    for seed in 0..20 {
        let constrained = |grammar| GenerationParams {
            grammar: Some(grammar),
            seed: Some(seed),
            n: 1,
            ..params(200)
        };
        let (tokens, fin) = run(
            &engine,
            "json",
            &[0],
            constrained(Grammar::JsonSchema {
                schema: schema.clone(),
            }),
        )
        .await;
        assert_eq!(fin.status, Status::Ok, "{fin:?}");
        let value: serde_json::Value = serde_json::from_str(&text(&tokens))
            .unwrap_or_else(|e| panic!("{e}: {}", text(&tokens)));
        assert!(value["a"].is_i64(), "{value}");
        let items = value["b"].as_array().expect("b is an array");
        assert!(
            items.len() >= 2 && items.iter().all(|v| v == "yes" || v == "no"),
            "{value}"
        );
        let (tokens, fin) = run(
            &engine,
            "json",
            &[0],
            constrained(Grammar::Regex {
                pattern: "(yes|no) [01]{2}".into(),
            }),
        )
        .await;
        assert_eq!(fin.status, Status::Ok, "{fin:?}");
        let out = text(&tokens);
        assert!(
            (out.starts_with("yes ") || out.starts_with("no "))
                && out.len() - out.find(' ').expect("a space") == 3,
            "{out:?}"
        );
    }
    // What does not compile is refused at submit.
    let Err(bad) = engine.submit(&EngineRequest {
        trace_context: None,
        model: "json".into(),
        prompt: vec![0],
        params: GenerationParams {
            grammar: Some(Grammar::Regex {
                pattern: "(unclosed".into(),
            }),
            ..params(5)
        },
    }) else {
        panic!("an uncompilable grammar was accepted");
    };
    assert_eq!(bad.status, Status::InvalidRequest);
    assert!(bad.message.contains("does not compile"), "{bad}");
}

#[test]
fn bad_configurations_name_the_key() {
    let plugin = Plugin::load(sim_plugin()).expect("loads");
    for (config, needle) in [
        (r#"{"max_runing": 3}"#, "unknown field `max_runing`"),
        (
            r#"{"models": [{"id": "m", "latency": "sluggish"}]}"#,
            "unknown latency preset `sluggish`",
        ),
        (
            r#"{"models": [{"id": "m", "errors": {"refuse_rate": 1.5}}]}"#,
            "models.m.errors.refuse_rate",
        ),
        ("[1, 2]", "sim config"),
    ] {
        let err = plugin.create(config).expect_err(config).to_string();
        assert!(
            err.contains("invalid_config") && err.contains(needle),
            "{err}"
        );
    }
}
