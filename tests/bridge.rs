//! The host side: sinks become tokio streams that end after one FINAL and cancel when dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use turnpike_engine_api::host::{EngineHandle, EngineRequest, EventStream, Plugin, sink_pair};
use turnpike_engine_api::{EmbedParams, EngineEvent, FinishReason, GenerationParams, Status};
use turnpike_tests::{PATIENCE, rust_example_plugin, sim_plugin};

fn sim(config: &str) -> EngineHandle {
    Plugin::load(sim_plugin())
        .expect("loads")
        .create(config)
        .expect("creates")
}

fn request(model: &str, params: GenerationParams) -> EngineRequest {
    EngineRequest {
        trace_context: None,
        model: model.into(),
        prompt: vec![5, 6, 7],
        params,
    }
}

async fn collect(mut stream: EventStream) -> Vec<EngineEvent> {
    tokio::time::timeout(PATIENCE, async {
        let mut events = Vec::new();
        while let Some(event) = stream.recv().await {
            events.push(event);
        }
        events
    })
    .await
    .expect("the stream ends in time")
}

#[tokio::test]
async fn a_stream_yields_its_tokens_then_one_final_then_ends() {
    let engine = sim("{}");
    let params = GenerationParams {
        max_tokens: 5,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    let events = collect(engine.submit(&request("sim", params)).expect("accepted")).await;
    assert_eq!(events.len(), 6);
    assert!(
        events[..5]
            .iter()
            .all(|e| matches!(e, EngineEvent::Token(_)))
    );
    let EngineEvent::Final(fin) = &events[5] else {
        panic!("last is {:?}", events[5])
    };
    assert_eq!(fin.status, Status::Ok);
    assert_eq!(fin.finish.reason, Some(FinishReason::Length));
    assert_eq!(fin.usage.completion_tokens, 5);
    assert_eq!(fin.usage.prompt_tokens, 3);
}

#[tokio::test]
async fn dropping_a_stream_cancels_the_request_in_the_engine() {
    let engine = sim(r#"{"models": [{"id": "slow", "latency": {"itl_ms": 5}}]}"#);
    let params = GenerationParams {
        max_tokens: 10_000,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    let mut stream = engine.submit(&request("slow", params)).expect("accepted");
    let first = tokio::time::timeout(PATIENCE, stream.recv())
        .await
        .expect("in time");
    assert!(matches!(first, Some(EngineEvent::Token(_))));
    drop(stream);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stats = engine.stats().expect("stats");
        if stats.cancelled == 1 && stats.running == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not cancelled: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn several_choices_end_one_by_one_before_the_final() {
    let engine = sim("{}");
    let params = GenerationParams {
        max_tokens: 4,
        n: 3,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    let events = collect(engine.submit(&request("sim", params)).expect("accepted")).await;
    let mut ended: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::ChoiceEnd { choice, .. } => Some(*choice),
            _ => None,
        })
        .collect();
    ended.sort_unstable();
    assert_eq!(ended, [0, 1, 2]);
    for choice in 0..3 {
        let tokens = events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Token(t) if t.choice == choice))
            .count();
        assert_eq!(tokens, 4, "choice {choice}");
    }
    assert!(
        matches!(events.last(), Some(EngineEvent::Final(f)) if f.usage.completion_tokens == 12)
    );
}

#[tokio::test]
async fn a_refused_request_is_an_error_carrying_the_plugins_message() {
    let engine = sim("{}");
    let err = engine
        .submit(&request("nope", GenerationParams::default()))
        .expect_err("refused");
    assert_eq!(err.status, Status::NotFound);
    assert_eq!(err.message, "the simulator serves no model `nope`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_run_at_once() {
    let engine = sim(r#"{"models": [{"id": "sim", "latency": {"itl_ms": 0.2}}]}"#);
    let streams: Vec<_> = (0..200)
        .map(|_| {
            let params = GenerationParams {
                max_tokens: 20,
                ignore_eos: true,
                ..GenerationParams::default()
            };
            engine.submit(&request("sim", params)).expect("accepted")
        })
        .collect();
    let results =
        futures_util::future::join_all(streams.into_iter().map(|s| s.collect::<Vec<_>>())).await;
    for events in results {
        assert_eq!(events.len(), 21);
        assert!(matches!(events.last(), Some(EngineEvent::Final(f)) if f.status == Status::Ok));
    }
    let stats = engine.stats().expect("stats");
    assert_eq!((stats.completed, stats.running, stats.queued), (200, 0, 0));
}

#[tokio::test]
async fn a_sink_released_without_a_final_still_ends_its_stream_with_one() {
    let (sink, mut events) = sink_pair();
    let release = sink.release.expect("release");
    // SAFETY: the sink's context is live and released exactly once here.
    unsafe { release(sink.ctx) };
    let Some(EngineEvent::Final(fin)) = events.recv().await else {
        panic!("expected a final")
    };
    assert_eq!(fin.status, Status::Internal);
    assert_eq!(
        fin.message,
        "engine released the request without a final event"
    );
    assert!(events.recv().await.is_none());
}

#[tokio::test]
async fn a_malformed_event_ends_the_stream_but_not_the_engines_work() {
    let (sink, mut events) = sink_pair();
    let raw = turnpike_engine_api::abi::TpEventV1 {
        num_top_logprobs: 1000,
        ..zeroed_token_event()
    };
    // SAFETY: the sink's context is live; `raw` is valid for the call; released once below.
    unsafe { sink.on_event.expect("on_event")(sink.ctx, &raw) };
    let Some(EngineEvent::Final(fin)) = events.recv().await else {
        panic!("expected a final")
    };
    assert_eq!(fin.status, Status::Internal);
    assert!(
        fin.message.starts_with("engine sent a malformed event"),
        "{}",
        fin.message
    );
    assert!(
        events.is_done() && !events.engine_finished(),
        "dropping the stream must still cancel"
    );
    // SAFETY: released exactly once.
    unsafe { sink.release.expect("release")(sink.ctx) };
}

fn zeroed_token_event() -> turnpike_engine_api::abi::TpEventV1 {
    turnpike_engine_api::abi::TpEventV1 {
        struct_size: size_of::<turnpike_engine_api::abi::TpEventV1>() as u32,
        kind: turnpike_engine_api::abi::TP_EVENT_TOKEN,
        choice_index: 0,
        flags: 0,
        token_id: 1,
        logprob: 0.0,
        top_logprobs: std::ptr::null(),
        num_top_logprobs: 0,
        finish_reason: 0,
        stop_token_id: 0,
        status: 0,
        usage: Default::default(),
        message: turnpike_engine_api::layout::tp_str(""),
    }
}

#[test]
fn embeddings_through_the_host() {
    let engine = sim("{}");
    let inputs = vec![vec![5, 6, 7], vec![5, 6, 8], vec![]];
    let vectors = engine
        .embed("sim", &inputs, &EmbedParams::default())
        .expect("embeds");
    assert_eq!(vectors.len(), 3);
    for v in &vectors {
        assert_eq!(v.len(), 64);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    assert_eq!(
        vectors,
        engine
            .embed("sim", &inputs, &EmbedParams::default())
            .expect("again")
    );
    let short = engine
        .embed(
            "sim",
            &inputs,
            &EmbedParams {
                dimensions: Some(8),
            },
        )
        .expect("dims");
    assert!(short.iter().all(|v| v.len() == 8));
    let too_long = engine
        .embed(
            "sim",
            &inputs,
            &EmbedParams {
                dimensions: Some(65),
            },
        )
        .expect_err("too many");
    assert_eq!(too_long.status, Status::InvalidRequest);
    assert_eq!(
        engine
            .embed("nope", &inputs, &EmbedParams::default())
            .expect_err("unknown")
            .status,
        Status::NotFound
    );

    let echo = Plugin::load(rust_example_plugin())
        .expect("loads")
        .create("{}")
        .expect("creates");
    assert!(!echo.supports_embeddings());
    let err = echo
        .embed("echo", &inputs, &EmbedParams::default())
        .expect_err("no embeddings");
    assert_eq!(err.status, Status::Unsupported);
}
